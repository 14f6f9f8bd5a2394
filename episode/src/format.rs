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

use std::path::Path;
use std::sync::Arc;

use corvid_proto::{ToolCall, ToolStatus};
use corvid_tasks::{TaskEnv, TaskInstance};
use corvid_tokenizer::{ByteTokenizer, Special, Tokenizer};
use serde::{Deserialize, Serialize};

use crate::chat_format::ChatFormat;
use crate::tool_syntax::ToolCallSyntax;
use crate::transcript::{ChatMessage, Conversation};

/// Why a model's own layout could not render an episode's text (its template failed, or its
/// tokenizer did). The byte layout never fails.
pub type FormatError = corvid_tokenizer::TokenizerError;

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

/// Builds and parses episode token sequences: the byte layout above for Corvid's own
/// policies, or a Hugging Face model's own tokenizer, chat template and tool-call syntax
/// ([`ChatFormat`]). Everything that makes or reads an episode's ids goes through it.
#[derive(Debug, Clone)]
pub struct EpisodeFormat {
    layout: Layout,
}

#[derive(Debug, Clone)]
enum Layout {
    Byte {
        tok: ByteTokenizer,
        tool_prompt: ToolPrompt,
    },
    Chat(Arc<ChatFormat>),
}

impl Default for EpisodeFormat {
    fn default() -> Self {
        Self::new(ToolPrompt::default())
    }
}

/// What identifies a run's episode format, sent to actors with the run settings: an actor
/// whose format differs would write ids the trainer reads as other text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FormatDescription {
    /// `byte` (Corvid's byte layout) or `chat` (a model's own tokenizer and template).
    pub layout: String,
    /// SHA-256 of the tokenizer files (`tokenizer.json`, `tokenizer_config.json`, the chat
    /// template file when there is one), hex; for the byte layout, of its name and tool
    /// prompt style.
    pub tokenizer_sha256: String,
    /// The tool-call syntax's configuration name.
    pub tool_call_format: String,
    /// The keywords the chat template renders with (`enable_thinking`); an actor renders with
    /// the run's.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
}

impl FormatDescription {
    /// Why `self` (the learner's) and `other` (an actor's) cannot work together, naming both
    /// hashes; `None` when they are the same format.
    pub fn mismatch(&self, other: &FormatDescription) -> Option<String> {
        (self != other).then(|| {
            format!(
                "the run's episode format is {} layout, tokenizer sha256 {}, tool calls {}, template keywords {}; this actor's is {} layout, tokenizer sha256 {}, tool calls {}, template keywords {}",
                self.layout,
                self.tokenizer_sha256,
                self.tool_call_format,
                serde_json::Value::from(self.chat_template_kwargs.clone()),
                other.layout,
                other.tokenizer_sha256,
                other.tool_call_format,
                serde_json::Value::from(other.chat_template_kwargs.clone()),
            )
        })
    }
}

/// Why the generated tokens of a turn are not a well-formed tool call. The message is what
/// the policy reads back in the tool turn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallParseError {
    /// The turn ended without `<tool_call>`.
    #[error("no tool call: every turn calls one tool")]
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
    /// Corvid's byte layout with the given tool description style.
    pub fn new(tool_prompt: ToolPrompt) -> Self {
        Self {
            layout: Layout::Byte {
                tok: ByteTokenizer::new(),
                tool_prompt,
            },
        }
    }

    /// A Hugging Face model's layout: its tokenizer, chat template and tool-call syntax.
    pub fn chat(chat: ChatFormat) -> Self {
        Self {
            layout: Layout::Chat(Arc::new(chat)),
        }
    }

    /// The format of a model folder's episodes: a policy folder whose `hf/` holds a
    /// `tokenizer.json` (a run that started from a Hugging Face model), or a Hugging Face
    /// folder with one, is in the model's own format, its tool calls in `tool_call_format`
    /// (default: the syntax of the folder's `model_type`); any other folder is in the byte
    /// layout.
    pub fn for_model_folder(
        dir: &Path,
        tool_call_format: Option<&str>,
    ) -> Result<Self, FormatError> {
        let origin = dir.join("hf");
        let tokenizer_dir = if origin.join("tokenizer.json").is_file() {
            origin
        } else if dir.join("tokenizer.json").is_file() {
            dir.to_path_buf()
        } else {
            return Ok(Self::default());
        };
        let config_error = |problem: String| FormatError::Config {
            file: tokenizer_dir.join("config.json").display().to_string(),
            problem,
        };
        let syntax = match tool_call_format {
            Some(name) => ToolCallSyntax::from_name(name).map_err(config_error)?,
            None => {
                let path = tokenizer_dir.join("config.json");
                let text =
                    std::fs::read_to_string(&path).map_err(|e| config_error(e.to_string()))?;
                let config: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| config_error(format!("not valid JSON: {e}")))?;
                let model_type = config["model_type"].as_str().unwrap_or_default();
                ToolCallSyntax::for_model_type(model_type).ok_or_else(|| {
                    config_error(format!(
                        "model_type {model_type:?} has no tool-call syntax of its own: name one (tool_call_format)"
                    ))
                })?
            }
        };
        Ok(Self::chat(ChatFormat::from_folder(&tokenizer_dir, syntax)?))
    }

    /// The model's layout, when this is one.
    pub fn chat_format(&self) -> Option<&ChatFormat> {
        match &self.layout {
            Layout::Chat(c) => Some(c),
            Layout::Byte { .. } => None,
        }
    }

    /// What identifies this format (see [`FormatDescription`]).
    pub fn description(&self) -> FormatDescription {
        match &self.layout {
            Layout::Byte { tool_prompt, .. } => FormatDescription {
                layout: "byte".into(),
                tokenizer_sha256: crate::chat_format::sha256_hex(
                    format!("corvid-byte/{tool_prompt:?}").as_bytes(),
                ),
                tool_call_format: "corvid".into(),
                chat_template_kwargs: Default::default(),
            },
            Layout::Chat(c) => FormatDescription {
                layout: "chat".into(),
                tokenizer_sha256: c.files_sha256().to_string(),
                tool_call_format: c.syntax().name().to_string(),
                chat_template_kwargs: c.template_kwargs().clone(),
            },
        }
    }

    /// The text of `ids`, special tokens written as their text (a byte sequence that is not
    /// UTF-8 is shown with replacement characters).
    pub fn decode(&self, ids: &[u32]) -> String {
        match &self.layout {
            Layout::Byte { tok, .. } => tok.decode(ids),
            Layout::Chat(c) => c.decode_lossy(ids),
        }
    }

    /// The id that pads a batch row; never trained on and never generated.
    pub fn pad_id(&self) -> u32 {
        match &self.layout {
            Layout::Byte { .. } => Special::Pad.id(),
            Layout::Chat(c) => c.pad_id(),
        }
    }

    /// The smallest vocabulary a policy needs to read and write this format: every id the
    /// tokenizer can produce.
    pub fn vocab_size(&self) -> u32 {
        match &self.layout {
            Layout::Byte { tok, .. } => tok.vocab_size(),
            Layout::Chat(c) => c.vocab_size(),
        }
    }

    /// Whether the generated ids `generated` (loss mask `mask`) open a tool call: an attempt
    /// at one, well-formed or not.
    pub fn attempts_call(&self, generated: &[u32], mask: &[bool]) -> bool {
        match &self.layout {
            Layout::Byte { .. } => {
                let open = Special::ToolCallOpen.id();
                generated.iter().zip(mask).any(|(&id, &m)| m && id == open)
            }
            Layout::Chat(c) => {
                let ids: Vec<u32> = generated
                    .iter()
                    .zip(mask)
                    .filter(|(_, &m)| m)
                    .map(|(&id, _)| id)
                    .collect();
                c.decode_lossy(&ids).contains(c.syntax().call_marker())
            }
        }
    }

    /// The tool's text in a tool-result context ([`result_ids`](Self::result_ids)) after a
    /// turn that made `call` (none for a malformed turn): what the layout wraps around it
    /// removed. A context of another shape is decoded whole.
    pub fn tool_result_text(&self, context: &[u32], call: Option<&ToolCall>) -> String {
        self.result_text(context, call, false)
    }

    /// [`tool_result_text`](Self::tool_result_text) of a folded segment's opening context: its
    /// last tool result (the latest turn's, after the prompt and the turns kept before it).
    pub fn opening_result_text(&self, context: &[u32], call: Option<&ToolCall>) -> String {
        self.result_text(context, call, true)
    }

    fn result_text(&self, context: &[u32], call: Option<&ToolCall>, opening: bool) -> String {
        match &self.layout {
            Layout::Byte { tok, .. } => {
                let tool = |t: &u32| *t == Special::Tool.id();
                let at = match opening {
                    false => context.iter().position(tool),
                    true => context.iter().rposition(tool),
                };
                let body = at.map(|start| {
                    let rest = &context[start + 1..];
                    let end = rest
                        .iter()
                        .position(|&t| t == Special::End.id())
                        .unwrap_or(rest.len());
                    &rest[..end]
                });
                tok.decode(body.unwrap_or(context))
            }
            Layout::Chat(c) => c.result_text(context, call, 0, opening),
        }
    }

    /// Token ids that end a generated turn.
    pub fn stop_ids(&self) -> Vec<u32> {
        match &self.layout {
            Layout::Byte { .. } => vec![Special::ToolCallClose.id(), Special::End.id()],
            Layout::Chat(c) => c.stop_ids().to_vec(),
        }
    }

    /// The task's tools in OpenAI function format, in its order, a pack's own WASI tools
    /// included; if one of those cannot be compiled, the sandbox's built-ins (the call itself
    /// will report it).
    pub fn tools(&self, env: &TaskEnv, task: &TaskInstance) -> Vec<serde_json::Value> {
        let names: Vec<&str> = task.tools.iter().map(|t| t.name.as_str()).collect();
        let decls = env.tool_declarations(task).unwrap_or_else(|e| {
            tracing::warn!(task = %task.id, "task tool declarations: {e}; listing the built-ins");
            env.sandbox().tool_declarations(Some(&names))
        });
        match decls {
            serde_json::Value::Array(tools) => tools,
            other => vec![other],
        }
    }

    /// The byte layout's system turn: the tools the task allows and how to call them.
    fn system_text_of(tool_prompt: ToolPrompt, tools: &[serde_json::Value]) -> String {
        match tool_prompt {
            ToolPrompt::Json => format!(
                "You can call these tools, one per turn, as <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>:\n{}",
                serde_json::Value::from(tools)
            ),
            ToolPrompt::Compact => {
                let mut lines = Vec::new();
                for d in tools {
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

    /// The byte layout's system turn text for `task` (what [`prompt_ids`](Self::prompt_ids)
    /// puts between `<|system|>` and `<|end|>`); empty for a model's own layout, whose
    /// template declares the tools.
    pub fn system_text(&self, env: &TaskEnv, task: &TaskInstance) -> String {
        match &self.layout {
            Layout::Byte { tool_prompt, .. } => {
                Self::system_text_of(*tool_prompt, &self.tools(env, task))
            }
            Layout::Chat(_) => String::new(),
        }
    }

    /// The conversation an episode of `task` starts from: the task's tools and the prompt's
    /// messages (in the byte layout a system turn listing the tools, then the user's task; in
    /// a model's own, the user's task, the template declaring the tools).
    pub fn conversation(&self, env: &TaskEnv, task: &TaskInstance) -> Conversation {
        let tools = self.tools(env, task);
        let mut messages = Vec::new();
        if let Layout::Byte { tool_prompt, .. } = &self.layout {
            messages.push(ChatMessage::text(
                "system",
                Self::system_text_of(*tool_prompt, &tools),
            ));
        }
        messages.push(ChatMessage::text("user", task.prompt.clone()));
        Conversation { messages, tools }
    }

    /// Turn 0's context: the conversation's prompt ([`conversation`](Self::conversation)) and
    /// the assistant header.
    pub fn prompt_ids(&self, conversation: &Conversation) -> Result<Vec<u32>, FormatError> {
        match &self.layout {
            Layout::Byte { tok, .. } => {
                let mut ids = Vec::new();
                for m in conversation.prompt() {
                    let header = match m.role.as_str() {
                        "system" => Special::System,
                        _ => Special::User,
                    };
                    ids.push(header.id());
                    ids.extend(tok.encode_plain(&m.content));
                    ids.push(Special::End.id());
                }
                ids.push(Special::Assistant.id());
                Ok(ids)
            }
            Layout::Chat(c) => Ok(c.prompt_ids(conversation)?),
        }
    }

    /// The context that opens the turn after the generated turn `after`: the tool's result
    /// `text` (or the error a malformed turn gets) and the next assistant header, closing
    /// `after` first when it did not close itself. In a model's own layout `conversation`
    /// gains the turn and the result, and the template writes the result as it follows this
    /// conversation ([`ChatFormat::result_ids`]).
    pub fn result_ids(
        &self,
        conversation: &mut Conversation,
        after: &[u32],
        text: &str,
    ) -> Result<Vec<u32>, FormatError> {
        match &self.layout {
            Layout::Byte { tok, .. } => {
                let mut ids = Vec::with_capacity(text.len() + 4);
                // A turn stopped at `</tool_call>` has not written its `<|end|>`.
                if after.last() == Some(&Special::ToolCallClose.id()) {
                    ids.push(Special::End.id());
                }
                ids.push(Special::Tool.id());
                ids.extend(tok.encode_plain(text));
                ids.push(Special::End.id());
                ids.push(Special::Assistant.id());
                Ok(ids)
            }
            Layout::Chat(c) => Ok(c.result_ids(conversation, after, text)?),
        }
    }

    /// Ends an episode's `conversation` with its last generated turn `generated` (the turn no
    /// result followed) and says whether the template renders it otherwise than the
    /// episode's `ids` ([`ChatFormat::diverges`]); always false in the byte layout, whose
    /// turns are laid out by Corvid itself.
    pub fn finish(&self, conversation: &mut Conversation, generated: &[u32], ids: &[u32]) -> bool {
        let Layout::Chat(c) = &self.layout else {
            return false;
        };
        if !generated.is_empty() {
            c.close(conversation, generated);
        }
        c.diverges(conversation, ids)
    }

    /// The tokens a policy generates for a turn that calls `name` with `arguments`: in the
    /// byte layout `<tool_call>{json}</tool_call>`, in a model's own its syntax and the end of
    /// the turn.
    pub fn call_ids(
        &self,
        name: &str,
        arguments: &serde_json::Value,
    ) -> Result<Vec<u32>, FormatError> {
        match &self.layout {
            Layout::Byte { tok, .. } => {
                // Name first, so the policy picks the tool before writing its arguments.
                let body = format!(
                    "{{\"name\":{},\"arguments\":{arguments}}}",
                    serde_json::Value::String(name.to_string())
                );
                let mut ids = vec![Special::ToolCallOpen.id()];
                ids.extend(tok.encode_plain(&body));
                ids.push(Special::ToolCallClose.id());
                Ok(ids)
            }
            Layout::Chat(c) => c.call_ids(name, arguments),
        }
    }

    /// A turn that calls `name` but whose JSON is cut after `keep(n)` of its `n` characters
    /// (`keep(n) < n`): a call that does not parse, closed as a well-formed one would be.
    pub(crate) fn broken_call_ids(
        &self,
        name: &str,
        arguments: &serde_json::Value,
        keep: impl FnOnce(usize) -> usize,
    ) -> Result<Vec<u32>, FormatError> {
        match &self.layout {
            Layout::Byte { .. } => {
                let whole = self.call_ids(name, arguments)?;
                // [<tool_call>, body..., </tool_call>]: the open tag, a strict non-empty
                // prefix of the body, the close tag.
                let body = whole.len() - 2;
                let kept = keep(body).clamp(1, body.saturating_sub(1).max(1));
                let mut ids = whole[..1 + kept].to_vec();
                ids.push(Special::ToolCallClose.id());
                Ok(ids)
            }
            Layout::Chat(c) => c.broken_call_ids(name, arguments, keep),
        }
    }

    /// Parses a generated turn into a tool call. Text before the call is allowed (and
    /// ignored); in the byte layout the call body is JSON `{"name": "...", "arguments":
    /// {...}}`, where `arguments` may also be a string holding the object, or absent (`{}`).
    pub fn parse_call(&self, generated: &[u32]) -> Result<ToolCall, CallParseError> {
        match &self.layout {
            Layout::Byte { tok, .. } => {
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
                let text = String::from_utf8_lossy(&tok.decode_bytes(&body[..end])).into_owned();
                crate::tool_syntax::json_call(&text)
            }
            Layout::Chat(c) => c.parse_call(generated),
        }
    }

    /// The text a generated turn wrote, without the layout's markers (a `summary` fold's
    /// memory): in the byte layout its text without Corvid's special tokens; in a model's own,
    /// its message's content (its reasoning when it wrote nothing else).
    pub fn turn_text(&self, generated: &[u32]) -> String {
        match &self.layout {
            Layout::Byte { .. } => self.plain_text(generated),
            Layout::Chat(c) => {
                let m = c.assistant_message(generated, 0);
                match (m.content.is_empty(), m.reasoning_content) {
                    (true, Some(reasoning)) => reasoning,
                    _ => m.content,
                }
            }
        }
    }

    /// `text` cut to about `max_tokens` tokens of this format (a `notes` fold's memory cap): in
    /// the byte layout exactly, at a character boundary; in a model's own, its first
    /// `max_tokens` ids decoded (text the tokenizer cannot encode is cut to `max_tokens` bytes,
    /// at least as many tokens in a byte-level tokenizer).
    pub fn cut_to_tokens(&self, text: &str, max_tokens: usize) -> String {
        let by_bytes = || crate::fold::cut_memory(text, max_tokens).to_string();
        match &self.layout {
            Layout::Byte { .. } => by_bytes(),
            Layout::Chat(c) => match c.tokenizer().encode_plain(text) {
                Ok(ids) if ids.len() <= max_tokens => text.to_string(),
                Ok(ids) => c
                    .decode_lossy(&ids[..max_tokens])
                    .trim_end_matches('\u{fffd}')
                    .to_string(),
                Err(_) => by_bytes(),
            },
        }
    }

    /// The text the policy reads back for a malformed turn.
    pub fn parse_error_text(&self, err: &CallParseError) -> String {
        format!("error: {}: {err}", ToolStatus::InvalidCall)
    }
}
