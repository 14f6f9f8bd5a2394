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

use corvid_proto::{Step, ToolCall, ToolStatus};
use corvid_tasks::{Episode, TaskEnv, TaskInstance, TasksError, Verdict};
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
        let names: Vec<&str> = task.tools.iter().map(|t| t.name.as_str()).collect();
        let decls = env.sandbox().tool_declarations(Some(&names));
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
        let body = serde_json::json!({ "name": name, "arguments": arguments });
        let mut ids = vec![Special::ToolCallOpen.id()];
        ids.extend(self.tok.encode_plain(&body.to_string()));
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

/// Runs `task`'s oracle plan (its calls, then `answer`) in a fresh workspace of `env`'s
/// sandbox and lays it out in `format`, with each turn's tool result and process reward.
pub fn oracle_steps(
    format: &EpisodeFormat,
    env: &TaskEnv,
    task: &TaskInstance,
) -> Result<Demonstration, TasksError> {
    let mut ep = Episode::start(env, task)?;
    let mut steps = Vec::with_capacity(task.oracle.steps.len() + 1);
    let mut context = format.prompt_ids(env, task);
    let calls = task
        .oracle
        .steps
        .iter()
        .cloned()
        .chain(std::iter::once(task.oracle.answer_step()));
    for (turn, call) in calls.enumerate() {
        let generated = format.call_ids(&call.name, &call.arguments);
        let out = ep.call(&call.tool_call());
        let n_ctx = context.len();
        let n_gen = generated.len();
        let mut token_ids = std::mem::take(&mut context);
        token_ids.extend_from_slice(&generated);
        let mut loss_mask = vec![false; n_ctx];
        loss_mask.extend(std::iter::repeat_n(true, n_gen));
        steps.push(Step {
            turn: turn as u32,
            loss_mask,
            logprobs: vec![0.0; n_ctx + n_gen],
            policy_versions: vec![0; n_ctx + n_gen],
            token_ids,
            tool_call: Some(call.tool_call()),
            tool_result: Some(out.result.clone()),
            process_reward: ep.last_process_reward() as f32,
            timings: Default::default(),
        });
        context = format.result_ids(true, &out.text);
    }
    let verdict = ep.check();
    Ok(Demonstration { steps, verdict })
}
