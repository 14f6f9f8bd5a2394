//! Domain types for tasks and trajectories, mirroring `corvid/v1/learner.proto`.
//!
//! Every conversion from the wire validates: a message that converts is one the
//! rest of Corvid can trust (aligned per-token arrays, finite numbers, a known
//! enum value). The JSONL export serialises these types with serde, so the field
//! names below are also the export's field names.

use serde::{Deserialize, Serialize};

use crate::assignment::ContextFold;
use crate::limits::MAX_TRAJECTORY_ID_LEN;
use crate::pb;
use crate::routes::RouteShape;

/// A message from the wire that does not describe a valid value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtoError {
    /// A required field was absent.
    #[error("`{0}` is missing")]
    Missing(&'static str),
    /// A field is present but its value is not allowed.
    #[error("`{field}` is invalid: {reason}")]
    Invalid {
        /// Dotted path of the offending field, e.g. `step.logprobs[3]`.
        field: String,
        /// What is wrong and, where useful, what was expected.
        reason: String,
    },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ProtoError {
    ProtoError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Checks a trajectory id: 1..=128 bytes of `[A-Za-z0-9_.-]`.
///
/// The store uses ids inside its keys, so the alphabet excludes the separator byte.
pub fn validate_trajectory_id(id: &str) -> Result<(), ProtoError> {
    if id.is_empty() || id.len() > MAX_TRAJECTORY_ID_LEN {
        return Err(invalid(
            "trajectory_id",
            format!("length {} is outside 1..={MAX_TRAJECTORY_ID_LEN}", id.len()),
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(invalid(
            "trajectory_id",
            format!("{id:?} contains {c:?}; use only [A-Za-z0-9_.-]"),
        ));
    }
    Ok(())
}

// ------------------------------------------------------------------ tasks

/// Identifies one task instance exactly.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskRef {
    /// Built-in family (`hops`, `search`, `shell`) or task pack name.
    pub family: String,
    /// Difficulty level, 1-based.
    pub level: u32,
    /// Instance seed.
    pub seed: u64,
    /// Hex hash of the instance spec.
    pub spec_hash: String,
}

impl TaskRef {
    /// The group key for GRPO-style baselines: episodes of one instance.
    pub fn instance_key(&self) -> String {
        format!("{}/{}/{}", self.family, self.level, self.seed)
    }
}

impl TryFrom<pb::TaskRef> for TaskRef {
    type Error = ProtoError;
    fn try_from(t: pb::TaskRef) -> Result<Self, ProtoError> {
        if t.family.is_empty() {
            return Err(invalid("task.family", "empty"));
        }
        if t.family.len() > 128 || t.family.contains('\0') {
            return Err(invalid(
                "task.family",
                "longer than 128 bytes or contains NUL",
            ));
        }
        if t.level == 0 {
            return Err(invalid("task.level", "levels start at 1"));
        }
        Ok(Self {
            family: t.family,
            level: t.level,
            seed: t.seed,
            spec_hash: t.spec_hash,
        })
    }
}

impl From<TaskRef> for pb::TaskRef {
    fn from(t: TaskRef) -> Self {
        Self {
            family: t.family,
            level: t.level,
            seed: t.seed,
            spec_hash: t.spec_hash,
        }
    }
}

/// How the behaviour policy sampled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    pub top_p: f32,
    /// Most tokens generated in one turn.
    pub max_new_tokens: u32,
    /// Sampler RNG seed for the episode.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens: 256,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Checks that the parameters can be sampled with and stored: a finite temperature
    /// `>= 0` and `top_p` in `(0, 1]`.
    pub fn validate(&self) -> Result<(), ProtoError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(invalid(
                "sampling.temperature",
                format!("{} is not a finite value >= 0", self.temperature),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(invalid(
                "sampling.top_p",
                format!("{} is outside (0, 1]", self.top_p),
            ));
        }
        Ok(())
    }
}

impl TryFrom<pb::SamplingParams> for SamplingParams {
    type Error = ProtoError;
    fn try_from(s: pb::SamplingParams) -> Result<Self, ProtoError> {
        let s = Self {
            temperature: s.temperature,
            top_p: s.top_p,
            max_new_tokens: s.max_new_tokens,
            seed: s.seed,
        };
        s.validate()?;
        Ok(s)
    }
}

impl From<SamplingParams> for pb::SamplingParams {
    fn from(s: SamplingParams) -> Self {
        Self {
            temperature: s.temperature,
            top_p: s.top_p,
            max_new_tokens: s.max_new_tokens,
            seed: s.seed,
        }
    }
}

// ------------------------------------------------------------------ trajectory header

/// The first part of a trajectory: what was attempted, by whom, with which policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryHeader {
    /// Actor-chosen id, stable across resends (see [`validate_trajectory_id`]).
    pub trajectory_id: String,
    /// The task instance.
    pub task: TaskRef,
    /// The actor that ran the episode.
    pub actor_id: String,
    /// Policy version at the start of the episode.
    pub policy_version: u64,
    /// Sampling parameters of the behaviour policy.
    pub sampling: SamplingParams,
    /// Episodes of one group share a task instance.
    pub group_id: String,
    /// Wall-clock start, milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// How the steps' route bytes are laid out; `None` when the actor recorded no routing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<RouteShape>,
    /// The window and fold the episode ran under (`None`: no window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextFold>,
}

impl TryFrom<pb::TrajectoryHeader> for TrajectoryHeader {
    type Error = ProtoError;
    fn try_from(h: pb::TrajectoryHeader) -> Result<Self, ProtoError> {
        validate_trajectory_id(&h.trajectory_id)?;
        Ok(Self {
            task: h
                .task
                .ok_or(ProtoError::Missing("header.task"))?
                .try_into()?,
            sampling: h
                .sampling
                .ok_or(ProtoError::Missing("header.sampling"))?
                .try_into()?,
            trajectory_id: h.trajectory_id,
            actor_id: h.actor_id,
            policy_version: h.policy_version,
            group_id: h.group_id,
            started_unix_ms: h.started_unix_ms,
            routes: h.routes.map(RouteShape::try_from).transpose()?,
            context: h.context.map(ContextFold::try_from).transpose()?,
        })
    }
}

impl From<TrajectoryHeader> for pb::TrajectoryHeader {
    fn from(h: TrajectoryHeader) -> Self {
        Self {
            trajectory_id: h.trajectory_id,
            task: Some(h.task.into()),
            actor_id: h.actor_id,
            policy_version: h.policy_version,
            sampling: Some(h.sampling.into()),
            group_id: h.group_id,
            started_unix_ms: h.started_unix_ms,
            routes: h.routes.map(Into::into),
            context: h.context.map(Into::into),
        }
    }
}

// ------------------------------------------------------------------ steps

/// A tool call exactly as the model wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Tool name.
    pub name: String,
    /// Arguments as written (may be malformed JSON; the result says so).
    pub arguments_json: String,
}

/// The class of a tool result. `InfraError` is the host's fault, never the policy's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum ToolStatus {
    Ok,
    ExitNonzero,
    InvalidCall,
    UnknownTool,
    NotFound,
    PermissionDenied,
    Timeout,
    ComputeBudget,
    MemoryLimit,
    OutputTruncated,
    QuotaExceeded,
    InfraError,
}

impl ToolStatus {
    /// Every status, in wire order.
    pub const ALL: [ToolStatus; 12] = [
        ToolStatus::Ok,
        ToolStatus::ExitNonzero,
        ToolStatus::InvalidCall,
        ToolStatus::UnknownTool,
        ToolStatus::NotFound,
        ToolStatus::PermissionDenied,
        ToolStatus::Timeout,
        ToolStatus::ComputeBudget,
        ToolStatus::MemoryLimit,
        ToolStatus::OutputTruncated,
        ToolStatus::QuotaExceeded,
        ToolStatus::InfraError,
    ];

    /// The snake_case name shown to the model and in exports.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolStatus::Ok => "ok",
            ToolStatus::ExitNonzero => "exit_nonzero",
            ToolStatus::InvalidCall => "invalid_call",
            ToolStatus::UnknownTool => "unknown_tool",
            ToolStatus::NotFound => "not_found",
            ToolStatus::PermissionDenied => "permission_denied",
            ToolStatus::Timeout => "timeout",
            ToolStatus::ComputeBudget => "compute_budget",
            ToolStatus::MemoryLimit => "memory_limit",
            ToolStatus::OutputTruncated => "output_truncated",
            ToolStatus::QuotaExceeded => "quota_exceeded",
            ToolStatus::InfraError => "infra_error",
        }
    }

    /// Whether the call did what was asked (ok, or ok with output cut for display).
    pub fn is_success(self) -> bool {
        matches!(self, ToolStatus::Ok | ToolStatus::OutputTruncated)
    }
}

impl std::fmt::Display for ToolStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<i32> for ToolStatus {
    type Error = ProtoError;
    fn try_from(v: i32) -> Result<Self, ProtoError> {
        match pb::ToolStatus::try_from(v) {
            Ok(pb::ToolStatus::Unspecified) | Err(_) => Err(invalid(
                "tool_result.status",
                format!("{v} is not a known status"),
            )),
            Ok(s) => Ok(Self::ALL[s as usize - 1]),
        }
    }
}

impl From<ToolStatus> for pb::ToolStatus {
    fn from(s: ToolStatus) -> Self {
        // Wire values are the position in ALL plus one (0 is UNSPECIFIED).
        let v = ToolStatus::ALL.iter().position(|x| *x == s).unwrap_or(0) as i32 + 1;
        pb::ToolStatus::try_from(v).unwrap_or(pb::ToolStatus::Unspecified)
    }
}

/// What a tool call produced, as recorded (the text itself is in the tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    /// Result class.
    pub status: ToolStatus,
    /// Exit code (shell commands), 0 for host tools that succeeded.
    pub exit_code: i32,
    /// Bytes of output the model saw.
    pub bytes_shown: u64,
    /// Bytes of output the tool produced.
    pub bytes_total: u64,
    /// Wasm fuel consumed.
    pub fuel_used: u64,
    /// Wall time of the call, microseconds.
    pub wall_us: u64,
}

impl TryFrom<pb::ToolResult> for ToolResult {
    type Error = ProtoError;
    fn try_from(r: pb::ToolResult) -> Result<Self, ProtoError> {
        Ok(Self {
            status: ToolStatus::try_from(r.status)?,
            exit_code: r.exit_code,
            bytes_shown: r.bytes_shown,
            bytes_total: r.bytes_total,
            fuel_used: r.fuel_used,
            wall_us: r.wall_us,
        })
    }
}

impl From<ToolResult> for pb::ToolResult {
    fn from(r: ToolResult) -> Self {
        Self {
            status: pb::ToolStatus::from(r.status) as i32,
            exit_code: r.exit_code,
            bytes_shown: r.bytes_shown,
            bytes_total: r.bytes_total,
            fuel_used: r.fuel_used,
            wall_us: r.wall_us,
        }
    }
}

/// Where a turn's time went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepTimings {
    /// Time spent generating, microseconds.
    pub generate_us: u64,
    /// Time spent in the tool, microseconds.
    pub tool_us: u64,
}

/// One turn: the tokens it appended to the context, in order.
///
/// `token_ids`, `loss_mask` and `logprobs` always have the same length. Tokens with
/// `loss_mask == false` (prompt, tool output) carry log-prob 0; they are never trained on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Turn index within the episode (a long turn may span several steps).
    pub turn: u32,
    /// Exact token ids.
    pub token_ids: Vec<u32>,
    /// `true` for tokens the policy generated.
    pub loss_mask: Vec<bool>,
    /// Behaviour-policy log-prob of each generated token.
    pub logprobs: Vec<f32>,
    /// The policy version whose weights generated this step's tokens (0 when it generated
    /// none). Actors swap weights only between turns, so a turn has one version.
    pub policy_version: u64,
    /// The parsed tool call, if the turn made one.
    pub tool_call: Option<ToolCall>,
    /// The tool's result, if a tool ran.
    pub tool_result: Option<ToolResult>,
    /// Process reward for this turn.
    pub process_reward: f32,
    /// Timings.
    pub timings: StepTimings,
    /// Recorded expert ids, laid out by the header's [`RouteShape`] (empty without one):
    /// see [`crate::routes`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<u8>,
    /// The context segment: 0 until the episode's first fold, one more after each. A
    /// segment's steps concatenated are exactly what the policy saw at once.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub segment: u32,
}

/// Whether `lp` is a generated token's log-prob: finite and at most 1e-4 (log_softmax can
/// round a hair above 0; anything more is a bug upstream).
#[inline]
pub(crate) fn generated_logprob_fits(lp: f32) -> bool {
    lp.is_finite() & (lp <= 1e-4)
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Step {
    /// Tokens the policy did not generate (prompt, tool output): masked out.
    pub fn context(turn: u32, token_ids: Vec<u32>) -> Self {
        let n = token_ids.len();
        Self {
            turn,
            token_ids,
            loss_mask: vec![false; n],
            logprobs: vec![0.0; n],
            policy_version: 0,
            tool_call: None,
            tool_result: None,
            process_reward: 0.0,
            timings: StepTimings::default(),
            routes: Vec::new(),
            segment: 0,
        }
    }

    /// Tokens generated by policy `version` with their behaviour log-probs.
    pub fn generated(turn: u32, token_ids: Vec<u32>, logprobs: Vec<f32>, version: u64) -> Self {
        let n = token_ids.len();
        Self {
            turn,
            token_ids,
            loss_mask: vec![true; n],
            logprobs,
            policy_version: version,
            tool_call: None,
            tool_result: None,
            process_reward: 0.0,
            timings: StepTimings::default(),
            routes: Vec::new(),
            segment: 0,
        }
    }

    /// The tokens the policy generated, in order.
    pub fn generated_ids(&self) -> Vec<u32> {
        let pairs = self.token_ids.iter().zip(&self.loss_mask);
        pairs.filter(|(_, m)| **m).map(|(id, _)| *id).collect()
    }

    /// Number of generated (trainable) tokens.
    pub fn generated_count(&self) -> usize {
        self.loss_mask.iter().filter(|m| **m).count()
    }

    /// Checks the invariants listed on the type.
    pub fn validate(&self) -> Result<(), ProtoError> {
        let n = self.token_ids.len();
        for (field, len) in [
            ("step.loss_mask", self.loss_mask.len()),
            ("step.logprobs", self.logprobs.len()),
        ] {
            if len != n {
                return Err(invalid(
                    field,
                    format!("has {len} entries but step.token_ids has {n}"),
                ));
            }
        }
        for (i, (&m, &lp)) in self.loss_mask.iter().zip(&self.logprobs).enumerate() {
            if m {
                if !generated_logprob_fits(lp) {
                    return Err(invalid(
                        format!("step.logprobs[{i}]"),
                        format!("{lp} is not a finite log-probability <= 0"),
                    ));
                }
            } else if lp != 0.0 {
                return Err(invalid(
                    format!("step.logprobs[{i}]"),
                    "a token with loss_mask=false must carry logprob 0",
                ));
            }
        }
        if !self.process_reward.is_finite() {
            return Err(invalid("step.process_reward", "not finite"));
        }
        Ok(())
    }
}

impl TryFrom<pb::Step> for Step {
    type Error = ProtoError;
    fn try_from(s: pb::Step) -> Result<Self, ProtoError> {
        let step = Self {
            turn: s.turn,
            token_ids: s.token_ids,
            loss_mask: s.loss_mask,
            logprobs: s.logprobs,
            policy_version: s.policy_version,
            tool_call: s.tool_call.map(|c| ToolCall {
                name: c.name,
                arguments_json: c.arguments_json,
            }),
            tool_result: s.tool_result.map(ToolResult::try_from).transpose()?,
            process_reward: s.process_reward,
            timings: s
                .timings
                .map(|t| StepTimings {
                    generate_us: t.generate_us,
                    tool_us: t.tool_us,
                })
                .unwrap_or_default(),
            routes: s.routes,
            segment: s.segment,
        };
        step.validate()?;
        Ok(step)
    }
}

impl From<Step> for pb::Step {
    fn from(s: Step) -> Self {
        Self {
            turn: s.turn,
            token_ids: s.token_ids,
            loss_mask: s.loss_mask,
            logprobs: s.logprobs,
            policy_version: s.policy_version,
            tool_call: s.tool_call.map(|c| pb::ToolCall {
                name: c.name,
                arguments_json: c.arguments_json,
            }),
            tool_result: s.tool_result.map(Into::into),
            process_reward: s.process_reward,
            timings: Some(pb::StepTimings {
                generate_us: s.timings.generate_us,
                tool_us: s.timings.tool_us,
            }),
            routes: s.routes,
            segment: s.segment,
        }
    }
}

// ------------------------------------------------------------------ footer

/// Why an episode ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Termination {
    /// The policy called `answer`.
    Answered,
    /// The turn limit was reached.
    MaxTurns,
    /// The context budget was exhausted.
    ContextFull,
    /// The sandbox or the learner failed: excluded from baselines, never scored 0.
    InfraError,
    /// Cut off by actor shutdown.
    Abandoned,
}

impl Termination {
    /// Every termination, in wire order.
    pub const ALL: [Termination; 5] = [
        Termination::Answered,
        Termination::MaxTurns,
        Termination::ContextFull,
        Termination::InfraError,
        Termination::Abandoned,
    ];

    /// The snake_case name used in exports and filters.
    pub fn as_str(self) -> &'static str {
        match self {
            Termination::Answered => "answered",
            Termination::MaxTurns => "max_turns",
            Termination::ContextFull => "context_full",
            Termination::InfraError => "infra_error",
            Termination::Abandoned => "abandoned",
        }
    }

    /// Whether the outcome reflects the policy (and may enter baselines).
    pub fn is_scored(self) -> bool {
        !matches!(self, Termination::InfraError | Termination::Abandoned)
    }
}

impl std::fmt::Display for Termination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Termination {
    type Err = ProtoError;
    fn from_str(s: &str) -> Result<Self, ProtoError> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                invalid(
                    "termination",
                    format!(
                        "{s:?} is not one of {}",
                        Self::ALL.map(Termination::as_str).join(", ")
                    ),
                )
            })
    }
}

/// The last part of a trajectory: how it ended and its totals.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryFooter {
    /// Outcome reward from the checker.
    pub outcome_reward: f32,
    /// Whether the checker accepted the final state.
    pub success: bool,
    /// Why the episode ended.
    pub termination: Termination,
    /// Steps streamed; must equal the number received.
    pub step_count: u64,
    /// Tokens streamed; must equal the number received.
    pub token_count: u64,
    /// Generated tokens streamed; must equal the number received.
    pub generated_token_count: u64,
    /// Episode wall time, milliseconds.
    pub wall_ms: u64,
    /// Wall-clock end, milliseconds since the Unix epoch.
    pub finished_unix_ms: u64,
    /// The model's chat template renders the finished conversation otherwise than these
    /// ids (which are what the policy saw).
    #[serde(default)]
    pub template_divergent: bool,
}

impl TryFrom<pb::TrajectoryFooter> for TrajectoryFooter {
    type Error = ProtoError;
    fn try_from(f: pb::TrajectoryFooter) -> Result<Self, ProtoError> {
        let termination = match pb::Termination::try_from(f.termination) {
            Ok(pb::Termination::Unspecified) | Err(_) => {
                return Err(invalid(
                    "footer.termination",
                    format!("{} is not a known termination", f.termination),
                ))
            }
            Ok(t) => Termination::ALL[t as usize - 1],
        };
        if !f.outcome_reward.is_finite() {
            return Err(invalid("footer.outcome_reward", "not finite"));
        }
        Ok(Self {
            outcome_reward: f.outcome_reward,
            success: f.success,
            termination,
            step_count: f.step_count,
            token_count: f.token_count,
            generated_token_count: f.generated_token_count,
            wall_ms: f.wall_ms,
            finished_unix_ms: f.finished_unix_ms,
            template_divergent: f.template_divergent,
        })
    }
}

impl From<TrajectoryFooter> for pb::TrajectoryFooter {
    fn from(f: TrajectoryFooter) -> Self {
        let termination = Termination::ALL
            .iter()
            .position(|t| *t == f.termination)
            .map_or(0, |i| i as i32 + 1);
        Self {
            outcome_reward: f.outcome_reward,
            success: f.success,
            termination,
            step_count: f.step_count,
            token_count: f.token_count,
            generated_token_count: f.generated_token_count,
            wall_ms: f.wall_ms,
            finished_unix_ms: f.finished_unix_ms,
            template_divergent: f.template_divergent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> TrajectoryHeader {
        TrajectoryHeader {
            trajectory_id: "actor-1.ep_7".into(),
            task: TaskRef {
                family: "hops".into(),
                level: 3,
                seed: 42,
                spec_hash: "ab12".into(),
            },
            actor_id: "actor-1".into(),
            policy_version: 5,
            sampling: SamplingParams::default(),
            group_id: "g1".into(),
            started_unix_ms: 1,
            routes: None,
            context: None,
        }
    }

    #[test]
    fn header_step_footer_round_trip_through_the_wire() {
        let h = header();
        assert_eq!(
            TrajectoryHeader::try_from(pb::TrajectoryHeader::from(h.clone())).unwrap(),
            h
        );
        let mut s = Step::generated(2, vec![1, 2, 3], vec![-0.5, -1.0, 0.0], 5);
        s.tool_call = Some(ToolCall {
            name: "shell".into(),
            arguments_json: "{\"cmd\":\"ls\"}".into(),
        });
        for status in ToolStatus::ALL {
            s.tool_result = Some(ToolResult {
                status,
                exit_code: 1,
                bytes_shown: 2,
                bytes_total: 3,
                fuel_used: 4,
                wall_us: 5,
            });
            assert_eq!(Step::try_from(pb::Step::from(s.clone())).unwrap(), s);
        }
        for termination in Termination::ALL {
            let f = TrajectoryFooter {
                outcome_reward: 1.0,
                success: true,
                termination,
                step_count: 1,
                token_count: 3,
                generated_token_count: 3,
                wall_ms: 9,
                finished_unix_ms: 10,
                template_divergent: false,
            };
            assert_eq!(
                TrajectoryFooter::try_from(pb::TrajectoryFooter::from(f)).unwrap(),
                f
            );
            assert_eq!(
                termination.as_str().parse::<Termination>().unwrap(),
                termination
            );
        }
    }

    #[test]
    fn misaligned_or_bad_steps_are_refused_with_the_field_named() {
        let mut s = Step::generated(0, vec![1, 2], vec![-0.1], 1);
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("step.logprobs") && err.contains("1 entries"),
            "{err}"
        );
        s.logprobs = vec![-0.1, f32::NAN];
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("logprobs[1]"));
        let mut c = Step::context(0, vec![1]);
        c.logprobs[0] = -0.3;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("loss_mask=false"));
    }

    #[test]
    fn trajectory_ids_are_restricted_to_a_safe_alphabet() {
        assert!(validate_trajectory_id("a-B_9.x").is_ok());
        for bad in ["", "a/b", "a\0b", "a b", &"x".repeat(129)] {
            assert!(validate_trajectory_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unspecified_enums_are_refused() {
        let mut f = pb::TrajectoryFooter::from(TrajectoryFooter {
            outcome_reward: 0.0,
            success: false,
            termination: Termination::Answered,
            step_count: 0,
            token_count: 0,
            generated_token_count: 0,
            wall_ms: 0,
            finished_unix_ms: 0,
            template_divergent: false,
        });
        f.termination = 0;
        assert!(TrajectoryFooter::try_from(f).is_err());
        assert!(ToolStatus::try_from(0).is_err());
        assert!(ToolStatus::try_from(99).is_err());
    }
}
