//! The episode token format: how a task, the policy's turns and the tools' results become
//! exact token ids. The actor generates with it and the trainers learn from it, so this is
//! the one place the layout is written down.
//!
//! An episode is a sequence of [`Step`](corvid_proto::Step)s, one per turn. Step `t` holds, in order:
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

use corvid_proto::{ToolCall, ToolStatus};
use corvid_tasks::{TaskEnv, TaskInstance};
use corvid_tokenizer::{ByteTokenizer, Special};
use serde::{Deserialize, Serialize};

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

    /// The id that pads a batch row; never trained on and never generated.
    pub fn pad_id(&self) -> u32 {
        Special::Pad.id()
    }

    /// The id that opens a tool call in a generated turn.
    pub fn call_open_id(&self) -> u32 {
        Special::ToolCallOpen.id()
    }

    /// The smallest vocabulary a policy needs to read and write this format: every id the
    /// tokenizer can produce.
    pub fn vocab_size(&self) -> u32 {
        self.tok.vocab_size()
    }

    /// Whether the generated ids `generated` (loss mask `mask`) open a tool call: an attempt
    /// at one, well-formed or not.
    pub fn attempts_call(&self, generated: &[u32], mask: &[bool]) -> bool {
        let open = self.call_open_id();
        generated.iter().zip(mask).any(|(&id, &m)| m && id == open)
    }

    /// The tool's text in a tool-result context ([`result_ids`](Self::result_ids)): what
    /// follows the tool header up to its end marker. Tool text is encoded plain, so it holds
    /// no special token; a context of another shape is decoded whole.
    pub fn tool_result_text(&self, context: &[u32]) -> String {
        let body = context
            .iter()
            .position(|&t| t == Special::Tool.id())
            .map(|start| {
                let rest = &context[start + 1..];
                let end = rest
                    .iter()
                    .position(|&t| t == Special::End.id())
                    .unwrap_or(rest.len());
                &rest[..end]
            });
        self.tok.decode(body.unwrap_or(context))
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
        crate::tool_syntax::json_call(&text)
    }

    /// The text the policy reads back for a malformed turn.
    pub fn parse_error_text(&self, err: &CallParseError) -> String {
        format!("error: {}: {err}", ToolStatus::InvalidCall)
    }
}
