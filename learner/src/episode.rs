//! The episode token format: how a task, the policy's turns and the tools' results become
//! exact token ids. The actor generates with it and the trainers learn from it, so this is
//! the one place the layout is written down.
//!
//! An episode is a sequence of [`Step`]s, one per turn. Step `t` holds, in order:
//!
//! ```text
//! turn 0:  <|system|>{tools}<|end|><|user|>{prompt}<|end|><|assistant|>   context (mask 0)
//! turn t>0: [<|end|>]<|tool|>{result of call t-1}<|end|><|assistant|>     context (mask 0)
//! then:     <tool_call>{"name":…,"arguments":{…}}</tool_call>              generated (mask 1)
//! ```
//!
//! Generation stops at `</tool_call>` or `<|end|>`. When it stopped at `</tool_call>`, the
//! next turn's context starts with the `<|end|>` that closes the assistant turn, so the
//! policy never has to learn to emit it. Concatenating every step's tokens gives the exact
//! sequence the policy saw; nothing is ever decoded and re-tokenised.
//!
//! [`oracle_steps`] runs a task's oracle plan in the real sandbox and lays it out in this
//! format, so demonstrations for SFT carry exactly the tool output an actor would see.

use std::collections::BTreeMap;

use corvid_proto::{Step, ToolCall, ToolStatus};
use corvid_tasks::{
    score_turns, Episode, OracleStep, ScoredTurn, SplitMix64, TaskEnv, TaskInstance, TasksError,
    Verdict,
};
use serde::{Deserialize, Serialize};

use crate::tokenizer::{ByteTokenizer, Special};

/// How the tools are described in the system turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolPrompt {
    /// One short line per tool, `name(arg, optional_arg?)`: a few dozen bytes, for small
    /// byte-level policies whose every byte is a token.
    #[default]
    Compact,
    /// The OpenAI-style JSON declarations, as larger chat models expect.
    Json,
}

/// Builds and parses episode token sequences.
#[derive(Debug, Clone, Default)]
pub struct EpisodeFormat {
    tok: ByteTokenizer,
    tool_prompt: ToolPrompt,
}

/// Why the generated tokens of a turn are not a well-formed tool call. The message is what
/// the policy reads back in the tool turn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallParseError {
    /// The turn ended without `<tool_call>`.
    #[error(
        "no tool call: write <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>"
    )]
    NoCall,
    /// `<tool_call>` was opened but never closed within the turn's token budget.
    #[error("the tool call was not closed with </tool_call>")]
    Unclosed,
    /// The call body is not a JSON object.
    #[error("the tool call is not valid JSON: {0}")]
    Json(String),
    /// The object lacks a string `name`.
    #[error("the tool call needs a string \"name\"")]
    MissingName,
    /// `arguments` is neither absent nor an object (nor a string holding one).
    #[error("\"arguments\" must be a JSON object")]
    ArgumentsNotObject,
}

impl EpisodeFormat {
    /// A format with the given tool description style.
    pub fn new(tool_prompt: ToolPrompt) -> Self {
        Self {
            tok: ByteTokenizer::new(),
            tool_prompt,
        }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &ByteTokenizer {
        &self.tok
    }

    /// Token ids that end a generated turn.
    pub fn stop_ids(&self) -> [u32; 2] {
        [Special::ToolCallClose.id(), Special::End.id()]
    }

    /// The system turn's text: the tools the task allows and how to call them.
    pub fn system_text(&self, env: &TaskEnv, task: &TaskInstance) -> String {
        // The task's tools in its order, a pack's own WASI tools included; if one of those
        // cannot be compiled, the sandbox's built-ins (the call itself will report it).
        let names: Vec<&str> = task.tools.iter().map(|t| t.name.as_str()).collect();
        let decls = env.tool_declarations(task).unwrap_or_else(|e| {
            tracing::warn!(task = %task.id, "task tool declarations: {e}; listing the built-ins");
            env.sandbox().tool_declarations(Some(&names))
        });
        match self.tool_prompt {
            ToolPrompt::Json => format!(
                "You can call these tools, one per turn, as <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>:\n{decls}"
            ),
            ToolPrompt::Compact => {
                let mut lines = Vec::new();
                for d in decls.as_array().into_iter().flatten() {
                    let f = &d["function"];
                    let name = f["name"].as_str().unwrap_or_default();
                    let required: Vec<&str> = f["parameters"]["required"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str())
                        .collect();
                    // Required parameters in declaration order, then the optional ones.
                    let mut params: Vec<String> = required.iter().map(|p| p.to_string()).collect();
                    params.extend(
                        f["parameters"]["properties"]
                            .as_object()
                            .into_iter()
                            .flatten()
                            .filter(|(p, _)| !required.contains(&p.as_str()))
                            .map(|(p, _)| format!("{p}?")),
                    );
                    lines.push(format!("{name}({})", params.join(", ")));
                }
                format!("tools: {}", lines.join(" "))
            }
        }
    }

    /// Turn 0's context: system turn, user turn, and the assistant header.
    pub fn prompt_ids(&self, env: &TaskEnv, task: &TaskInstance) -> Vec<u32> {
        let mut ids = vec![Special::System.id()];
        ids.extend(self.tok.encode_plain(&self.system_text(env, task)));
        ids.push(Special::End.id());
        ids.push(Special::User.id());
        ids.extend(self.tok.encode_plain(&task.prompt));
        ids.push(Special::End.id());
        ids.push(Special::Assistant.id());
        ids
    }

    /// The context that opens turn `t > 0`: the tool's result and the next assistant header.
    /// `closed_by_call`: the previous turn stopped at `</tool_call>` (so its `<|end|>` comes
    /// first).
    pub fn result_ids(&self, closed_by_call: bool, text: &str) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len() + 4);
        if closed_by_call {
            ids.push(Special::End.id());
        }
        ids.push(Special::Tool.id());
        ids.extend(self.tok.encode_plain(text));
        ids.push(Special::End.id());
        ids.push(Special::Assistant.id());
        ids
    }

    /// The tokens a policy generates for `call`: `<tool_call>{json}</tool_call>`.
    pub fn call_ids(&self, name: &str, arguments: &serde_json::Value) -> Vec<u32> {
        // Name first, so the policy picks the tool before writing its arguments.
        let body = format!(
            "{{\"name\":{},\"arguments\":{arguments}}}",
            serde_json::Value::String(name.to_string())
        );
        let mut ids = vec![Special::ToolCallOpen.id()];
        ids.extend(self.tok.encode_plain(&body));
        ids.push(Special::ToolCallClose.id());
        ids
    }

    /// Whether a generated turn stopped at `</tool_call>`.
    pub fn closed_by_call(&self, generated: &[u32]) -> bool {
        generated.last() == Some(&Special::ToolCallClose.id())
    }

    /// Parses a generated turn into a tool call. Text before `<tool_call>` is allowed (and
    /// ignored); the call body is JSON `{"name": "...", "arguments": {...}}`, where
    /// `arguments` may also be a string holding the object, or absent (`{}`).
    pub fn parse_call(&self, generated: &[u32]) -> Result<ToolCall, CallParseError> {
        let open = Special::ToolCallOpen.id();
        let close = Special::ToolCallClose.id();
        let start = generated
            .iter()
            .position(|&t| t == open)
            .ok_or(CallParseError::NoCall)?;
        let body = &generated[start + 1..];
        let end = body
            .iter()
            .position(|&t| t == close)
            .ok_or(CallParseError::Unclosed)?;
        let text = String::from_utf8_lossy(&self.tok.decode_bytes(&body[..end])).into_owned();
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| CallParseError::Json(e.to_string()))?;
        let name = v
            .get("name")
            .and_then(|n| n.as_str())
            .ok_or(CallParseError::MissingName)?;
        let arguments_json = match v.get("arguments") {
            None | Some(serde_json::Value::Null) => "{}".to_string(),
            Some(a @ serde_json::Value::Object(_)) => a.to_string(),
            Some(serde_json::Value::String(s)) => match serde_json::from_str(s) {
                Ok(serde_json::Value::Object(_)) => s.clone(),
                _ => return Err(CallParseError::ArgumentsNotObject),
            },
            Some(_) => return Err(CallParseError::ArgumentsNotObject),
        };
        Ok(ToolCall {
            name: name.to_string(),
            arguments_json,
        })
    }

    /// The text the policy reads back for a malformed turn.
    pub fn parse_error_text(&self, err: &CallParseError) -> String {
        format!("error: {}: {err}", ToolStatus::InvalidCall)
    }
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
) -> Result<Demonstration, TasksError> {
    oracle_steps_with(format, env, task, Mistakes::NONE)
}

/// [`oracle_steps`] with `mistakes` injected before the oracle's calls.
pub fn oracle_steps_with(
    format: &EpisodeFormat,
    env: &TaskEnv,
    task: &TaskInstance,
    mistakes: Mistakes,
) -> Result<Demonstration, TasksError> {
    let mut ep = Episode::start(env, task)?;
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
    let mut context = format.prompt_ids(env, task);
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
                        format,
                        &mut ep,
                        steps.len(),
                        &mut context,
                        &wrong,
                        false,
                    ))
                }
                _ => {
                    let generated = broken(format, call, &mut rng);
                    // A strict prefix of a JSON object never parses; were it to, no mistake.
                    format.parse_call(&generated).err().map(|err| {
                        let mut step = demo_step(steps.len(), &mut context, &generated, false);
                        step.process_reward = invalid_call_reward(task) as f32;
                        context = format.result_ids(true, &format.parse_error_text(&err));
                        step
                    })
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
                    let step = call_step(format, &mut ep, steps.len(), &mut context, src, true);
                    steps.push(step);
                }
            }
        }
        let step = call_step(format, &mut ep, steps.len(), &mut context, call, true);
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
        return oracle_steps_with(format, env, task, Mistakes::NONE);
    }
    Ok(demo)
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

/// Demonstration turn `turn` that writes `call` and runs it in `ep`, learnt from iff
/// `learn`; `context` becomes the next turn's (the call's result).
fn call_step(
    format: &EpisodeFormat,
    ep: &mut Episode<'_>,
    turn: usize,
    context: &mut Vec<u32>,
    call: &OracleStep,
    learn: bool,
) -> Step {
    let generated = format.call_ids(&call.name, &call.arguments);
    let out = ep.call(&call.tool_call());
    let mut step = demo_step(turn, context, &generated, learn);
    step.tool_call = Some(call.tool_call());
    step.tool_result = Some(out.result);
    step.process_reward = ep.last_process_reward() as f32;
    *context = format.result_ids(true, &out.text);
    step
}

/// Demonstration turn `turn`: `context` (taken) then `generated`, learnt from iff `learn`.
fn demo_step(turn: usize, context: &mut Vec<u32>, generated: &[u32], learn: bool) -> Step {
    let n = context.len() + generated.len();
    let mut loss_mask = vec![false; context.len()];
    loss_mask.extend(std::iter::repeat_n(learn, generated.len()));
    let mut token_ids = std::mem::take(context);
    token_ids.extend_from_slice(generated);
    Step {
        turn: turn as u32,
        loss_mask,
        logprobs: vec![0.0; n],
        policy_versions: vec![0; n],
        token_ids,
        tool_call: None,
        tool_result: None,
        process_reward: 0.0,
        timings: Default::default(),
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

/// `call`'s generated tokens cut somewhere inside its JSON body and closed with
/// `</tool_call>`: a call that does not parse.
fn broken(format: &EpisodeFormat, call: &OracleStep, rng: &mut SplitMix64) -> Vec<u32> {
    let whole = format.call_ids(&call.name, &call.arguments);
    // [<tool_call>, body..., </tool_call>]: keep the open tag and 1..len(body)-1 body tokens,
    // so the body is a strict, non-empty prefix of a JSON object and never parses.
    let body = whole.len() - 2;
    let keep = 1 + rng.below(body.saturating_sub(1).max(1) as u64) as usize;
    let mut ids = whole[..1 + keep].to_vec();
    ids.push(Special::ToolCallClose.id());
    ids
}

/// One message of an OpenAI-style chat transcript, the interchange format of
/// `corvid replay export --format chat` and of SFT imports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text (for an assistant turn that only calls a tool: empty).
    #[serde(default)]
    pub content: String,
    /// The assistant's tool calls (at most one per turn in Corvid).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ChatToolCall>,
    /// On a `tool` message: the `id` of the call it answers (always set on export, where
    /// the environment's answer to a malformed turn is a `user` message; ignored on import).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// A tool call inside a [`ChatMessage`]: `{"type": "function", "function": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatToolCall {
    /// The call's id, which the `tool` message answering it names (`call_<n>` on export, n the step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Always `function`.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// The call.
    pub function: ChatFunction,
}

fn function_type() -> String {
    "function".into()
}

/// Name and JSON-string arguments of a call, as OpenAI writes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatFunction {
    /// Tool name.
    pub name: String,
    /// The arguments as a JSON string, exactly as the model wrote them.
    pub arguments: String,
}

/// Why a chat transcript cannot be laid out as an episode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranscriptError {
    /// A role other than system, user, assistant, tool.
    #[error("message {index}: unknown role {role:?} (use system, user, assistant or tool)")]
    UnknownRole {
        /// Message index.
        index: usize,
        /// The role given.
        role: String,
    },
    /// More than one tool call in an assistant message.
    #[error("message {index}: {n} tool calls in one assistant turn; Corvid makes one per turn")]
    SeveralCalls {
        /// Message index.
        index: usize,
        /// How many.
        n: usize,
    },
    /// A call's arguments are not a JSON object.
    #[error("message {index}: tool call arguments are not a JSON object: {message}")]
    Arguments {
        /// Message index.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// No assistant turn: nothing to train on.
    #[error("the transcript has no assistant message")]
    NoAssistant,
}

impl EpisodeFormat {
    /// Reads an episode's steps back as an OpenAI-style chat transcript, valid for the
    /// chat format other SFT tools expect:
    ///
    /// - turn 0's context gives the `system` and `user` messages, and each turn's generated
    ///   tokens an `assistant` message;
    /// - a turn whose call parses is an assistant message carrying it in `tool_calls` (id
    ///   `call_<n>`, `n` the step), with the text it wrote before `<tool_call>` as `content`;
    ///   the tool output that opens the next turn is the `tool` message answering it
    ///   (`tool_call_id = call_<n>`), right after it;
    /// - a malformed turn (no call, an unclosed one, bad JSON, …) is an assistant message
    ///   without `tool_calls`, whose `content` is what the policy wrote; the error the
    ///   environment answered it with (`error: invalid_call: …`) is a `user` message, since a
    ///   `tool` message may only answer a call of the assistant message before it;
    /// - `content` is plain text: Corvid's special tokens (`<|assistant|>`, `<tool_call>`,
    ///   `</tool_call>`, `<|end|>`, …) are the layout that roles and `tool_calls` stand for,
    ///   and are left out, so an assistant message never holds them (a malformed call keeps
    ///   its JSON text, without the tags). The system, user and tool messages are exactly
    ///   the text the policy read, which may spell a tag as plain text (the call syntax that
    ///   the system turn and a parse error show);
    /// - the episode's last call (the `answer` that ends it, or a call cut off by the turn or
    ///   context limit) has no `tool` reply: no turn read its result (the verdict is the
    ///   export's `success` and `reward`). A transcript that ends with an assistant message
    ///   with `tool_calls` is the shape of OpenAI's function-calling fine-tuning examples.
    ///
    /// [`from_messages`](Self::from_messages) lays a transcript of well-formed turns out as
    /// the episode's exact tokens; one with a malformed turn comes back different (its error
    /// is a user turn, and the special tokens it wrote are gone): `--format raw` keeps those.
    pub fn to_messages(&self, steps: &[Step]) -> Vec<ChatMessage> {
        let mut out = Vec::new();
        // The call of the latest assistant message, until the tool message answering it.
        let mut unanswered: Option<String> = None;
        for (n, (token_ids, loss_mask)) in joined_turns(steps).iter().enumerate() {
            let first_gen = loss_mask.iter().position(|m| *m).unwrap_or(token_ids.len());
            let mut context = Vec::new();
            self.context_messages(&token_ids[..first_gen], &mut context);
            for mut m in context {
                if m.role == "tool" {
                    match unanswered.take() {
                        Some(id) => m.tool_call_id = Some(id),
                        // The environment's answer to a turn that made no call.
                        None => m.role = "user".into(),
                    }
                }
                out.push(m);
            }
            let generated = &token_ids[first_gen..];
            if generated.is_empty() {
                continue;
            }
            let message = match self.parse_call(generated) {
                Ok(c) => {
                    let open = Special::ToolCallOpen.id();
                    let text_end = generated
                        .iter()
                        .position(|&t| t == open)
                        .unwrap_or(generated.len());
                    let id = format!("call_{n}");
                    unanswered = Some(id.clone());
                    ChatMessage {
                        role: "assistant".into(),
                        content: self.plain_text(&generated[..text_end]),
                        tool_calls: vec![ChatToolCall {
                            id: Some(id),
                            kind: function_type(),
                            function: ChatFunction {
                                name: c.name,
                                arguments: c.arguments_json,
                            },
                        }],
                        tool_call_id: None,
                    }
                }
                // A malformed turn: what the policy wrote, as text.
                Err(_) => {
                    unanswered = None;
                    ChatMessage {
                        role: "assistant".into(),
                        content: self.plain_text(generated),
                        tool_calls: Vec::new(),
                        tool_call_id: None,
                    }
                }
            };
            out.push(message);
        }
        out
    }

    /// The text of `ids` without Corvid's special tokens.
    fn plain_text(&self, ids: &[u32]) -> String {
        let plain: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&t| Special::from_id(t).is_none())
            .collect();
        self.tok.decode(&plain)
    }

    fn context_messages(&self, ids: &[u32], out: &mut Vec<ChatMessage>) {
        let mut role: Option<&str> = None;
        let mut body: Vec<u32> = Vec::new();
        for &t in ids {
            let header = match Special::from_id(t) {
                Some(Special::System) => Some("system"),
                Some(Special::User) => Some("user"),
                Some(Special::Tool) => Some("tool"),
                Some(Special::Assistant) | Some(Special::End) | Some(Special::Pad) => {
                    if let Some(r) = role.take() {
                        out.push(ChatMessage {
                            role: r.into(),
                            content: self.plain_text(&body),
                            tool_calls: Vec::new(),
                            tool_call_id: None,
                        });
                    }
                    body.clear();
                    continue;
                }
                _ => None,
            };
            match header {
                Some(r) => {
                    role = Some(r);
                    body.clear();
                }
                None => body.push(t),
            }
        }
        if let Some(r) = role {
            out.push(ChatMessage {
                role: r.into(),
                content: self.plain_text(&body),
                tool_calls: Vec::new(),
                tool_call_id: None,
            });
        }
    }

    /// Lays out a chat transcript (for example an imported SFT file) in the episode format:
    /// token ids and the loss mask, true on exactly what the assistant writes — its text,
    /// its call, and `<|end|>` when it ends a turn without a call.
    pub fn from_messages(
        &self,
        messages: &[ChatMessage],
    ) -> Result<(Vec<u32>, Vec<bool>), TranscriptError> {
        let mut ids = Vec::new();
        let mut mask = Vec::new();
        let mut push = |t: &[u32], m: bool, ids: &mut Vec<u32>| {
            ids.extend_from_slice(t);
            mask.extend(std::iter::repeat_n(m, t.len()));
        };
        let mut any_assistant = false;
        for (index, m) in messages.iter().enumerate() {
            let header = match m.role.as_str() {
                "system" => Special::System,
                "user" => Special::User,
                "tool" => Special::Tool,
                "assistant" => Special::Assistant,
                other => {
                    return Err(TranscriptError::UnknownRole {
                        index,
                        role: other.to_string(),
                    })
                }
            };
            push(&[header.id()], false, &mut ids);
            if header != Special::Assistant {
                push(&self.tok.encode_plain(&m.content), false, &mut ids);
                push(&[Special::End.id()], false, &mut ids);
                continue;
            }
            any_assistant = true;
            if m.tool_calls.len() > 1 {
                return Err(TranscriptError::SeveralCalls {
                    index,
                    n: m.tool_calls.len(),
                });
            }
            push(&self.tok.encode_plain(&m.content), true, &mut ids);
            match m.tool_calls.first() {
                Some(c) => {
                    let args: serde_json::Value = serde_json::from_str(&c.function.arguments)
                        .ok()
                        .filter(serde_json::Value::is_object)
                        .ok_or_else(|| TranscriptError::Arguments {
                            index,
                            message: format!("{:?}", c.function.arguments),
                        })?;
                    push(&self.call_ids(&c.function.name, &args), true, &mut ids);
                    // The `<|end|>` after a call opens the next turn's context.
                    if index + 1 < messages.len() {
                        push(&[Special::End.id()], false, &mut ids);
                    }
                }
                None => push(&[Special::End.id()], true, &mut ids),
            }
        }
        if !any_assistant {
            return Err(TranscriptError::NoAssistant);
        }
        Ok((ids, mask))
    }
}

/// Each turn's tokens and loss mask, its steps joined: an actor splits a turn longer than its
/// step limit into several steps of the same turn index, and a transcript is read per turn.
fn joined_turns(steps: &[Step]) -> Vec<(Vec<u32>, Vec<bool>)> {
    let mut out: Vec<(u32, Vec<u32>, Vec<bool>)> = Vec::new();
    for s in steps {
        match out.last_mut() {
            Some((turn, ids, mask)) if *turn == s.turn => {
                ids.extend(&s.token_ids);
                mask.extend(&s.loss_mask);
            }
            _ => out.push((s.turn, s.token_ids.clone(), s.loss_mask.clone())),
        }
    }
    out.into_iter().map(|(_, ids, mask)| (ids, mask)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Steps laid out as an actor records them: `context` then `generated` (learnt).
    fn step(turn: usize, mut context: Vec<u32>, generated: &[u32]) -> Step {
        demo_step(turn, &mut context, generated, true)
    }

    fn prompt(f: &EpisodeFormat) -> Vec<u32> {
        let tok = f.tokenizer();
        let mut ids = vec![Special::System.id()];
        ids.extend(tok.encode_plain("tools: read_file(path) answer(answer)"));
        ids.extend([Special::End.id(), Special::User.id()]);
        ids.extend(tok.encode_plain("Find the value."));
        ids.extend([Special::End.id(), Special::Assistant.id()]);
        ids
    }

    /// What an OpenAI-style chat consumer checks: known roles; a `tool` message right after
    /// the assistant message whose call it answers, each call answered once, and every call
    /// answered except in the last message; arguments that are JSON objects; and no Corvid
    /// special-token text in what the assistant says.
    fn assert_openai_chat(messages: &[ChatMessage]) {
        let mut open: Vec<String> = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            for s in Special::ALL.into_iter().filter(|_| m.role == "assistant") {
                assert!(
                    !m.content.contains(s.text()),
                    "message {i} holds {}: {m:?}",
                    s.text()
                );
            }
            match m.role.as_str() {
                "tool" => {
                    let id = m
                        .tool_call_id
                        .as_ref()
                        .expect("a tool message names its call");
                    let at = open.iter().position(|o| o == id);
                    assert!(at.is_some(), "message {i} answers no open call: {m:?}");
                    open.retain(|o| o != id);
                }
                "system" | "user" | "assistant" => {
                    assert!(
                        open.is_empty(),
                        "message {i} leaves calls {open:?} unanswered"
                    );
                    assert!(m.tool_call_id.is_none(), "message {i}: {m:?}");
                    for c in &m.tool_calls {
                        assert_eq!(c.kind, "function");
                        let args: serde_json::Value =
                            serde_json::from_str(&c.function.arguments).expect("JSON arguments");
                        assert!(args.is_object(), "message {i}: {c:?}");
                        open.push(c.id.clone().expect("a call has an id"));
                    }
                }
                other => panic!("message {i}: role {other:?}"),
            }
        }
        // Only the last message may leave its call unanswered (the episode ended with it).
        if !open.is_empty() {
            let last = messages.last().expect("messages");
            assert_eq!(last.role, "assistant");
            assert_eq!(last.tool_calls.len(), open.len());
        }
    }

    #[test]
    fn a_well_formed_episode_exports_as_valid_chat_and_imports_back_exactly() {
        let f = EpisodeFormat::default();
        let read = f.call_ids("read_file", &json!({"path": "a.txt"}));
        let answer = f.call_ids("answer", &json!({"answer": "42"}));
        let steps = vec![
            step(0, prompt(&f), &read),
            step(1, f.result_ids(true, "value: 42"), &answer),
        ];
        let m = f.to_messages(&steps);
        assert_openai_chat(&m);
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant"]);
        assert_eq!(m[1].content, "Find the value.");
        assert_eq!(m[2].content, "");
        assert_eq!(m[2].tool_calls[0].function.name, "read_file");
        assert_eq!(m[3].tool_call_id.as_deref(), Some("call_0"));
        assert_eq!(m[3].content, "value: 42");
        // The answer ends the episode: its call is the last message, with no reply.
        assert_eq!(m[4].tool_calls[0].function.name, "answer");
        assert_eq!(m[4].tool_calls[0].id.as_deref(), Some("call_1"));
        // The JSON other tools read: tool_call_id on the tool message, none elsewhere.
        let v = serde_json::to_value(&m).expect("json");
        assert_eq!(v[3]["tool_call_id"], "call_0");
        assert!(v[2].get("tool_call_id").is_none());
        // Back to tokens: the same ids and the same trained positions.
        let (ids, mask) = f.from_messages(&m).expect("lays out");
        let want_ids: Vec<u32> = steps.iter().flat_map(|s| s.token_ids.clone()).collect();
        let want_mask: Vec<bool> = steps.iter().flat_map(|s| s.loss_mask.clone()).collect();
        assert_eq!(ids, want_ids);
        assert_eq!(mask, want_mask);
    }

    #[test]
    fn a_turn_split_over_steps_exports_as_one_turn() {
        let f = EpisodeFormat::default();
        let read = f.call_ids("read_file", &json!({"path": "a.txt"}));
        let answer = f.call_ids("answer", &json!({"answer": "42"}));
        let whole = vec![
            step(0, prompt(&f), &read),
            step(1, f.result_ids(true, "value: 42"), &answer),
        ];
        // Turn 1 split as an actor splits a long turn: part of the tool output in one step,
        // the rest, and the call, in the next (same turn index).
        let mut split = whole.clone();
        let t1 = split.pop().expect("turn 1");
        let cut = 3;
        let a = Step::context(1, t1.token_ids[..cut].to_vec());
        let mut b = t1.clone();
        b.token_ids.drain(..cut);
        b.loss_mask.drain(..cut);
        b.logprobs.drain(..cut);
        b.policy_versions.drain(..cut);
        split.extend([a, b]);
        assert_eq!(f.to_messages(&split), f.to_messages(&whole));
    }

    #[test]
    fn malformed_turns_export_as_text_answered_by_a_user_message() {
        let f = EpisodeFormat::default();
        let tok = f.tokenizer();
        let read = f.call_ids("read_file", &json!({"path": "a.txt"}));
        let answer = f.call_ids("answer", &json!({"answer": "42"}));
        // A call cut short, closed with </tool_call>: bad JSON.
        let mut cut = read[..8].to_vec();
        cut.push(Special::ToolCallClose.id());
        let cut_err = f.parse_call(&cut).expect_err("does not parse");
        // A reply with no call, with a stray turn header in it, ended by <|end|>.
        let mut chat = vec![Special::Assistant.id()];
        chat.extend(tok.encode_plain("I will read it"));
        chat.push(Special::End.id());
        let chat_err = f.parse_call(&chat).expect_err("no call");
        assert_eq!(chat_err, CallParseError::NoCall);
        let steps = vec![
            step(0, prompt(&f), &cut),
            step(1, f.result_ids(true, &f.parse_error_text(&cut_err)), &chat),
            step(
                2,
                f.result_ids(false, &f.parse_error_text(&chat_err)),
                &read,
            ),
            step(3, f.result_ids(true, "value: 42"), &answer),
        ];
        let m = f.to_messages(&steps);
        assert_openai_chat(&m);
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(
            roles,
            [
                "system",
                "user",
                "assistant",
                "user",
                "assistant",
                "user",
                "assistant",
                "tool",
                "assistant"
            ]
        );
        // The malformed turns are kept as text, without Corvid's tags.
        assert!(m[2].tool_calls.is_empty());
        assert_eq!(m[2].content, tok.decode(&read[1..8]));
        assert!(m[2].content.starts_with("{\"name\""), "{:?}", m[2].content);
        assert_eq!(m[4].content, "I will read it");
        // The environment's answers to them are user messages with its error text.
        assert_eq!(m[3].content, f.parse_error_text(&cut_err));
        assert_eq!(m[5].content, f.parse_error_text(&chat_err));
        assert!(
            m[3].content.starts_with("error: invalid_call: "),
            "{:?}",
            m[3]
        );
        assert!(m[3].tool_call_id.is_none() && m[5].tool_call_id.is_none());
        // The well-formed call after them is answered by its own id.
        assert_eq!(m[6].tool_calls[0].id.as_deref(), Some("call_2"));
        assert_eq!(m[7].tool_call_id.as_deref(), Some("call_2"));
        // The transcript imports (its malformed turns as plain assistant text).
        f.from_messages(&m).expect("lays out");
    }
}
