//! The episode layout of a Hugging Face model: its own `tokenizer.json`, chat template and
//! tool-call syntax, with the same operations as the byte layout of
//! [`EpisodeFormat`](crate::EpisodeFormat) (prompt, tool result, call, parse, stop ids).
//!
//! An episode's ids are the prompt the template renders (system and user messages, the task's
//! tools declared in OpenAI function format, the generation prompt), then per turn the ids the
//! model generated, verbatim, and the segment the template writes after an assistant turn for
//! the tool's result through the next generation prompt
//! ([`TurnRenderer`]: rendered against a stand-in history,
//! so tokens already seen are never re-rendered). A generated turn ends with the tokenizer's
//! `eos_token` (ChatML's `<|im_end|>`); one cut short by the token budget gets it at the start
//! of the next segment, so every turn in the history is closed.

use std::path::Path;

use corvid_proto::ToolCall;
use corvid_tokenizer::{
    special_tokens, ChatTemplate, HfTokenizer, Tokenizer, TokenizerError, TurnRenderer,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::format::CallParseError;
use crate::tool_syntax::ToolCallSyntax;
use crate::transcript::{ChatMessage, ChatToolCall, TranscriptError};

/// A Hugging Face model's episode layout.
#[derive(Debug)]
pub struct ChatFormat {
    tokenizer: HfTokenizer,
    turns: TurnRenderer,
    syntax: ToolCallSyntax,
    eos: u32,
    pad: u32,
    /// The text of every added token marked special: user or tool text that spells one is
    /// encoded as plain text, so it can never end a turn or forge a marker.
    special_texts: Vec<String>,
    files_sha256: String,
}

/// The files that make a tokenizer folder's format, hashed into
/// [`ChatFormat::files_sha256`] when present.
pub const TOKENIZER_FILES: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
];

/// Hex SHA-256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Stands for a message's content while its surroundings are rendered: no template writes
/// it, and no tokenizer merges across its control characters.
const SENTINEL: &str = "\u{1}corvid-content\u{1}";

fn config_error(dir: &Path, problem: impl Into<String>) -> TokenizerError {
    TokenizerError::Config {
        file: dir.join("tokenizer_config.json").display().to_string(),
        problem: problem.into(),
    }
}

impl ChatFormat {
    /// The layout of the tokenizer folder `dir` (`tokenizer.json`, `tokenizer_config.json`, a
    /// chat template) with tool calls written in `syntax`. The folder must name an
    /// `eos_token` the tokenizer knows (it ends every generated turn); the pad id is the
    /// `pad_token`'s, else the end token's.
    pub fn from_folder(dir: &Path, syntax: ToolCallSyntax) -> Result<Self, TokenizerError> {
        let tokenizer = HfTokenizer::from_file(&dir.join("tokenizer.json"))?;
        let template = ChatTemplate::from_folder(dir, true)?;
        let specials = special_tokens(dir)?;
        let id_of = |key: &str| -> Result<Option<(String, u32)>, TokenizerError> {
            let Some(text) = specials.get(key).and_then(Value::as_str) else {
                return Ok(None);
            };
            let id = tokenizer.token_to_id(text).ok_or_else(|| {
                config_error(
                    dir,
                    format!("{key} {text:?} is not a token of tokenizer.json"),
                )
            })?;
            Ok(Some((text.to_string(), id)))
        };
        let (eos_text, eos) = id_of("eos_token")?.ok_or_else(|| {
            config_error(
                dir,
                "no eos_token: an episode needs the token that ends an assistant turn",
            )
        })?;
        let pad = id_of("pad_token")?.map_or(eos, |(_, id)| id);
        let mut hash = Sha256::new();
        for name in TOKENIZER_FILES {
            let path = dir.join(name);
            if let Ok(bytes) = std::fs::read(&path) {
                hash.update(name.as_bytes());
                hash.update((bytes.len() as u64).to_le_bytes());
                hash.update(&bytes);
            }
        }
        let special_texts = (0..tokenizer.vocab_size() as u32)
            .filter(|&id| tokenizer.is_special(id))
            .filter_map(|id| tokenizer.decode(&[id]).ok())
            .filter(|t| !t.is_empty())
            .collect();
        let format = ChatFormat {
            turns: TurnRenderer::new(template, specials, eos_text),
            tokenizer,
            syntax,
            eos,
            pad,
            special_texts,
            files_sha256: hex(&hash.finalize()),
        };
        format.check_roles().map_err(|e| {
            config_error(
                dir,
                format!("the chat template cannot lay out an episode (a user prompt with tools, an assistant turn, a tool result): {e}"),
            )
        })?;
        Ok(format)
    }

    /// Renders the conversation every episode has: a prompt with a tool, a call, its result.
    fn check_roles(&self) -> Result<(), TokenizerError> {
        let tool = json!({"type": "function", "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        }});
        let tools = [tool];
        self.prompt_ids(None, "Find the value.", &tools)?;
        self.call_ids("read_file", &json!({"path": "a.txt"}))?;
        self.result_ids(true, "value: 1", &tools)?;
        Ok(())
    }

    /// Hex SHA-256 over the folder's [`TOKENIZER_FILES`] (names, lengths, bytes).
    pub fn files_sha256(&self) -> &str {
        &self.files_sha256
    }

    /// The text of `ids`, special tokens kept; invalid UTF-8 (a turn cut inside a character)
    /// shown with replacement characters.
    pub fn decode_lossy(&self, ids: &[u32]) -> String {
        self.tokenizer
            .decode(ids)
            .unwrap_or_else(|e| format!("<undecodable: {e}>"))
    }

    /// Ids of `rendered`, a template's text holding `content` once in place of [`SENTINEL`]
    /// (`rendered` holds the sentinel): the whole text encoded as transformers would, unless
    /// `content` spells a special token, which then is encoded as plain text.
    fn encode_around(&self, rendered: &str, content: &str) -> Result<Vec<u32>, TokenizerError> {
        let forged = self
            .special_texts
            .iter()
            .any(|t| content.contains(t.as_str()));
        match rendered.split_once(SENTINEL) {
            Some((before, after)) if forged => {
                let mut ids = self.tokenizer.encode(before)?;
                ids.extend(self.tokenizer.encode_plain(content)?);
                ids.extend(self.tokenizer.encode(after)?);
                Ok(ids)
            }
            _ => self
                .tokenizer
                .encode(&rendered.replacen(SENTINEL, content, 1)),
        }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &HfTokenizer {
        &self.tokenizer
    }

    /// The tool-call syntax.
    pub fn syntax(&self) -> ToolCallSyntax {
        self.syntax
    }

    /// The id that pads a batch row.
    pub fn pad_id(&self) -> u32 {
        self.pad
    }

    /// Ids that end a generated turn.
    pub fn stop_ids(&self) -> [u32; 1] {
        [self.eos]
    }

    /// The smallest vocabulary a policy needs for this tokenizer.
    pub fn vocab_size(&self) -> u32 {
        self.tokenizer.vocab_size() as u32
    }

    /// Whether a generated turn ended with the end-of-turn token (not cut by the budget).
    pub fn ended(&self, generated: &[u32]) -> bool {
        generated.last() == Some(&self.eos)
    }

    /// Turn 0's context: the system message (when given), the user's prompt, `tools`
    /// declared (OpenAI function format), and the generation prompt.
    pub fn prompt_ids(
        &self,
        system: Option<&str>,
        user: &str,
        tools: &[Value],
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut messages = Vec::new();
        if let Some(system) = system {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.push(json!({"role": "user", "content": SENTINEL}));
        let text = self.turns.prompt(&messages, Some(tools))?;
        self.encode_around(&text, user)
    }

    /// The context that opens turn `t > 0`: the tool's result `text` and the next generation
    /// prompt; `ended` says whether the previous turn ended with the end token (else it comes
    /// first). Tool text is rendered by the template, which may put markers around it; text
    /// that spells a special token is the caller's to refuse or escape.
    pub fn result_ids(
        &self,
        ended: bool,
        text: &str,
        tools: &[Value],
    ) -> Result<Vec<u32>, TokenizerError> {
        let segment = self
            .turns
            .segment_after_turn(&[json!({"role": "tool", "content": SENTINEL})], Some(tools))?;
        let mut ids = Vec::new();
        if !ended {
            ids.push(self.eos);
        }
        ids.extend(self.encode_around(&segment, text)?);
        Ok(ids)
    }

    /// The tool's text in a context [`result_ids`](Self::result_ids) made: the segment's text
    /// with what the template writes around the result removed; the whole context's text when
    /// it is of another shape.
    pub fn tool_result_text(&self, context: &[u32]) -> String {
        let text = self.decode_lossy(context);
        let eos = self.turns.end_of_turn();
        let body = text.strip_prefix(eos).unwrap_or(&text);
        let frame = self
            .turns
            .segment_after_turn(&[json!({"role": "tool", "content": SENTINEL})], None)
            .ok();
        frame
            .as_deref()
            .and_then(|f| f.split_once(SENTINEL))
            .and_then(|(before, after)| body.strip_prefix(before)?.strip_suffix(after))
            .unwrap_or(&text)
            .to_string()
    }

    /// A call turn whose JSON is cut after `keep(n)` of its `n` characters (kept in
    /// `1..n`), then closed with the syntax's markers and the end of the turn.
    pub(crate) fn broken_call_ids(
        &self,
        name: &str,
        arguments: &Value,
        keep: impl FnOnce(usize) -> usize,
    ) -> Result<Vec<u32>, TokenizerError> {
        let call = ToolCall {
            name: name.to_string(),
            arguments_json: arguments.to_string(),
        };
        let text = self.syntax.render(&[call]);
        // The JSON runs from the first `{` to the last `}`; cut strictly inside it.
        let (open, close) = match (text.find('{'), text.rfind('}')) {
            (Some(o), Some(c)) if c > o => (o, c + 1),
            _ => (0, text.len()),
        };
        let chars: Vec<(usize, char)> = text[open..close].char_indices().collect();
        let kept = keep(chars.len()).clamp(1, chars.len().saturating_sub(1).max(1));
        let cut = open + chars.get(kept).map_or(close - open, |(at, _)| *at);
        let broken = format!(
            "{}{}{}",
            &text[..cut],
            &text[close..],
            self.turns.end_of_turn()
        );
        self.tokenizer.encode(&broken)
    }

    /// The ids a model generates for a turn that makes `call` (an oracle demonstration): the
    /// call in the model's syntax, then the end token.
    pub fn call_ids(&self, name: &str, arguments: &Value) -> Result<Vec<u32>, TokenizerError> {
        let call = ToolCall {
            name: name.to_string(),
            arguments_json: arguments.to_string(),
        };
        let text = format!(
            "{}{}",
            self.syntax.render(&[call]),
            self.turns.end_of_turn()
        );
        self.tokenizer.encode(&text)
    }

    /// The call a generated turn makes: its text (special tokens included, since a syntax's
    /// markers may be special) read in the model's syntax; the first call when it makes
    /// several (an episode runs one tool call per turn).
    pub fn parse_call(&self, generated: &[u32]) -> Result<ToolCall, CallParseError> {
        let text = self
            .tokenizer
            .decode(generated)
            .map_err(|e| CallParseError::Json(e.to_string()))?;
        let mut calls = self.syntax.parse(&text)?;
        Ok(calls.swap_remove(0))
    }
}

/// Chat transcripts in a model's own layout (see [`EpisodeFormat::to_messages`](crate::EpisodeFormat::to_messages)).
impl ChatFormat {
    /// The user's text in a prompt [`prompt_ids`](Self::prompt_ids) made (with any tools):
    /// what follows the template's user header, up to what follows the user's content.
    fn prompt_user_text(&self, context: &[u32]) -> String {
        let text = self.decode_lossy(context);
        let frame = self
            .turns
            .prompt(&[json!({"role": "user", "content": SENTINEL})], None)
            .ok();
        let Some((before, after)) = frame.as_deref().and_then(|f| f.split_once(SENTINEL)) else {
            return text;
        };
        // The user header: the frame's text after its last end of turn (a tool-less prompt
        // may open with a default system turn).
        let eos = self.turns.end_of_turn();
        let header = before.rsplit_once(eos).map_or(before, |(_, h)| h);
        let header = header.trim_start_matches('\n');
        match (text.rfind(header), text.strip_suffix(after)) {
            (Some(at), Some(body)) if at + header.len() <= body.len() => {
                body[at + header.len()..].to_string()
            }
            _ => text,
        }
    }

    /// The ids of the generation prompt that ends every context (ChatML's
    /// `<|im_start|>assistant\n`): what the template writes after a user turn's end, from its
    /// first non-whitespace character; empty when the template cannot tell.
    fn generation_prompt_ids(&self) -> Vec<u32> {
        let eos = self.turns.end_of_turn();
        self.turns
            .prompt(&[json!({"role": "user", "content": SENTINEL})], None)
            .ok()
            .and_then(|frame| {
                let (_, after) = frame.split_once(SENTINEL)?;
                let after = after.split_once(eos).map_or(after, |(_, a)| a);
                self.tokenizer.encode(after.trim_start()).ok()
            })
            .unwrap_or_default()
    }

    /// The messages of an episode's turns (`(ids, loss mask)` each): the user's prompt, each
    /// generated turn an assistant message, each tool result a tool message answering it (or
    /// answering nothing, when the turn before made no call).
    pub(crate) fn to_messages(&self, turns: &[(Vec<u32>, Vec<bool>)]) -> Vec<ChatMessage> {
        let eos = self.turns.end_of_turn();
        let mut out = Vec::new();
        let mut unanswered: Option<String> = None;
        let prompt_end = self.generation_prompt_ids();
        for (n, (ids, mask)) in turns.iter().enumerate() {
            // The generated ids start at the first learnt one; a turn learnt nowhere (a
            // demonstration's mistake) after the last generation prompt.
            let first_gen = mask.iter().position(|m| *m).unwrap_or_else(|| {
                (!prompt_end.is_empty())
                    .then(|| {
                        ids.windows(prompt_end.len())
                            .rposition(|w| w == prompt_end.as_slice())
                            .map(|at| at + prompt_end.len())
                    })
                    .flatten()
                    .unwrap_or(ids.len())
            });
            let context = &ids[..first_gen];
            if n == 0 {
                out.push(ChatMessage::text("user", self.prompt_user_text(context)));
            } else {
                // The environment's answer to a turn without a call is laid out as a tool
                // message too, so it stays one (answering no call): the template writes it
                // back as the same ids.
                let mut m = ChatMessage::text("tool", self.tool_result_text(context));
                m.tool_call_id = unanswered.take();
                out.push(m);
            }
            let generated = &ids[first_gen..];
            if generated.is_empty() {
                continue;
            }
            let text = self.decode_lossy(generated);
            let body = text.strip_suffix(eos).unwrap_or(&text);
            // A turn that is exactly one call in the model's syntax is a structured call, which
            // the template writes back as the same text; anything else stays verbatim text.
            let call = self
                .parse_call(generated)
                .ok()
                .filter(|c| self.syntax.render(std::slice::from_ref(c)) == body);
            let message = match call {
                Some(mut c) => {
                    c.arguments_json = self.syntax.written_arguments(&c);
                    let id = format!("call_{n}");
                    unanswered = Some(id.clone());
                    ChatMessage {
                        tool_calls: vec![ChatToolCall::new(id, c)],
                        ..ChatMessage::text("assistant", String::new())
                    }
                }
                None => ChatMessage::text("assistant", body.to_string()),
            };
            out.push(message);
        }
        out
    }

    /// A transcript laid out as an episode: the messages before the first assistant turn as
    /// the prompt (with `tools`), each assistant message as the model would write it (its
    /// text, its calls in the model's syntax, the end of the turn: learnt), and the messages
    /// between as the segments after a turn, never re-rendering history.
    pub(crate) fn messages_to_ids(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
    ) -> Result<(Vec<u32>, Vec<bool>), TranscriptError> {
        let mut ids = Vec::new();
        let mut mask = Vec::new();
        let mut pending: Vec<Value> = Vec::new();
        let mut any_assistant = false;
        let tools = (!tools.is_empty()).then_some(tools);
        let render_error = |index: usize, e: TokenizerError| TranscriptError::Render {
            index,
            message: e.to_string(),
        };
        for (index, m) in messages.iter().enumerate() {
            match m.role.as_str() {
                "system" | "user" | "tool" => {
                    pending.push(json!({"role": m.role, "content": m.content}));
                    continue;
                }
                "assistant" => {}
                other => {
                    return Err(TranscriptError::UnknownRole {
                        index,
                        role: other.to_string(),
                    })
                }
            }
            let context = if any_assistant {
                self.turns.segment_after_turn(&pending, tools)
            } else {
                self.turns.prompt(&pending, tools)
            }
            .and_then(|text| self.tokenizer.encode(&text))
            .map_err(|e| render_error(index, e))?;
            pending.clear();
            mask.extend(std::iter::repeat_n(false, context.len()));
            ids.extend(context);
            any_assistant = true;
            let mut calls = Vec::with_capacity(m.tool_calls.len());
            for c in &m.tool_calls {
                let args: Value = serde_json::from_str(&c.function.arguments)
                    .ok()
                    .filter(Value::is_object)
                    .ok_or_else(|| TranscriptError::Arguments {
                        index,
                        message: format!("{:?}", c.function.arguments),
                    })?;
                calls.push(ToolCall {
                    name: c.function.name.clone(),
                    arguments_json: args.to_string(),
                });
            }
            let sep = if m.content.is_empty() || calls.is_empty() {
                ""
            } else {
                "\n"
            };
            let text = format!(
                "{}{sep}{}{}",
                m.content,
                self.syntax.render(&calls),
                self.turns.end_of_turn()
            );
            let generated = self
                .tokenizer
                .encode(&text)
                .map_err(|e| render_error(index, e))?;
            mask.extend(std::iter::repeat_n(true, generated.len()));
            ids.extend(generated);
        }
        if !any_assistant {
            return Err(TranscriptError::NoAssistant);
        }
        Ok((ids, mask))
    }
}
