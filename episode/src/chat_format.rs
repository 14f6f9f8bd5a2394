//! The episode layout of a Hugging Face model: its own `tokenizer.json`, chat template and
//! tool-call syntax, with the same operations as the byte layout of
//! [`EpisodeFormat`](crate::EpisodeFormat) (prompt, tool result, call, parse, stop ids).
//!
//! An episode's ids are token-in-token-out:
//! - the prompt is the template's rendering of the prompt's messages (system and user, the
//!   task's tools declared in OpenAI function format) with the generation prompt;
//! - each generated turn is kept exactly as sampled, closed by the tokenizer's `eos_token`
//!   (ChatML's `<|im_end|>`); one cut short by the token budget gets it at the start of the
//!   next segment, so every turn in the history is closed;
//! - each later segment is what the template writes after that closed turn for the new
//!   messages (the tool result, the next generation prompt), cut from its rendering of the
//!   real conversation ([`Conversation`]) at the end of the turn ([`TurnRenderer`]).
//!
//! Nothing already in the trajectory is re-rendered or re-tokenised, so the stored ids are
//! what the policy saw. A template that rewrites history (Qwen3 writes an empty `<think>`
//! block only on the last assistant turn) renders the finished conversation differently:
//! [`ChatFormat::notes`] says so at start-up, with the turn and the text, and
//! [`ChatFormat::divergence`] names the difference for one episode.
//!
//! Keywords a run passes to the template (`enable_thinking`) live in the folder's
//! [`KWARGS_FILE`] and are hashed with the [`TOKENIZER_FILES`], so actors and readers of a
//! policy folder render with the same ones.

use std::path::Path;

use corvid_proto::ToolCall;
use corvid_tokenizer::{
    special_tokens, ChatTemplate, HfTokenizer, Tokenizer, TokenizerError, TurnRenderer,
};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::format::CallParseError;
use crate::tool_syntax::ToolCallSyntax;
use crate::transcript::{ChatMessage, ChatToolCall, Conversation, TranscriptError};

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
    kwargs: Map<String, Value>,
    notes: Vec<String>,
}

/// The keywords a run passes to its chat template (`{"enable_thinking": false}`), a JSON
/// object in the tokenizer folder, as `apply_chat_template(..., **kwargs)` takes them. A run
/// writes its `[model] chat_template_kwargs` there in the folder it keeps, so every policy
/// folder it writes renders as it trained.
pub const KWARGS_FILE: &str = "chat_template_kwargs.json";

/// The files that make a tokenizer folder's format, hashed into
/// [`ChatFormat::files_sha256`] when present (with the template keywords in effect).
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

/// The keywords of a tokenizer folder's [`KWARGS_FILE`]; none when it has none, an error
/// naming the file when it is not a JSON object.
pub fn read_template_kwargs(dir: &Path) -> Result<Map<String, Value>, TokenizerError> {
    let path = dir.join(KWARGS_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Map::new()),
        Err(e) => {
            return Err(TokenizerError::Config {
                file: path.display().to_string(),
                problem: e.to_string(),
            })
        }
    };
    match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(TokenizerError::Config {
            file: path.display().to_string(),
            problem:
                "must be a JSON object of template keywords, e.g. {\"enable_thinking\": false}"
                    .into(),
        }),
        Err(e) => Err(TokenizerError::Config {
            file: path.display().to_string(),
            problem: format!("not valid JSON: {e}"),
        }),
    }
}

/// The special-token spellings in `text` (`<|im_start|>`, `<｜User｜>`): what a template
/// writes as a marker, which its tokenizer must hold as one token.
fn markers(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for (open, close) in [("<|", "|>"), ("<｜", "｜>")] {
        let mut rest = text;
        while let Some(at) = rest.find(open) {
            let tail = &rest[at..];
            match tail[open.len()..].find(close) {
                Some(end)
                    if end <= 64
                        && !tail[open.len()..open.len() + end].contains(['<', '>', '\n']) =>
                {
                    out.push(&tail[..open.len() + end + close.len()]);
                    rest = &tail[open.len() + end + close.len()..];
                }
                _ => rest = &tail[open.len()..],
            }
        }
    }
    out
}

impl ChatFormat {
    /// The layout of the tokenizer folder `dir` (`tokenizer.json`, `tokenizer_config.json`, a
    /// chat template, optionally [`KWARGS_FILE`]) with tool calls written in `syntax`. The
    /// folder must name an `eos_token` the tokenizer knows (it ends every generated turn), and
    /// every marker the template writes must be one of the tokenizer's tokens; the pad id is
    /// the `pad_token`'s, else the end token's.
    pub fn from_folder(dir: &Path, syntax: ToolCallSyntax) -> Result<Self, TokenizerError> {
        Self::from_folder_with(dir, syntax, &Map::new())
    }

    /// [`from_folder`](Self::from_folder) with `kwargs` passed to the template besides (and
    /// over) the folder's own [`KWARGS_FILE`].
    pub fn from_folder_with(
        dir: &Path,
        syntax: ToolCallSyntax,
        kwargs: &Map<String, Value>,
    ) -> Result<Self, TokenizerError> {
        let tokenizer = HfTokenizer::from_file(&dir.join("tokenizer.json"))?;
        let template = ChatTemplate::from_folder(dir, true)?;
        let mut extra = special_tokens(dir)?;
        let id_of = |key: &str| -> Result<Option<(String, u32)>, TokenizerError> {
            let Some(text) = extra.get(key).and_then(Value::as_str) else {
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
        let mut notes = Vec::new();
        let mut in_effect = read_template_kwargs(dir)?;
        in_effect.extend(kwargs.clone());
        for (key, value) in &in_effect {
            if !template.reads(key) {
                notes.push(format!(
                    "chat_template_kwargs: the chat template ({}) never reads {key:?}, so it changes nothing",
                    template.origin()
                ));
            }
            extra.insert(key.clone(), value.clone());
        }
        let mut hash = Sha256::new();
        for name in TOKENIZER_FILES {
            let path = dir.join(name);
            if let Ok(bytes) = std::fs::read(&path) {
                hash.update(name.as_bytes());
                hash.update((bytes.len() as u64).to_le_bytes());
                hash.update(&bytes);
            }
        }
        if !in_effect.is_empty() {
            let mut keys: Vec<&String> = in_effect.keys().collect();
            keys.sort();
            hash.update(KWARGS_FILE.as_bytes());
            for k in keys {
                hash.update(format!("{k}={}\n", in_effect[k]).as_bytes());
            }
        }
        let special_texts = (0..tokenizer.vocab_size() as u32)
            .filter(|&id| tokenizer.is_special(id))
            .filter_map(|id| tokenizer.decode(&[id]).ok())
            .filter(|t| !t.is_empty())
            .collect();
        let mut format = ChatFormat {
            turns: TurnRenderer::new(template, extra, eos_text),
            tokenizer,
            syntax,
            eos,
            pad,
            special_texts,
            files_sha256: hex(&hash.finalize()),
            kwargs: in_effect,
            notes: Vec::new(),
        };
        let probe = format.probe().map_err(|e| {
            config_error(
                dir,
                format!("the chat template cannot lay out an episode (a user prompt with tools, assistant turns, tool results): {e}"),
            )
        })?;
        let rendered = format
            .turns
            .render(
                &format.template_messages(&probe.0.messages),
                Some(&probe.0.tools),
                false,
            )
            .map_err(|e| config_error(dir, e.to_string()))?;
        // The probe's first call reads a.txt, which nothing else in it mentions.
        if !rendered.contains("a.txt") {
            return Err(config_error(
                dir,
                format!("the chat template does not write an assistant turn's tool_calls in {} syntax (its rendering of a conversation with a call leaves the call out), so it cannot lay out tool use; name the syntax its model writes (tool_call_format) or use a template that renders tool calls", format.syntax.name()),
            ));
        }
        if let Some(m) = markers(&rendered)
            .into_iter()
            .find(|m| format.tokenizer.token_to_id(m).is_none())
        {
            return Err(config_error(
                dir,
                format!("the chat template writes {m:?}, which is not a token of tokenizer.json: the tokenizer's special tokens do not match the template's"),
            ));
        }
        if let Some(d) = format.divergence(&probe.0, &probe.1) {
            notes.push(format!(
                "the chat template does not extend turn by turn: {d}. Episodes keep the tokens the policy saw; each one whose finished conversation renders otherwise is counted in template_divergent_episodes"
            ));
        }
        format.notes = notes;
        Ok(format)
    }

    /// The conversation every episode has, built turn by turn as an actor builds it: a
    /// prompt with a tool, two calls with their results, and a closing answer; with its ids.
    fn probe(&self) -> Result<(Conversation, Vec<u32>), TokenizerError> {
        let tool = json!({"type": "function", "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        }});
        let mut conversation = Conversation {
            messages: vec![ChatMessage::text("user", "Find the value.")],
            tools: vec![tool],
        };
        let mut ids = self.prompt_ids(&conversation)?;
        for (path, result) in [("a.txt", "see b.txt"), ("b.txt", "value: 1")] {
            let call = self.call_ids("read_file", &json!({"path": path}))?;
            ids.extend(&call);
            ids.extend(self.result_ids(&mut conversation, &call, result)?);
        }
        let answer = self
            .tokenizer
            .encode(&format!("1{}", self.turns.end_of_turn()))?;
        ids.extend(&answer);
        self.close(&mut conversation, &answer);
        Ok((conversation, ids))
    }

    /// What a run should be told once at start-up: keywords the template never reads, and
    /// how the template's rendering of a finished episode differs from the episode's ids
    /// when it does not extend turn by turn.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The keywords the template renders with, besides the special tokens: the folder's
    /// [`KWARGS_FILE`] and those given to [`from_folder_with`](Self::from_folder_with).
    pub fn template_kwargs(&self) -> &Map<String, Value> {
        &self.kwargs
    }

    /// Hex SHA-256 over the folder's [`TOKENIZER_FILES`] (names, lengths, bytes) and the
    /// template keywords in effect.
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

    /// Turn 0's context: the conversation's prompt messages (system, user) with its tools
    /// declared, and the generation prompt.
    pub fn prompt_ids(&self, conversation: &Conversation) -> Result<Vec<u32>, TokenizerError> {
        let (before, after) = self.prompt_frame(conversation)?;
        let content = conversation.prompt().last().map_or("", |m| &m.content);
        self.encode_around(&format!("{before}{SENTINEL}{after}"), content)
    }

    /// The text of [`prompt_ids`](Self::prompt_ids) around the last prompt message's content:
    /// what the template writes before it (the system turn, the tools, the user's header)
    /// and after it (the end of the turn and the generation prompt). The content goes in as
    /// a stand-in, so that text spelling a special token is encoded as plain text.
    pub(crate) fn prompt_frame(
        &self,
        conversation: &Conversation,
    ) -> Result<(String, String), TokenizerError> {
        let template_error = |message: &str| TokenizerError::Template {
            template: self.turns.template().origin().to_string(),
            line: None,
            message: message.into(),
        };
        let prompt = conversation.prompt();
        let (last, before) = prompt
            .split_last()
            .ok_or_else(|| template_error("an episode's prompt needs a user message"))?;
        let mut messages = self.template_messages(before);
        let mut stand_in = last.clone();
        stand_in.content = SENTINEL.into();
        messages.extend(self.template_messages(std::slice::from_ref(&stand_in)));
        let text = self.turns.prompt(&messages, Some(&conversation.tools))?;
        let (before, after) = text
            .split_once(SENTINEL)
            .ok_or_else(|| template_error("the template does not write the user's message"))?;
        Ok((before.to_string(), after.to_string()))
    }

    /// The id that ends every generated turn (the tokenizer's `eos_token`).
    pub(crate) fn end_id(&self) -> u32 {
        self.eos
    }

    /// The context that opens the turn after `generated`: the tool's result `text` and the
    /// next generation prompt, as the template writes them after this conversation's last
    /// turn, closing `generated` first when it did not end with the end token. `conversation`
    /// gains the assistant message of `generated` and the tool message. Tool text is rendered
    /// by the template, which may put markers around it; text that spells a special token is
    /// encoded as plain text.
    pub fn result_ids(
        &self,
        conversation: &mut Conversation,
        generated: &[u32],
        text: &str,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.close(conversation, generated);
        let call_id = conversation
            .messages
            .last()
            .and_then(|m| m.tool_calls.first())
            .and_then(|c| c.id.clone());
        let mut tool = ChatMessage::text("tool", SENTINEL);
        tool.tool_call_id = call_id;
        let history = self.template_messages(&conversation.messages);
        let segment = self.turns.segment_after_turn(
            &history,
            &self.template_messages(std::slice::from_ref(&tool)),
            Some(&conversation.tools),
        )?;
        let mut ids = Vec::new();
        if !self.ended(generated) {
            ids.push(self.eos);
        }
        ids.extend(self.encode_around(&segment, text)?);
        tool.content = text.to_string();
        conversation.messages.push(tool);
        Ok(ids)
    }

    /// Adds the assistant message of the generated turn `generated` (the episode's `n`-th)
    /// to `conversation`.
    pub fn close(&self, conversation: &mut Conversation, generated: &[u32]) {
        let n = conversation.assistant_turns();
        conversation
            .messages
            .push(self.assistant_message(generated, n));
    }

    /// The assistant message of a generated turn, the episode's `n`-th: its `<think>` block as
    /// `reasoning_content` (split as Qwen3's template splits it), then a turn that is exactly
    /// one call in the model's syntax as that call in `tool_calls` (id
    /// [`ToolCallSyntax::call_id`]), which the template writes back as the same text; any other
    /// turn as verbatim `content`.
    pub fn assistant_message(&self, generated: &[u32], n: usize) -> ChatMessage {
        let eos = self.turns.end_of_turn();
        let text = self.decode_lossy(generated);
        let body = text.strip_suffix(eos).unwrap_or(&text);
        let (reasoning, rest) = match body.split_once("</think>") {
            Some((before, after)) => {
                let reasoning = before.trim_end_matches('\n');
                let reasoning = reasoning
                    .rsplit_once("<think>")
                    .map_or(reasoning, |(_, r)| r);
                (
                    Some(reasoning.trim_start_matches('\n').to_string()),
                    after.trim_start_matches('\n'),
                )
            }
            None => (None, body),
        };
        let call = self
            .syntax
            .parse(rest)
            .ok()
            .filter(|calls| calls.len() == 1)
            .map(|mut calls| calls.swap_remove(0))
            .filter(|c| self.syntax.render(std::slice::from_ref(c)) == rest);
        let mut message = match call {
            Some(mut c) => {
                c.arguments_json = self.syntax.written_arguments(&c);
                let id = self.syntax.call_id(&c.name, n);
                ChatMessage {
                    tool_calls: vec![ChatToolCall::new(id, c)],
                    ..ChatMessage::text("assistant", String::new())
                }
            }
            None => ChatMessage::text("assistant", rest.to_string()),
        };
        message.reasoning_content = reasoning;
        message
    }

    /// Messages as the template reads them, OpenAI-style. A call's `arguments` are the JSON
    /// object where the template writes them with `tojson` (DeepSeek-V3.1, Kimi K2), else the
    /// text the model wrote (Hermes templates write a string verbatim; DeepSeek-V3's
    /// concatenates it). DeepSeek-V3's and R1's templates write a turn's calls only when its
    /// `content` is null, so a call-only turn has null content in that syntax.
    pub fn template_messages(&self, messages: &[ChatMessage]) -> Vec<Value> {
        let object_arguments = matches!(
            self.syntax,
            ToolCallSyntax::DeepseekV31 | ToolCallSyntax::KimiK2
        );
        messages
            .iter()
            .map(|m| {
                let mut v = json!({"role": m.role, "content": m.content});
                if m.content.is_empty()
                    && !m.tool_calls.is_empty()
                    && self.syntax == ToolCallSyntax::DeepseekV3
                {
                    v["content"] = Value::Null;
                }
                if let Some(r) = &m.reasoning_content {
                    v["reasoning_content"] = r.clone().into();
                }
                if let Some(id) = &m.tool_call_id {
                    v["tool_call_id"] = id.clone().into();
                }
                if !m.tool_calls.is_empty() {
                    let calls: Vec<Value> = m
                        .tool_calls
                        .iter()
                        .map(|c| {
                            let text = Value::String(c.function.arguments.clone());
                            let arguments = if object_arguments {
                                serde_json::from_str(&c.function.arguments).unwrap_or(text)
                            } else {
                                text
                            };
                            let mut call = json!({"type": c.kind, "function": {
                                "name": c.function.name, "arguments": arguments}});
                            if let Some(id) = &c.id {
                                call["id"] = id.clone().into();
                            }
                            call
                        })
                        .collect();
                    v["tool_calls"] = calls.into();
                }
                v
            })
            .collect()
    }

    /// Whether the template renders the finished `conversation` otherwise than the episode's
    /// `ids` ([`divergence`](Self::divergence) without naming where: one rendering).
    pub fn diverges(&self, conversation: &Conversation, ids: &[u32]) -> bool {
        self.differing_texts(conversation, ids).is_some()
    }

    /// The index of the last assistant message, the template's rendering of the conversation
    /// through it and the episode's text (a last turn cut by the budget closed, as the
    /// template closes it), when the two differ (trailing whitespace aside); the rendering's
    /// error when it fails.
    fn differing_texts(
        &self,
        conversation: &Conversation,
        ids: &[u32],
    ) -> Option<Result<(usize, String, String), TokenizerError>> {
        let end = conversation
            .messages
            .iter()
            .rposition(|m| m.role == "assistant")?;
        let messages = self.template_messages(&conversation.messages[..=end]);
        let rendered = match self
            .turns
            .render(&messages, Some(&conversation.tools), false)
        {
            Ok(text) => text,
            Err(e) => return Some(Err(e)),
        };
        let eot = self.turns.end_of_turn();
        let mut stored = self.decode_lossy(ids).trim_end().to_string();
        if !stored.ends_with(eot) {
            stored.push_str(eot);
        }
        (rendered.trim_end() != stored).then_some(Ok((end, rendered, stored)))
    }

    /// Where the template's rendering of the finished `conversation` (through its last
    /// assistant turn) differs from the episode's `ids` as text: the turn, and what each
    /// holds there; `None` when they agree. Text, not ids, is compared, so a tokenisation
    /// the model sampled (or tool text spelling a special token, kept plain) is no
    /// difference; only what the template writes is.
    pub fn divergence(&self, conversation: &Conversation, ids: &[u32]) -> Option<String> {
        let (end, rendered, stored) = match self.differing_texts(conversation, ids)? {
            Ok(texts) => texts,
            Err(e) => return Some(format!("the finished conversation does not render: {e}")),
        };
        let (want, have) = (rendered.trim_end(), stored.as_str());
        let eot = self.turns.end_of_turn();
        let messages = self.template_messages(&conversation.messages[..=end]);
        let at = want
            .char_indices()
            .zip(have.chars())
            .find(|((_, a), b)| a != b)
            .map_or(want.len().min(have.len()), |((i, _), _)| i);
        let at = (0..=at)
            .rev()
            .find(|&i| have.is_char_boundary(i) && want.is_char_boundary(i))?;
        let context = (0..=at.saturating_sub(12))
            .rev()
            .find(|&i| have.is_char_boundary(i))
            .unwrap_or(0);
        let snippet = |s: &str| -> String { s[context..].chars().take(48).collect() };
        // The turn: how many assistant turns the template closes before the difference, each
        // one's end taken from its rendering of the conversation through that turn.
        let assistant: Vec<usize> = (0..=end)
            .filter(|&i| conversation.messages[i].role == "assistant")
            .collect();
        let turn = assistant
            .iter()
            .take_while(|&&i| {
                self.turns
                    .render(&messages[..=i], Some(&conversation.tools), false)
                    .ok()
                    .and_then(|t| t.rfind(eot).map(|e| e + eot.len()))
                    .is_some_and(|closed| closed <= at)
            })
            .count();
        Some(format!(
            "at assistant turn {turn} of {}, the episode holds {:?} where the template's rendering of the finished conversation holds {:?}",
            assistant.len(),
            snippet(have),
            snippet(want)
        ))
    }

    /// The tool's text in a context [`result_ids`](Self::result_ids) made after a turn that
    /// made `call` (none when it made no call): the segment's text with what the template
    /// writes around the result removed; the whole context's text when it is of another
    /// shape.
    pub fn tool_result_text(&self, context: &[u32], call: Option<&ToolCall>) -> String {
        self.result_text(context, call, 0, false)
    }

    /// [`tool_result_text`](Self::tool_result_text) of a folded segment's opening (`opening`)
    /// or of a plain tool-result context, the call made by the conversation's `n`-th
    /// assistant message (its id, where the template writes one, is the syntax's for `n`).
    pub(crate) fn result_text(
        &self,
        context: &[u32],
        call: Option<&ToolCall>,
        n: usize,
        opening: bool,
    ) -> String {
        let text = self.decode_lossy(context);
        let eos = self.turns.end_of_turn();
        let body = text.strip_prefix(eos).unwrap_or(&text);
        let mut assistant = ChatMessage::text("assistant", "ok");
        let mut tool = ChatMessage::text("tool", SENTINEL);
        if let Some(c) = call {
            let id = self.syntax.call_id(&c.name, n);
            assistant = ChatMessage {
                tool_calls: vec![ChatToolCall::new(id.clone(), c.clone())],
                ..ChatMessage::text("assistant", "")
            };
            tool.tool_call_id = Some(id);
        }
        let history = self.template_messages(&[ChatMessage::text("user", "stand-in"), assistant]);
        let frame = self
            .turns
            .segment_after_turn(&history, &self.template_messages(&[tool]), None)
            .ok();
        frame
            .as_deref()
            .and_then(|f| f.split_once(SENTINEL))
            .and_then(|(before, after)| {
                // A folded segment's opening ends with the latest turn's result, after the
                // prompt and the kept turns.
                let rest = match opening {
                    false => body.strip_prefix(before)?,
                    true => body.rsplit_once(before)?.1,
                };
                rest.strip_suffix(after)
            })
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
    /// The ids of the generation prompt that ends every context (ChatML's
    /// `<|im_start|>assistant\n`): what the template writes after a user turn's end, from its
    /// first non-whitespace character; empty when the template cannot tell.
    pub(crate) fn generation_prompt_ids(&self) -> Vec<u32> {
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

    /// The messages of a segment's turns (`(ids, loss mask)` each): the messages of
    /// `conversation` (the one the segment opened with: the episode's prompt, or after a fold
    /// what [`fold::read_opening`](crate::fold::read_opening) reads), each generated turn an assistant
    /// message ([`assistant_message`](Self::assistant_message)), each tool result a tool
    /// message answering the call before it (or answering nothing, when that turn made no
    /// call).
    pub(crate) fn to_messages(
        &self,
        turns: &[(Vec<u32>, Vec<bool>)],
        conversation: &Conversation,
    ) -> Vec<ChatMessage> {
        // A folded segment's conversation opens with the turns the fold kept, answered.
        let mut out = conversation.messages.clone();
        let kept = conversation.assistant_turns();
        let prompt_end = self.generation_prompt_ids();
        for (n, (ids, mask)) in turns.iter().enumerate() {
            let first_gen = Self::context_len(ids, mask, &prompt_end);
            if n > 0 {
                // The environment's answer to a turn without a call is laid out as a tool
                // message too, so it stays one (answering no call): the template writes it
                // back as the same ids.
                let answered = out
                    .last()
                    .filter(|m| m.role == "assistant")
                    .and_then(|m| m.tool_calls.first())
                    .cloned();
                let call = answered.as_ref().map(|c| c.function.call());
                let mut m = ChatMessage::text(
                    "tool",
                    self.result_text(&ids[..first_gen], call.as_ref(), kept + n - 1, false),
                );
                m.tool_call_id = answered.and_then(|c| c.id);
                out.push(m);
            }
            let generated = &ids[first_gen..];
            if !generated.is_empty() {
                out.push(self.assistant_message(generated, kept + n));
            }
        }
        out
    }

    /// How many of a turn's ids (`ids`, `mask` its loss mask) are its context, before what
    /// it generated: up to the first learnt id, or, in a turn learnt nowhere (a
    /// demonstration's mistake), up to the end of its last generation prompt (`prompt_end`,
    /// [`generation_prompt_ids`](Self::generation_prompt_ids)).
    pub(crate) fn context_len(ids: &[u32], mask: &[bool], prompt_end: &[u32]) -> usize {
        mask.iter().position(|m| *m).unwrap_or_else(|| {
            (!prompt_end.is_empty())
                .then(|| {
                    ids.windows(prompt_end.len())
                        .rposition(|w| w == prompt_end)
                        .map(|at| at + prompt_end.len())
                })
                .flatten()
                .unwrap_or(ids.len())
        })
    }

    /// What the model writes for the assistant message `messages[index]`: its reasoning (when
    /// it has `reasoning_content`) where the template puts it for a last turn, its text, its
    /// calls in the model's syntax, and the end of the turn.
    fn generated_text(
        &self,
        messages: &[ChatMessage],
        index: usize,
        tools: Option<&[Value]>,
    ) -> Result<String, TokenizerError> {
        let m = &messages[index];
        let eos = self.turns.end_of_turn();
        let mut think = String::new();
        if let Some(reasoning) = &m.reasoning_content {
            // The template's own text for the turn where it keeps the reasoning (Qwen3): its
            // rendering as the last message, after the generation prompt the history gets.
            let opened =
                self.turns
                    .render(&self.template_messages(&messages[..index]), tools, true)?;
            let closed =
                self.turns
                    .render(&self.template_messages(&messages[..=index]), tools, false)?;
            if let Some(turn) = closed.strip_prefix(opened.as_str()) {
                if let Some(end) = turn.find(eos).filter(|_| turn.contains(reasoning.as_str())) {
                    return Ok(turn[..end + eos.len()].to_string());
                }
            }
            // A template that drops reasoning (DeepSeek-V3.1): the block as the model writes
            // it after a generation prompt that may already open it.
            think = if opened.ends_with("<think>") {
                format!("{reasoning}</think>")
            } else if opened.ends_with("<think>\n") {
                format!("{reasoning}\n</think>\n\n")
            } else {
                format!("<think>\n{reasoning}\n</think>\n\n")
            };
        }
        let calls: Vec<ToolCall> = m.tool_calls.iter().map(|c| c.function.call()).collect();
        let sep = if m.content.is_empty() || calls.is_empty() {
            ""
        } else {
            "\n"
        };
        Ok(format!(
            "{think}{}{sep}{}{eos}",
            m.content,
            self.syntax.render(&calls)
        ))
    }

    /// A transcript laid out as an episode: the messages before the first assistant turn as
    /// the prompt (with `tools`), each assistant message as the model would write it
    /// ([`generated_text`](Self::generated_text): learnt), and the messages between as the
    /// segments after a turn, rendered against the transcript's real history and never
    /// re-rendering it.
    pub(crate) fn messages_to_ids(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
    ) -> Result<(Vec<u32>, Vec<bool>), TranscriptError> {
        let mut ids = Vec::new();
        let mut mask = Vec::new();
        let mut since: Option<usize> = None;
        let tools = (!tools.is_empty()).then_some(tools);
        let render_error = |index: usize, e: TokenizerError| TranscriptError::Render {
            index,
            message: e.to_string(),
        };
        for (index, m) in messages.iter().enumerate() {
            match m.role.as_str() {
                "system" | "user" | "tool" => continue,
                "assistant" => {}
                other => {
                    return Err(TranscriptError::UnknownRole {
                        index,
                        role: other.to_string(),
                    })
                }
            }
            for c in &m.tool_calls {
                serde_json::from_str::<Value>(&c.function.arguments)
                    .ok()
                    .filter(Value::is_object)
                    .ok_or_else(|| TranscriptError::Arguments {
                        index,
                        message: format!("{:?}", c.function.arguments),
                    })?;
            }
            let context = match since {
                Some(last) => self.turns.segment_after_turn(
                    &self.template_messages(&messages[..=last]),
                    &self.template_messages(&messages[last + 1..index]),
                    tools,
                ),
                None => self
                    .turns
                    .prompt(&self.template_messages(&messages[..index]), tools),
            }
            .and_then(|text| self.tokenizer.encode(&text))
            .map_err(|e| render_error(index, e))?;
            mask.extend(std::iter::repeat_n(false, context.len()));
            ids.extend(context);
            let generated = self
                .generated_text(messages, index, tools)
                .and_then(|text| self.tokenizer.encode(&text))
                .map_err(|e| render_error(index, e))?;
            mask.extend(std::iter::repeat_n(true, generated.len()));
            ids.extend(generated);
            since = Some(index);
        }
        if since.is_none() {
            return Err(TranscriptError::NoAssistant);
        }
        Ok((ids, mask))
    }
}
