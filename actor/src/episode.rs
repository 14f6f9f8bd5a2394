//! One episode's state machine: turns, tool results, the context guard, the turn limit,
//! process rewards, the checker, and the proto steps and footer it produces.
//!
//! The layout is `corvid_episode::EpisodeFormat`'s, exactly: step `t` is the
//! turn's context (the prompt for turn 0, the previous call's result after that; loss mask
//! 0) followed by the tokens the policy generated (mask 1, each with its behaviour log-prob
//! and policy version). This module knows nothing about the model: the engine
//! ([`crate::rollout`]) feeds it generated tokens and tool results and asks it what comes
//! next.

use std::sync::Arc;
use std::time::{Duration, Instant};

use corvid_episode::fold::{self, FoldedTurn, SUMMARY_REQUEST};
use corvid_episode::{invalid_call_reward, CallParseError, Conversation, EpisodeFormat};
use corvid_proto::{
    ContextFold, Fold, RouteShape, SamplingParams, Step, StepTimings, TaskRef, Termination,
    ToolCall, ToolResult, ToolStatus, TrajectoryFooter, TrajectoryHeader,
};
use corvid_sandbox::ToolOutput;
use corvid_tasks::{SplitMix64, TaskEnv, TaskInstance, Verdict};

/// Bytes a step's tokens may take on the wire: half of
/// `corvid_proto::limits::MAX_STEP_CHUNK_BYTES`, the rest left for the tool call and result.
/// A longer turn is split into consecutive steps with the same turn index (the tool call,
/// result and reward go on the last piece): see [`tokens_per_step`].
pub const STEP_TOKEN_BYTES: usize = corvid_proto::limits::MAX_STEP_CHUNK_BYTES / 2;

/// Most wire bytes of one token without routes: its id (a varint of up to 5 bytes), its mask
/// byte and its 4-byte log-prob.
const TOKEN_WIRE_BYTES: usize = 10;

/// Most tokens in one step when each also carries `route_bytes` bytes of routes: few enough
/// that the step stays within [`STEP_TOKEN_BYTES`] (209,715 tokens without routes, 4,424 of
/// a DeepSeek-V3 shape: 58 MoE layers × 8 experts, one byte each).
pub fn tokens_per_step(route_bytes: usize) -> usize {
    STEP_TOKEN_BYTES / (TOKEN_WIRE_BYTES + route_bytes)
}

/// Least room, in tokens, a turn needs within the context budget to start (capped by
/// `max_new_tokens`). A turn that starts generates at most what still fits; if the budget
/// ends mid-turn the episode ends as `context_full`.
pub const MIN_TURN_TOKENS: usize = 16;

/// The route bytes of the tokens `tokens` of a turn whose rows are `routes` (`per_token`
/// bytes each), the first `off` tokens having none (the trajectory's first token): rows
/// `tokens − off`, clamped at 0. Empty without routes.
fn piece_routes(
    routes: &[u8],
    per_token: usize,
    tokens: std::ops::Range<usize>,
    off: usize,
) -> &[u8] {
    let (lo, hi) = (
        tokens.start.saturating_sub(off),
        tokens.end.saturating_sub(off),
    );
    &routes[lo * per_token..hi * per_token]
}

/// One episode to run: a task instance and how to run it.
#[derive(Debug, Clone)]
pub struct EpisodeSpec {
    /// Trajectory id, `[A-Za-z0-9_.-]{1,128}`, unique per episode and stable across resends.
    pub trajectory_id: String,
    /// Recorded in the header.
    pub actor_id: String,
    /// The task instance.
    pub task: Arc<TaskInstance>,
    /// Episodes of one group share a task instance.
    pub group_id: String,
    /// Most turns.
    pub max_turns: u32,
    /// Context budget in tokens: the whole episode's when it folds, else its window's (the
    /// engine also caps a window at the model's positions).
    pub context_budget: u32,
    /// Sampling; `seed` seeds this episode's RNG, `max_new_tokens` bounds each turn.
    pub sampling: SamplingParams,
    /// The window and the fold (`None`: the budget is one window, no fold).
    pub context: Option<ContextFold>,
}

impl EpisodeSpec {
    /// An episode of `task` with the task's own turn limit and context budget.
    pub fn new(
        trajectory_id: impl Into<String>,
        task: Arc<TaskInstance>,
        sampling: SamplingParams,
    ) -> Self {
        Self {
            trajectory_id: trajectory_id.into(),
            actor_id: String::new(),
            max_turns: task.max_turns,
            context_budget: task.context_budget,
            group_id: task.id.replace('/', "."),
            task,
            sampling,
            context: None,
        }
    }

    /// The header recorded for this episode, started under policy `version`.
    pub fn header(&self, version: u64) -> TrajectoryHeader {
        TrajectoryHeader {
            trajectory_id: self.trajectory_id.clone(),
            task: task_ref(&self.task),
            actor_id: self.actor_id.clone(),
            policy_version: version,
            sampling: self.sampling,
            group_id: self.group_id.clone(),
            started_unix_ms: unix_ms(),
            routes: None,
            context: self.context.clone(),
        }
    }
}

fn task_ref(t: &TaskInstance) -> TaskRef {
    t.task_ref()
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Where an episode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Its workspace is being created.
    Starting,
    /// Context tokens wait to be prefilled; then it decodes.
    Ready,
    /// In the decode batch.
    Decoding,
    /// Its tool call runs.
    Tool,
    /// Its checker runs.
    Checking,
}

/// What to do after a turn's tool result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Another turn (its context is queued).
    Turn,
    /// Run the checker, then end with this termination.
    Check(Termination),
    /// End now without the checker (infrastructure failure).
    End(Termination),
}

/// A generated turn's call, ready for the sandbox, or the message the model reads instead.
#[derive(Debug)]
pub(crate) enum TurnCall {
    /// A well-formed call.
    Call(ToolCall),
    /// A malformed turn: the text of the tool message.
    Malformed(CallParseError),
}

/// Episode bookkeeping.
#[derive(Debug)]
pub(crate) struct EpisodeRun {
    pub spec: EpisodeSpec,
    pub header: TrajectoryHeader,
    pub phase: Phase,
    pub rng: SplitMix64,
    /// Every token of the current segment so far (prompt, generated, tool results): what the
    /// policy sees.
    pub history: Vec<u32>,
    /// Leading tokens of `history` already in this episode's cache.
    pub cached: usize,
    /// Most tokens of one segment: the window (at most the model's positions).
    pub window: usize,
    /// Most tokens of the whole episode, over its segments (the window when it cannot fold).
    pub budget: usize,
    /// Tokens of the segments before this one.
    pub spent: usize,
    /// The current segment (0 until the first fold).
    pub segment: u32,
    /// The next step opens `segment` (its first token has no route row).
    pub opens_segment: bool,
    /// What a fold does, its memory cap and notes file.
    pub fold: Fold,
    /// The conversation the episode started from (the prompt), which each fold rebuilds on.
    pub base: Conversation,
    /// The finished turns in the current segment, each with the text that answered it.
    pub turns: Vec<FoldedTurn>,
    /// The length of the first segment's prompt, tokens.
    pub prompt_len: usize,
    /// The notes file's latest text (`notes` fold), read after each call.
    pub notes: String,
    /// The memory the current segment carries (`summary` fold).
    pub memory: Option<String>,
    /// The turn being generated is the summary a `summary` fold asked for.
    pub summarizing: bool,
    /// Summary turns so far (not counted against `max_turns`).
    pub summary_turns: u32,
    /// Turns recorded in the current segment.
    pub segment_turns: usize,
    /// An earlier segment's template rendering differed from its ids.
    pub divergent: bool,
    pub turn: u32,
    /// This turn's context tokens.
    pub context: Vec<u32>,
    /// This turn's generated tokens and their log-probs.
    pub generated: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// The policy version that generated this turn (weights swap only between turns).
    pub version: u64,
    pub turn_started: Instant,
    pub generate_us: u64,
    pub pending_call: Option<TurnCall>,
    pub next_after_check: Option<Termination>,
    pub started: Instant,
    pub steps_out: u64,
    pub tokens_out: u64,
    pub generated_out: u64,
    /// Deadline of the running tool or checker.
    pub deadline: Option<Instant>,
    /// The messages the episode is built from and the task's tools: a model's own template
    /// renders each tool result after this conversation.
    pub conversation: Conversation,
    /// The generated ids of the latest finished turn.
    pub last_generated: Vec<u32>,
    /// Turns finished (recorded as steps).
    pub turns_finished: usize,
    /// Why the episode could not start (the format could not lay out its prompt).
    pub start_error: Option<String>,
    /// Leading positions of `history` whose routes were recorded (each keeps the first
    /// forward's: a re-prefill after a weight swap records only positions past these).
    pub routed: usize,
    /// Recorded expert ids of the positions from `routes_from` to `routed`, not yet sent.
    pub route_ids: Vec<u16>,
    /// The position of `route_ids`' first row.
    pub routes_from: usize,
    /// A turn's routes were not all recorded (a bug, never expected): the episode ends as
    /// `infra_error`, so it is stored but never trained on.
    pub routes_broken: bool,
}

impl EpisodeRun {
    /// A new episode; its first context is the prompt.
    pub fn new(
        spec: EpisodeSpec,
        version: u64,
        format: &EpisodeFormat,
        env: &TaskEnv,
        max_positions: usize,
    ) -> Self {
        let header = spec.header(version);
        let conversation = format.conversation(env, &spec.task);
        let (prompt, start_error) = match format.prompt_ids(&conversation) {
            Ok(ids) => (ids, None),
            Err(e) => (Vec::new(), Some(format!("laying out the prompt: {e}"))),
        };
        let fold = spec.context.as_ref().map_or(Fold::None, |c| c.fold);
        let window = match &spec.context {
            Some(c) => c.window_tokens.min(spec.context_budget),
            None => spec.context_budget,
        } as usize;
        let window = window.min(max_positions);
        let budget = match fold {
            Fold::None => window,
            _ => spec.context_budget as usize,
        };
        Self {
            rng: SplitMix64::new(spec.sampling.seed),
            header,
            phase: Phase::Starting,
            prompt_len: prompt.len(),
            history: prompt.clone(),
            cached: 0,
            window,
            budget,
            spent: 0,
            segment: 0,
            opens_segment: true,
            fold,
            base: conversation.clone(),
            turns: Vec::new(),
            notes: String::new(),
            memory: None,
            summarizing: false,
            summary_turns: 0,
            segment_turns: 0,
            divergent: false,
            turn: 0,
            context: prompt,
            generated: Vec::new(),
            logprobs: Vec::new(),
            version,
            turn_started: Instant::now(),
            generate_us: 0,
            pending_call: None,
            next_after_check: None,
            started: Instant::now(),
            steps_out: 0,
            tokens_out: 0,
            generated_out: 0,
            deadline: None,
            conversation,
            last_generated: Vec::new(),
            turns_finished: 0,
            start_error,
            routed: 0,
            route_ids: Vec::new(),
            routes_from: 0,
            routes_broken: false,
            spec,
        }
    }

    /// Keeps the expert ids of a forward that ran the positions from `start` on (`ids`, one
    /// row per position), for the positions not recorded before.
    pub fn record_routes(&mut self, start: usize, ids: &[u16]) {
        let Some(shape) = self.header.routes else {
            return;
        };
        let per = shape.ids_per_token();
        let rows = ids.len() / per;
        if start > self.routed {
            debug_assert!(false, "routes skip positions {}..{start}", self.routed);
            self.routes_broken = true;
            return;
        }
        if start + rows <= self.routed {
            return;
        }
        let skip = self.routed - start;
        self.route_ids.extend_from_slice(&ids[skip * per..]);
        self.routed = start + rows;
    }

    /// `max_new_tokens` of the episode's sampling (at least 1).
    pub fn max_new(&self) -> usize {
        self.spec.sampling.max_new_tokens.max(1) as usize
    }

    /// Tokens left before the window or the episode's budget ends, from `used` tokens of
    /// this segment.
    fn room(&self, used: usize) -> usize {
        let window = self.window.saturating_sub(used);
        window.min(self.budget.saturating_sub(self.spent + used))
    }

    /// Most tokens this turn may generate: `max_new_tokens`, or less when the window or the
    /// budget ends first; a summary at most the fold's memory cap.
    pub fn turn_limit(&self) -> usize {
        let start = self.history.len() - self.generated.len();
        let limit = self.max_new().min(self.room(start));
        match (&self.spec.context, self.summarizing) {
            (Some(c), true) => limit.min(c.memory_tokens.max(1) as usize),
            _ => limit,
        }
    }

    /// The context guard: whether the queued context leaves room for a turn — at least
    /// [`MIN_TURN_TOKENS`] (or `max_new_tokens` if smaller) within the window and the budget.
    pub fn next_turn_fits(&self) -> bool {
        self.room(self.history.len()) >= self.max_new().min(MIN_TURN_TOKENS)
    }

    /// Whether this turn was stopped by the context budget: it used all the room left,
    /// less than `max_new_tokens`, without reaching a stop token.
    pub fn cut_by_context(&self, stop_ids: &[u32]) -> bool {
        let limit = self.turn_limit();
        !self.summarizing
            && limit < self.max_new()
            && self.generated.len() >= limit
            && !self.generated.last().is_some_and(|t| stop_ids.contains(t))
    }

    /// Records a generated token.
    pub fn push_generated(&mut self, token: u32, logprob: f32, version: u64) {
        self.generated.push(token);
        self.logprobs.push(logprob);
        self.version = version;
        self.history.push(token);
    }

    /// Whether the turn is over after its latest token.
    pub fn turn_over(&self, stop_ids: &[u32]) -> bool {
        self.generated.last().is_some_and(|t| stop_ids.contains(t))
            || self.generated.len() >= self.turn_limit()
    }

    /// Ends generation: parses the call. Returns it for the sandbox, or the parse error.
    pub fn end_generation(&mut self, format: &EpisodeFormat) -> &TurnCall {
        self.generate_us = self.turn_started.elapsed().as_micros() as u64;
        let call = match format.parse_call(&self.generated) {
            Ok(call) => TurnCall::Call(call),
            Err(e) => TurnCall::Malformed(e),
        };
        self.pending_call.insert(call)
    }

    /// The steps of the finished turn (usually one; see [`tokens_per_step`]).
    fn take_turn_steps(
        &mut self,
        tool_call: Option<ToolCall>,
        tool_result: Option<ToolResult>,
        process_reward: f32,
        tool_us: u64,
    ) -> Vec<Step> {
        let n_ctx = self.context.len();
        let n_gen = self.generated.len();
        let mut token_ids = std::mem::take(&mut self.context);
        self.last_generated.clone_from(&self.generated);
        self.turns_finished += 1;
        self.segment_turns += 1;
        token_ids.append(&mut self.generated);
        let mut loss_mask = vec![false; n_ctx];
        loss_mask.resize(n_ctx + n_gen, true);
        let mut logprobs = vec![0.0; n_ctx];
        logprobs.append(&mut self.logprobs);
        let total = token_ids.len();
        // Route row `j` belongs to token `j` (the input before it predicted it); a segment's
        // first token has none.
        let first_step = std::mem::take(&mut self.opens_segment);
        let off = usize::from(first_step);
        let (routes, per_token) = match self.header.routes {
            Some(shape) => (self.take_routes(total, first_step), shape.bytes_per_token()),
            None => (Vec::new(), 0),
        };
        let per_step = tokens_per_step(per_token);
        let pieces = total.div_ceil(per_step).max(1);
        let mut steps = Vec::with_capacity(pieces);
        for i in 0..pieces {
            let lo = i * per_step;
            let hi = (lo + per_step).min(total);
            let last = i + 1 == pieces;
            let route_bytes = piece_routes(&routes, per_token, lo..hi, off).to_vec();
            steps.push(Step {
                turn: self.turn,
                token_ids: token_ids[lo..hi].to_vec(),
                loss_mask: loss_mask[lo..hi].to_vec(),
                logprobs: logprobs[lo..hi].to_vec(),
                // Pieces of context alone (a long prompt split) generated nothing.
                policy_version: if hi > n_ctx { self.version } else { 0 },
                tool_call: if last { tool_call.clone() } else { None },
                tool_result: if last { tool_result } else { None },
                process_reward: if last { process_reward } else { 0.0 },
                timings: if last {
                    StepTimings {
                        generate_us: self.generate_us,
                        tool_us,
                    }
                } else {
                    StepTimings::default()
                },
                routes: route_bytes,
                segment: self.segment,
            });
        }
        self.steps_out += steps.len() as u64;
        self.tokens_out += total as u64;
        self.generated_out += n_gen as u64;
        steps
    }

    /// The route bytes of a finished turn of `total` tokens ending at the end of `history`:
    /// the rows of the positions before each of its tokens. All of them were run while the
    /// turn was produced. Should any be missing, the episode is marked `routes_broken` and the
    /// turn gets well-formed placeholder rows (experts `0..k` in every layer), so that what
    /// it streams is still stored, as an `infra_error` episode that is never trained on.
    fn take_routes(&mut self, total: usize, first_step: bool) -> Vec<u8> {
        let Some(shape) = self.header.routes else {
            return Vec::new();
        };
        let per = shape.ids_per_token();
        // The next turn's context is not queued yet: the turn ends the history.
        let start = self.history.len() - total;
        let from = start.saturating_sub(usize::from(!first_step));
        let rows = RouteShape::rows_of(total, first_step);
        if self.routes_broken || self.routes_from != from || self.routed < from + rows {
            tracing::error!(
                episode = %self.header.trajectory_id,
                from, rows, routes_from = self.routes_from, routed = self.routed,
                "a turn's routes were not all recorded; the episode ends as infra_error"
            );
            self.routes_broken = true;
            self.route_ids.clear();
            self.routes_from = from + rows;
            self.routed = self.routed.max(from + rows);
            let k = shape.experts_per_token as u16;
            let ids: Vec<u16> = (0..rows * shape.moe_layers as usize)
                .flat_map(|_| 0..k)
                .collect();
            return shape.pack(&ids);
        }
        let ids: Vec<u16> = self.route_ids.drain(..rows * per).collect();
        self.routes_from = from + rows;
        shape.pack(&ids)
    }

    /// Queues the next turn's context (the tool message, after the turn `after` just
    /// generated) and advances the turn counter. When the window would then leave no room for
    /// a whole turn, the episode folds ([`Self::fold_segment`]), or, under `summary`, the
    /// message asks for the summary turn first. A format that cannot lay the message out (its
    /// template fails on this text) ends the episode as an infrastructure error.
    fn queue_context(
        &mut self,
        format: &EpisodeFormat,
        after: &[u32],
        text: &str,
        answered: bool,
    ) -> Result<(), Termination> {
        let id = self.header.trajectory_id.clone();
        let layout_error = |e: corvid_episode::FormatError| {
            tracing::warn!(episode = %id, "laying out a tool result: {e}");
            Termination::InfraError
        };
        // An episode that ends after this turn does not fold.
        let ending = answered || self.turn + 1 - self.summary_turns >= self.spec.max_turns;
        let folding = self.fold != Fold::None && !ending;
        if folding {
            self.turns.push(FoldedTurn {
                generated: after.to_vec(),
                result: text.to_string(),
            });
        }
        // The segment as it stands, to check its rendering if it is folded away.
        let before = folding.then(|| self.conversation.clone());
        let ids = format
            .result_ids(&mut self.conversation, after, text)
            .map_err(layout_error)?;
        let memory_cap = self.memory_cap();
        // Under `summary`, room for a turn and then the request and the summary: the
        // request's bytes bound its tokens.
        let asking_room = SUMMARY_REQUEST.len() + 2 + memory_cap;
        let summary = self.fold == Fold::Summary;
        let reserve = self.max_new() + if summary { asking_room } else { 0 };
        let full = folding && self.history.len() + ids.len() + reserve > self.window;
        let mut folded = false;
        if let (true, Some(before)) = (full, before) {
            let divergent = self.divergent_with(format, before.clone(), &self.history);
            folded = match summary {
                true => {
                    // The request after the output; when that leaves no room for the summary,
                    // in place of the output, which the next segment's kept turns show.
                    let mut conversation = before.clone();
                    let asking = format!("{text}\n\n{SUMMARY_REQUEST}");
                    let mut ids = format
                        .result_ids(&mut conversation, after, &asking)
                        .map_err(layout_error)?;
                    if self.history.len() + ids.len() + memory_cap > self.window {
                        conversation = before;
                        ids = format
                            .result_ids(&mut conversation, after, SUMMARY_REQUEST)
                            .map_err(layout_error)?;
                    }
                    if self.history.len() + ids.len() + memory_cap <= self.window {
                        self.conversation = conversation;
                        self.summarizing = true;
                        self.history.extend_from_slice(&ids);
                        self.context = ids;
                        self.advance_turn();
                        return Ok(());
                    }
                    // No room to ask: fold with the memory carried so far.
                    let memory = self.memory.clone();
                    self.fold_segment(format, memory, divergent)?
                }
                false => {
                    let memory = (self.fold == Fold::Notes && !self.notes.is_empty())
                        .then(|| format.cut_to_tokens(&self.notes, memory_cap));
                    self.fold_segment(format, memory, divergent)?
                }
            };
        }
        if !folded {
            self.history.extend_from_slice(&ids);
            self.context = ids;
        }
        self.advance_turn();
        Ok(())
    }

    fn advance_turn(&mut self) {
        self.turn += 1;
        self.turn_started = Instant::now();
        self.generate_us = 0;
    }

    /// The fold's memory cap, tokens (0 without a fold).
    fn memory_cap(&self) -> usize {
        self.spec
            .context
            .as_ref()
            .map_or(0, |c| c.memory_tokens as usize)
    }

    /// Starts a new segment carrying `memory`: the prompt, the memory and the most recent
    /// finished turns whose context fits in half the window (at least the latest, whose
    /// result the policy has not read yet). Returns false, leaving the segment as it is, when
    /// even that leaves no room for a whole turn: the episode then ends as `context_full`
    /// when the window fills.
    fn fold_segment(
        &mut self,
        format: &EpisodeFormat,
        memory: Option<String>,
        divergent: bool,
    ) -> Result<bool, Termination> {
        let n = self.turns.len();
        let (segment, keep) = fold::rebuild(
            format,
            &self.base,
            self.fold,
            memory.as_deref(),
            &self.turns,
            self.prompt_len,
            self.window / 2,
        )
        .map_err(|e| {
            tracing::warn!(episode = %self.header.trajectory_id, "laying out a folded context: {e}");
            Termination::InfraError
        })?;
        let room = segment.ids.len() + self.max_new();
        if room > self.window || self.spent + self.history.len() + room > self.budget {
            tracing::debug!(episode = %self.header.trajectory_id, tokens = segment.ids.len(), "a fold leaves no room for a turn");
            return Ok(false);
        }
        self.divergent |= divergent;
        self.turns.drain(..n - keep);
        self.turns_finished = keep;
        self.segment_turns = 0;
        self.spent += self.history.len();
        self.history.clone_from(&segment.ids);
        self.context = segment.ids;
        self.conversation = segment.conversation;
        self.memory = memory;
        self.cached = 0;
        self.routed = 0;
        self.routes_from = 0;
        self.route_ids.clear();
        self.segment += 1;
        self.opens_segment = true;
        Ok(true)
    }

    /// What follows a turn whose tool message is queued: the answer, the turn limit, or
    /// the context guard may end the episode.
    fn decide(&self, answered: bool) -> Next {
        if self.routes_broken {
            Next::End(Termination::InfraError)
        } else if answered {
            Next::Check(Termination::Answered)
        } else if self.turn - self.summary_turns >= self.spec.max_turns {
            Next::Check(Termination::MaxTurns)
        } else if !self.next_turn_fits() {
            Next::Check(Termination::ContextFull)
        } else {
            Next::Turn
        }
    }

    /// A malformed turn: the parse error becomes the tool message; the process reward is
    /// what the task's rules give an invalid call.
    pub fn finish_malformed(
        &mut self,
        format: &EpisodeFormat,
        err: &CallParseError,
    ) -> (Vec<Step>, Next) {
        let after = self.generated.clone();
        let reward = invalid_call_reward(&self.spec.task);
        let steps = self.take_turn_steps(None, None, reward as f32, 0);
        if let Err(end) = self.queue_context(format, &after, &format.parse_error_text(err), false) {
            return (steps, Next::End(end));
        }
        (steps, self.decide(false))
    }

    /// A turn the context budget cut off: recorded as generated, no call runs, and the
    /// episode ends (after the checker) as `context_full`.
    pub fn finish_cut(&mut self) -> (Vec<Step>, Next) {
        let steps = self.take_turn_steps(None, None, 0.0, 0);
        if self.routes_broken {
            return (steps, Next::End(Termination::InfraError));
        }
        (steps, Next::Check(Termination::ContextFull))
    }

    /// A summary turn (the `summary` fold asked for it): recorded as generated, no call runs,
    /// and its text becomes the memory of the segment the episode folds into.
    pub fn finish_summary(&mut self, format: &EpisodeFormat) -> (Vec<Step>, Next) {
        self.generate_us = self.turn_started.elapsed().as_micros() as u64;
        // The turn's limit was the memory cap: its whole text is the memory.
        let memory = format.turn_text(&self.generated);
        let steps = self.take_turn_steps(None, None, 0.0, 0);
        self.summarizing = false;
        self.summary_turns += 1;
        if self.routes_broken {
            return (steps, Next::End(Termination::InfraError));
        }
        let divergent = self.divergent_with(format, self.conversation.clone(), &self.history);
        match self.fold_segment(format, Some(memory), divergent) {
            Err(end) => return (steps, Next::End(end)),
            // Nothing can follow the summary in this segment.
            Ok(false) => return (steps, Next::Check(Termination::ContextFull)),
            Ok(true) => {}
        }
        self.advance_turn();
        (steps, self.decide(false))
    }

    /// A call that ran: its output becomes the tool message; `notes` is the notes file's
    /// text after it (a `notes` fold carries it).
    pub fn finish_call(
        &mut self,
        format: &EpisodeFormat,
        call: ToolCall,
        out: &ToolOutput,
        process_reward: f64,
        wall: Duration,
        notes: Option<String>,
    ) -> (Vec<Step>, Next) {
        if let Some(notes) = notes {
            self.notes = notes;
        }
        let after = self.generated.clone();
        let status = out.result.status;
        let answered = call.name == "answer" && status.is_success();
        let steps = self.take_turn_steps(
            Some(call),
            Some(out.result),
            process_reward as f32,
            wall.as_micros() as u64,
        );
        if status == ToolStatus::InfraError {
            return (steps, Next::End(Termination::InfraError));
        }
        if let Err(end) = self.queue_context(format, &after, &out.text, answered) {
            return (steps, Next::End(end));
        }
        (steps, self.decide(answered))
    }

    /// Whether the template renders a segment's finished conversation otherwise than the ids
    /// the episode recorded for it ([`EpisodeFormat::finish`]), this segment's or one folded
    /// away; false in the byte layout.
    pub fn template_divergent(&self, format: &EpisodeFormat) -> bool {
        // A context queued after the last turn was never recorded.
        let recorded = self.history.len() - self.context.len();
        self.divergent
            || self.divergent_with(format, self.conversation.clone(), &self.history[..recorded])
    }

    /// Whether the template renders `conversation` (the segment's, its latest turn closed or
    /// not) otherwise than the segment's recorded `ids`; false before a turn was recorded in
    /// the segment, and in the byte layout.
    fn divergent_with(
        &self,
        format: &EpisodeFormat,
        mut conversation: Conversation,
        ids: &[u32],
    ) -> bool {
        if self.segment_turns == 0 || format.chat_format().is_none() {
            return false;
        }
        let unclosed = conversation.assistant_turns() < self.turns_finished;
        let last: &[u32] = if unclosed { &self.last_generated } else { &[] };
        format.finish(&mut conversation, last, ids)
    }

    /// The footer for `termination` with the checker's `verdict` (none when the episode is
    /// not scored), and whether the template renders the episode otherwise.
    pub fn footer(
        &self,
        format: &EpisodeFormat,
        termination: Termination,
        verdict: Option<&Verdict>,
    ) -> TrajectoryFooter {
        let success = termination.is_scored() && verdict.is_some_and(Verdict::passed);
        let template_divergent = self.template_divergent(format);
        TrajectoryFooter {
            template_divergent,
            outcome_reward: if success { 1.0 } else { 0.0 },
            success,
            termination,
            step_count: self.steps_out,
            token_count: self.tokens_out,
            generated_token_count: self.generated_out,
            wall_ms: self.started.elapsed().as_millis() as u64,
            finished_unix_ms: unix_ms(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A turn split into pieces hands each piece the rows of its own tokens; in the
    /// trajectory's first turn the first token has none, so every later piece's rows start
    /// one earlier.
    #[test]
    fn each_piece_of_a_long_turn_gets_its_tokens_rows() {
        // 7 tokens, 2 bytes per row, pieces of 3 tokens.
        let later: Vec<u8> = (0..14).collect();
        let pieces = |routes: &[u8], off| {
            [0..3, 3..6, 6..7]
                .map(|r| piece_routes(routes, 2, r, off).to_vec())
                .to_vec()
        };
        assert_eq!(
            pieces(&later, 0),
            vec![(0..6).collect::<Vec<u8>>(), (6..12).collect(), vec![12, 13]]
        );
        // The first turn: 6 rows for 7 tokens, none for token 0.
        let first: Vec<u8> = (0..12).collect();
        assert_eq!(
            pieces(&first, 1),
            vec![(0..4).collect::<Vec<u8>>(), (4..10).collect(), vec![10, 11]]
        );
        assert!(piece_routes(&[], 0, 0..5, 1).is_empty());
    }
}
