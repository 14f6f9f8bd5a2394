//! Process-reward rules as data, and the pure function that scores a sequence of turns.
//!
//! Each rule contributes a component to a turn; [`score_turns`] returns the components'
//! sum per turn (aggregate and clip them with `corvid_rewards::ProcessRewardAggregation`).
//! A turn whose tool failed with `infra_error` scores 0 and is not remembered as a call:
//! the host's failure is never the policy's.

use std::collections::HashSet;

use corvid_proto::{ToolCall, ToolStatus};

use crate::error::TasksError;

/// One process-reward rule.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProcessRule {
    /// `+reward` the first time a call reads one of `paths`: `read_file` with that `path`,
    /// or a successful `shell` command with that path as one of its words.
    ReadsNeeded {
        /// Files the solution needs.
        paths: Vec<String>,
        /// Reward per newly read needed file (finite, `0..=`[`ProcessRule::MAX_WEIGHT`]).
        reward: f64,
    },
    /// `+reward` the first time a successful `search` query contains one of `terms`
    /// (case-insensitive).
    SearchesFor {
        /// Terms the solution must look up.
        terms: Vec<String>,
        /// Reward per newly searched term (finite, `0..=`[`ProcessRule::MAX_WEIGHT`]).
        reward: f64,
    },
    /// `−penalty` for a call that is invalid: status `invalid_call` or `unknown_tool`.
    InvalidCall {
        /// Penalty (finite, `0..=`[`ProcessRule::MAX_WEIGHT`]; it is subtracted).
        penalty: f64,
    },
    /// `−penalty` for a call identical (same name, same parsed arguments) to an earlier one
    /// made since the last successful call that can have changed the workspace
    /// (`write_file`, `python`, a shell line that writes, a task's own tool).
    RepeatCall {
        /// Penalty (finite, `0..=`[`ProcessRule::MAX_WEIGHT`]; it is subtracted).
        penalty: f64,
    },
}

impl ProcessRule {
    /// The largest `reward` or `penalty` a rule may have. A turn's process reward is stored
    /// as a 32-bit float and every stored step's must be finite; with weights at most this,
    /// no sum of a turn's components comes near `f32::MAX`.
    pub const MAX_WEIGHT: f64 = 1e6;

    /// The rule's weight: its key (`reward` or `penalty`) and value.
    pub fn weight(&self) -> (&'static str, f64) {
        match self {
            ProcessRule::ReadsNeeded { reward, .. } | ProcessRule::SearchesFor { reward, .. } => {
                ("reward", *reward)
            }
            ProcessRule::InvalidCall { penalty } | ProcessRule::RepeatCall { penalty } => {
                ("penalty", *penalty)
            }
        }
    }

    /// Why the rule's weight is invalid, if it is (`is …`, to follow `KEY = VALUE`): not a
    /// finite number (a step whose process reward is not finite cannot be stored, so every
    /// episode that earns it would be lost), negative (the rule gives `+reward` or
    /// `−penalty`: a negative weight turns a reward into a penalty or a penalty into a
    /// reward), or above [`ProcessRule::MAX_WEIGHT`].
    pub fn weight_problem(&self) -> Option<String> {
        let (key, w) = self.weight();
        let sign = if key == "reward" {
            "the rule adds its reward, so a negative one penalises what it should reward"
        } else {
            "the rule subtracts its penalty, so a negative one rewards what it should penalise"
        };
        if !w.is_finite() {
            Some(
                "is not a finite number: a step's process reward must be finite to be stored, so every episode that earns it would be lost"
                    .to_string(),
            )
        } else if w < 0.0 {
            Some(format!("is negative: {sign}"))
        } else if w > Self::MAX_WEIGHT {
            Some(format!(
                "is above {}: a turn's process reward is stored as a 32-bit float and must stay finite",
                Self::MAX_WEIGHT
            ))
        } else {
            None
        }
    }

    /// Checks the rule's data: its `reward` or `penalty` is a finite number in
    /// `0..=`[`ProcessRule::MAX_WEIGHT`] (see [`ProcessRule::weight_problem`]).
    pub fn validate(&self) -> Result<(), TasksError> {
        match self.weight_problem() {
            None => Ok(()),
            Some(why) => {
                let (key, w) = self.weight();
                Err(TasksError::InvalidConfig {
                    field: format!("process_rewards.{key}"),
                    value: w.to_string(),
                    expected: format!("a finite number in 0..={}; it {why}", Self::MAX_WEIGHT),
                })
            }
        }
    }

    /// The default rules of a family: reward needed reads, penalise invalid and repeated
    /// calls.
    pub fn defaults(needed_paths: Vec<String>) -> Vec<ProcessRule> {
        vec![
            ProcessRule::ReadsNeeded {
                paths: needed_paths,
                reward: 0.1,
            },
            ProcessRule::InvalidCall { penalty: 0.1 },
            ProcessRule::RepeatCall { penalty: 0.05 },
        ]
    }
}

/// One turn as the scorer sees it: the call the policy made and its result status.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoredTurn<'a> {
    /// The tool call.
    pub call: &'a ToolCall,
    /// Its result status.
    pub status: ToolStatus,
}

/// A canonical key for a call: name plus arguments re-serialised (so key order and
/// whitespace do not matter), or the raw text if it does not parse.
fn call_key(call: &ToolCall) -> String {
    match serde_json::from_str::<serde_json::Value>(&call.arguments_json) {
        Ok(v) => format!("{}\u{0}{}", call.name, v),
        Err(_) => format!("{}\u{0}{}", call.name, call.arguments_json),
    }
}

fn arg_str(call: &ToolCall, key: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(&call.arguments_json).ok()?;
    v.get(key)?.as_str().map(str::to_string)
}

/// The workspace paths a call reads, as the process rules count them: `read_file`'s `path`,
/// or every word of a `shell` command (its status is the caller's to check).
pub fn paths_read(call: &ToolCall) -> Vec<String> {
    match call.name.as_str() {
        "read_file" => arg_str(call, "path").into_iter().collect(),
        "shell" => arg_str(call, "command")
            .map(|c| c.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// Whether a call can have changed the workspace: `write_file`, `python`, a shell command
/// line with a redirect or a command that writes (`sed -i`, `rm`, `mv`, `cp`, `mkdir`,
/// `touch`, `python`), or a task's own tool (which may be mounted writable).
fn may_write(call: &ToolCall) -> bool {
    match call.name.as_str() {
        "write_file" | "python" => true,
        "shell" => {
            let line = arg_str(call, "command").unwrap_or_default();
            line.contains('>')
                || line.contains("sed -i")
                || line
                    .split(|c: char| c.is_whitespace() || "|;&".contains(c))
                    .any(|w| {
                        matches!(
                            w,
                            "rm" | "mv" | "cp" | "mkdir" | "touch" | "python" | "python3"
                        )
                    })
        }
        "read_file" | "list_dir" | "search" | "answer" => false,
        _ => true,
    }
}

/// Scores each turn: `p_t = Σ_rules component_rule(t)` with the components of
/// [`ProcessRule`]; infra-failed turns score 0 and are forgotten.
pub fn score_turns(rules: &[ProcessRule], turns: &[ScoredTurn<'_>]) -> Vec<f64> {
    let mut seen_calls: HashSet<String> = HashSet::new();
    let mut read: HashSet<String> = HashSet::new();
    let mut searched: HashSet<String> = HashSet::new();
    let mut out = Vec::with_capacity(turns.len());
    for turn in turns {
        if turn.status == ToolStatus::InfraError {
            out.push(0.0);
            continue;
        }
        let key = call_key(turn.call);
        let repeat = !seen_calls.insert(key);
        // Running the tests again after an edit is progress, not a loop: a call that can
        // have changed the workspace starts the count afresh.
        if turn.status.is_success() && may_write(turn.call) {
            seen_calls.clear();
        }
        let mut p = 0.0;
        for rule in rules {
            match rule {
                ProcessRule::ReadsNeeded { paths, reward } => {
                    if !turn.status.is_success() {
                        continue;
                    }
                    let touched = paths_read(turn.call);
                    for path in paths {
                        if touched.contains(path) && read.insert(path.clone()) {
                            p += reward;
                        }
                    }
                }
                ProcessRule::SearchesFor { terms, reward } => {
                    if turn.call.name != "search" || !turn.status.is_success() {
                        continue;
                    }
                    let q = arg_str(turn.call, "query")
                        .unwrap_or_default()
                        .to_lowercase();
                    for term in terms {
                        let t = term.to_lowercase();
                        if q.contains(&t) && searched.insert(t) {
                            p += reward;
                        }
                    }
                }
                ProcessRule::InvalidCall { penalty } => {
                    if matches!(
                        turn.status,
                        ToolStatus::InvalidCall | ToolStatus::UnknownTool
                    ) {
                        p -= penalty;
                    }
                }
                ProcessRule::RepeatCall { penalty } => {
                    if repeat {
                        p -= penalty;
                    }
                }
            }
        }
        out.push(p);
    }
    out
}
