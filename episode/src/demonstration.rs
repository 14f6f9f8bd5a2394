//! Oracle demonstrations: a task's oracle plan run in the real sandbox and laid out in the
//! episode format, so demonstrations for SFT carry exactly the tool output an actor would
//! see, with [`Mistakes`] injected so that they also teach recovery.

use std::collections::BTreeMap;

use crate::fold::{self, FoldedTurn};
use crate::format::{EpisodeFormat, FormatError};
use crate::transcript::Conversation;
use corvid_proto::{ContextFold, Fold, Step, ToolCall, ToolStatus};
use corvid_tasks::{
    score_turns, Episode, OracleStep, ScoredTurn, SplitMix64, TaskEnv, TaskInstance, TasksError,
    Verdict,
};

/// Why a demonstration could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DemonstrationError {
    /// The task could not start or run.
    #[error(transparent)]
    Tasks(#[from] TasksError),
    /// The episode format could not lay it out (a model's template or tokenizer failed).
    #[error("laying out the demonstration: {0}")]
    Format(#[from] FormatError),
}

/// A demonstration: the oracle episode in the token format, and whether it passed.
#[derive(Debug, Clone)]
pub struct Demonstration {
    /// One step per turn, generated tokens with log-prob 0 and policy version 0.
    pub steps: Vec<Step>,
    /// The checker's verdict on the final state.
    pub verdict: Verdict,
}

impl Demonstration {
    /// All token ids and the loss mask (true on the calls the policy must learn to write).
    pub fn flatten(&self) -> (Vec<u32>, Vec<bool>) {
        let ids = self.steps.iter().flat_map(|s| s.token_ids.iter().copied());
        let mask = self.steps.iter().flat_map(|s| s.loss_mask.iter().copied());
        (ids.collect(), mask.collect())
    }

    /// [`flatten`](Self::flatten) per context segment: what the policy sees at once, one
    /// sequence for a demonstration that does not fold.
    pub fn flatten_segments(&self) -> Vec<(Vec<u32>, Vec<bool>)> {
        corvid_proto::step_segments(&self.steps)
            .into_iter()
            .map(|r| {
                let steps = &self.steps[r];
                let ids = steps.iter().flat_map(|s| s.token_ids.iter().copied());
                let mask = steps.iter().flat_map(|s| s.loss_mask.iter().copied());
                (ids.collect(), mask.collect())
            })
            .collect()
    }

    /// Total tokens.
    pub fn len(&self) -> usize {
        self.steps.iter().map(|s| s.token_ids.len()).sum()
    }

    /// Whether there are no tokens at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Mistakes injected into a demonstration so that it teaches recovery. Before each oracle
/// call (the final `answer` included), with probability `rate`, the demonstration first makes
/// a mistake and reads the real error it gets back:
///
/// - a **mistyped path**: the call with one character of its `path` argument changed, for
///   `read_file` and `list_dir` only (they change nothing in the workspace), executed in the
///   sandbox, so the policy reads the real `not_found` error;
/// - a **broken call**: the call's JSON cut short and closed with `</tool_call>`, answered
///   with the parse error an actor answers it with.
///
/// A mistake's tokens are context, not targets (loss mask 0): the policy learns to read an
/// error and recover, not to make the mistake. Mistakes stop where they would push the
/// episode past the task's `max_turns`, and a tool is mistyped only while its call limit
/// leaves room for the oracle's own calls. A demonstration whose mistakes take it past the
/// task's context budget (an actor's episode would end there) is the oracle's instead. With
/// `rate = 0` the demonstration is the oracle's.
///
/// With `reread`, the recovery from a mistyped `read_file` path first reads again the file
/// the path was copied from (the oracle's previous `read_file`, learnt), so the path is
/// copied from the latest tool result, not from two turns back past the error message; where
/// the turns or the call limit leave no room for it, or the path came from the prompt, the
/// recovery is the plain retry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mistakes {
    /// Chance of a mistake before each call, in `[0, 1)`.
    pub rate: f64,
    /// Seed of the choices (where, which kind, which character).
    pub seed: u64,
    /// Recover from a mistyped `read_file` by reading its source file again first.
    pub reread: bool,
}

impl Mistakes {
    /// No mistakes: the oracle's own episode.
    pub const NONE: Mistakes = Mistakes {
        rate: 0.0,
        seed: 0,
        reread: false,
    };
}

/// Tools whose mistyped call is harmless to run: they only read.
const MISTYPABLE_TOOLS: [&str; 2] = ["read_file", "list_dir"];

/// Runs `task`'s oracle plan (its calls, then `answer`) in a fresh workspace of `env`'s
/// sandbox and lays it out in `format`, with each turn's tool result and process reward.
pub fn oracle_steps(
    format: &EpisodeFormat,
    env: &TaskEnv,
    task: &TaskInstance,
) -> Result<Demonstration, DemonstrationError> {
    oracle_steps_with(format, env, task, Mistakes::NONE)
}

/// [`oracle_steps`] with `mistakes` injected before the oracle's calls.
pub fn oracle_steps_with(
    format: &EpisodeFormat,
    env: &TaskEnv,
    task: &TaskInstance,
    mistakes: Mistakes,
) -> Result<Demonstration, DemonstrationError> {
    Ok(run_oracle(format, env, task, mistakes, None)?.0)
}

/// [`oracle_steps_with`] laid out as an actor folds it under `context`, its turns taking at
/// most `max_new` tokens: when a turn's result and a whole turn would not fit the segment,
/// the next segment opens with the prompt, the memory and the latest turns
/// ([`fold::rebuild`]); every step records its segment. Under `notes` the memory is the
/// notes file as the demonstration's `write_file` calls left it. A `summary` fold needs a
/// summary the oracle does not write: its demonstrations, like those of `none`, do not fold.
pub fn oracle_steps_folded(
    format: &EpisodeFormat,
    env: &TaskEnv,
    task: &TaskInstance,
    mistakes: Mistakes,
    (context, max_new): (&ContextFold, usize),
) -> Result<Demonstration, DemonstrationError> {
    if matches!(context.fold, Fold::None | Fold::Summary) {
        return oracle_steps_with(format, env, task, mistakes);
    }
    let notes = (context.fold == Fold::Notes).then_some(context.notes_path.as_str());
    let (demo, turns) = run_oracle(format, env, task, mistakes, notes)?;
    let base = format.conversation(env, task);
    let limits = Limits {
        window: (context.window_tokens as usize).min(task.context_budget as usize),
        budget: task.context_budget as usize,
        max_new,
    };
    let steps = fold_steps(format, &base, demo.steps, &turns, context, limits)?;
    Ok(Demonstration { steps, ..demo })
}

/// A folding episode's limits, as the actor applies them: the window (at most the task's
/// budget), the episode's budget over its segments, and the room a turn needs.
struct Limits {
    window: usize,
    budget: usize,
    max_new: usize,
}

/// A turn of the oracle's run: what it generated, the text answering it, and the notes file's
/// text after it (a `notes` fold reads it as an actor does).
struct OracleTurn {
    turn: FoldedTurn,
    notes: String,
}

/// `steps` (one per turn, `turns[t]` the ids turn `t` generated, the text answering them and
/// the notes after it) laid out again from `base`, folding as the actor does
/// (`actor/src/episode.rs`, `queue_context`): when the segment, the turn's result and the room
/// the next turn needs (`max_new`, or the oracle's next turn when longer) pass the window, the
/// next segment opens as [`fold::rebuild`] lays it out, if that leaves room for a turn in the
/// window and in the budget.
fn fold_steps(
    format: &EpisodeFormat,
    base: &Conversation,
    steps: Vec<Step>,
    turns: &[OracleTurn],
    context: &ContextFold,
    limits: Limits,
) -> Result<Vec<Step>, FormatError> {
    if steps.len() != turns.len() {
        return Err(FormatError::Config {
            file: "demonstration".into(),
            problem: format!("{} steps but {} turns recorded", steps.len(), turns.len()),
        });
    }
    let Limits {
        window,
        budget,
        max_new,
    } = limits;
    let mut conversation = base.clone();
    let mut next = format.prompt_ids(&conversation)?;
    let prompt_len = next.len();
    let (mut used, mut spent, mut segment) = (0, 0, 0);
    let mut kept: Vec<FoldedTurn> = Vec::new();
    let mut out = Vec::with_capacity(steps.len());
    let last = steps.len().saturating_sub(1);
    for (t, (mut step, turn)) in steps.into_iter().zip(turns).enumerate() {
        let generated = &turn.turn.generated;
        let from = step.loss_mask.len().checked_sub(generated.len());
        let learnt = from.map_or_else(Vec::new, |from| step.loss_mask[from..].to_vec());
        let ctx = std::mem::take(&mut next);
        used += ctx.len() + generated.len();
        step.loss_mask = vec![false; ctx.len()];
        step.loss_mask.extend(learnt);
        step.loss_mask.resize(ctx.len() + generated.len(), false);
        step.token_ids = ctx;
        step.token_ids.extend_from_slice(generated);
        step.logprobs = vec![0.0; step.token_ids.len()];
        step.segment = segment;
        out.push(step);
        if t == last {
            break;
        }
        kept.push(turn.turn.clone());
        let ids = format.result_ids(&mut conversation, generated, &turn.turn.result)?;
        let room = max_new.max(turns[t + 1].turn.generated.len());
        if used + ids.len() + room > window {
            let memory = (context.fold == Fold::Notes && !turn.notes.is_empty())
                .then(|| format.cut_to_tokens(&turn.notes, context.memory_tokens as usize));
            let (seg, keep) = fold::rebuild(
                format,
                base,
                context.fold,
                memory.as_deref(),
                &kept,
                prompt_len,
                window / 2,
            )?;
            let fits = seg.ids.len() + room;
            if fits <= window && spent + used + fits <= budget {
                kept.drain(..kept.len() - keep);
                conversation = seg.conversation;
                next = seg.ids;
                segment += 1;
                spent += used;
                used = 0;
                continue;
            }
        }
        next = ids;
    }
    Ok(out)
}

/// The oracle's episode and, per step, the ids it generated, the text that answered them and,
/// when `notes` names a workspace file, that file's text after the step (empty when missing).
fn run_oracle(
    format: &EpisodeFormat,
    env: &TaskEnv,
    task: &TaskInstance,
    mistakes: Mistakes,
    notes: Option<&str>,
) -> Result<(Demonstration, Vec<OracleTurn>), DemonstrationError> {
    let mut ep = Episode::start(env, task)?;
    let mut turns: Vec<OracleTurn> = Vec::new();
    let calls: Vec<OracleStep> = task
        .oracle
        .steps
        .iter()
        .cloned()
        .chain(std::iter::once(task.oracle.answer_step()))
        .collect();
    let mut spare_turns = (task.max_turns as usize).saturating_sub(calls.len());
    // Calls each tool may still take beyond the oracle's own, so that no mistyped call makes
    // the task refuse a later oracle call.
    let mut spare_calls: BTreeMap<&str, u32> = BTreeMap::new();
    for spec in &task.tools {
        if let Some(max) = spec.limits.max_calls {
            let used = calls.iter().filter(|c| c.name == spec.name).count() as u32;
            spare_calls.insert(&spec.name, max.saturating_sub(used));
        }
    }
    let mut rng = SplitMix64::derive(mistakes.seed, &format!("mistakes/{}", task.id));
    let mut steps = Vec::with_capacity(calls.len() + 1);
    let mut conversation = format.conversation(env, task);
    let mut context = format.prompt_ids(&conversation)?;
    // The oracle's latest `read_file`: where the next path was copied from.
    let mut source: Option<&OracleStep> = None;
    for call in &calls {
        if spare_turns > 0 && mistakes.rate > 0.0 && rng.next_f64() < mistakes.rate {
            let wrong =
                mistyped(task, call, &mut rng).filter(|_| has_spare(&spare_calls, &call.name));
            let mistake = match wrong {
                Some(wrong) if rng.below(2) == 0 => {
                    take_spare(&mut spare_calls, &call.name);
                    Some(call_step(
                        (format, notes),
                        &mut turns,
                        &mut ep,
                        (steps.len(), &mut conversation),
                        &mut context,
                        &wrong,
                        false,
                    )?)
                }
                _ => {
                    let generated = broken(format, call, &mut rng)?;
                    // A strict prefix of a JSON object never parses; were it to, no mistake.
                    match format.parse_call(&generated) {
                        Ok(_) => None,
                        Err(err) => {
                            let mut step = demo_step(steps.len(), &mut context, &generated, false);
                            step.process_reward = invalid_call_reward(task) as f32;
                            let result = format.parse_error_text(&err);
                            context = format.result_ids(&mut conversation, &generated, &result)?;
                            let notes = turns.last().map(|t| t.notes.clone()).unwrap_or_default();
                            turns.push(OracleTurn {
                                turn: FoldedTurn { generated, result },
                                notes,
                            });
                            Some(step)
                        }
                    }
                }
            };
            if let Some(step) = mistake {
                spare_turns -= 1;
                let mistyped_read = step
                    .tool_call
                    .as_ref()
                    .is_some_and(|c| c.name == "read_file");
                steps.push(step);
                if let Some(src) = source.filter(|_| {
                    mistakes.reread
                        && mistyped_read
                        && spare_turns > 0
                        && has_spare(&spare_calls, "read_file")
                }) {
                    take_spare(&mut spare_calls, "read_file");
                    spare_turns -= 1;
                    let step = call_step(
                        (format, notes),
                        &mut turns,
                        &mut ep,
                        (steps.len(), &mut conversation),
                        &mut context,
                        src,
                        true,
                    )?;
                    steps.push(step);
                }
            }
        }
        let step = call_step(
            (format, notes),
            &mut turns,
            &mut ep,
            (steps.len(), &mut conversation),
            &mut context,
            call,
            true,
        )?;
        let read_ok = step
            .tool_result
            .as_ref()
            .is_some_and(|r| r.status.is_success());
        if call.name == "read_file" && read_ok {
            source = Some(call);
        }
        steps.push(step);
    }
    let verdict = ep.check();
    let demo = Demonstration { steps, verdict };
    let budget = task.context_budget as usize;
    if mistakes.rate > 0.0 && budget > 0 && demo.len() > budget {
        return run_oracle(format, env, task, Mistakes::NONE, notes);
    }
    Ok((demo, turns))
}

/// Whether `tool` may take one more call than the oracle's own (`spare_calls` holds only
/// the tools with a call limit).
fn has_spare(spare_calls: &BTreeMap<&str, u32>, tool: &str) -> bool {
    spare_calls.get(tool) != Some(&0)
}

/// Spends one of `tool`'s spare calls, if it has a limit.
fn take_spare(spare_calls: &mut BTreeMap<&str, u32>, tool: &str) {
    if let Some(n) = spare_calls.get_mut(tool) {
        *n -= 1;
    }
}

/// Demonstration turn `turn` (of the episode built from `conversation`) that writes `call`
/// and runs it in `ep`, learnt from iff `learn`; `context` becomes the next turn's (the
/// call's result).
fn call_step(
    (format, notes): (&EpisodeFormat, Option<&str>),
    turns: &mut Vec<OracleTurn>,
    ep: &mut Episode<'_>,
    (turn, conversation): (usize, &mut Conversation),
    context: &mut Vec<u32>,
    call: &OracleStep,
    learn: bool,
) -> Result<Step, FormatError> {
    let generated = format.call_ids(&call.name, &call.arguments)?;
    let out = ep.call(&call.tool_call());
    let mut step = demo_step(turn, context, &generated, learn);
    step.tool_call = Some(call.tool_call());
    step.tool_result = Some(out.result);
    step.process_reward = ep.last_process_reward() as f32;
    *context = format.result_ids(conversation, &generated, &out.text)?;
    let notes = notes
        .map(|path| String::from_utf8_lossy(&ep.read_file(path).unwrap_or_default()).into_owned())
        .unwrap_or_default();
    turns.push(OracleTurn {
        turn: FoldedTurn {
            generated,
            result: out.text,
        },
        notes,
    });
    Ok(step)
}

/// Demonstration turn `turn`: `context` (taken) then `generated`, learnt from iff `learn`.
pub(crate) fn demo_step(
    turn: usize,
    context: &mut Vec<u32>,
    generated: &[u32],
    learn: bool,
) -> Step {
    let n = context.len() + generated.len();
    let mut loss_mask = vec![false; context.len()];
    loss_mask.extend(std::iter::repeat_n(learn, generated.len()));
    let mut token_ids = std::mem::take(context);
    token_ids.extend_from_slice(generated);
    Step {
        turn: turn as u32,
        loss_mask,
        logprobs: vec![0.0; n],
        policy_version: 0,
        token_ids,
        tool_call: None,
        tool_result: None,
        process_reward: 0.0,
        timings: Default::default(),
        routes: Vec::new(),
        segment: 0,
    }
}

/// What `task`'s process rules give a turn that is not a well-formed call (no call ran): the
/// process reward of a malformed turn, for actors and demonstrations alike.
pub fn invalid_call_reward(task: &TaskInstance) -> f64 {
    let none = ToolCall {
        name: String::new(),
        arguments_json: String::new(),
    };
    let turn = ScoredTurn {
        call: &none,
        status: ToolStatus::InvalidCall,
    };
    score_turns(&task.process_rules, &[turn])
        .last()
        .copied()
        .unwrap_or(0.0)
}

/// `call` with one character of its `path` changed (a letter for a letter, anything else
/// for a digit), or `None` if it is not a call to a [`MISTYPABLE_TOOLS`] tool with a path,
/// or the changed path names one of the task's files (it would not fail).
fn mistyped(task: &TaskInstance, call: &OracleStep, rng: &mut SplitMix64) -> Option<OracleStep> {
    if !MISTYPABLE_TOOLS.contains(&call.name.as_str()) {
        return None;
    }
    let path: Vec<char> = call.arguments.get("path")?.as_str()?.chars().collect();
    if path.is_empty() {
        return None;
    }
    let mut wrong = path.clone();
    let at = rng.below(path.len() as u64) as usize;
    wrong[at] = loop {
        let c = if path[at].is_ascii_alphabetic() {
            (b'a' + rng.below(26) as u8) as char
        } else {
            (b'0' + rng.below(10) as u8) as char
        };
        if c != path[at] {
            break c;
        }
    };
    let wrong: String = wrong.into_iter().collect();
    if task.files.contains_key(&wrong) {
        return None;
    }
    let mut arguments = call.arguments.clone();
    arguments["path"] = serde_json::Value::String(wrong);
    Some(OracleStep {
        arguments,
        ..call.clone()
    })
}

/// `call`'s generated tokens cut somewhere inside its JSON body and closed as a call is: a
/// call that does not parse (the body is a strict, non-empty prefix of a JSON object).
fn broken(
    format: &EpisodeFormat,
    call: &OracleStep,
    rng: &mut SplitMix64,
) -> Result<Vec<u32>, FormatError> {
    format.broken_call_ids(&call.name, &call.arguments, |n| {
        1 + rng.below(n.saturating_sub(1).max(1) as u64) as usize
    })
}
