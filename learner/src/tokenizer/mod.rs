//! Byte-level tokenizer, chat template, and Hugging Face `tokenizer.json` loading.
//!
//! # Brief overview
//!
//! - [`ByteTokenizer`]: ids 0..=255 are bytes; [`Special`] tokens follow (system, user,
//!   assistant and tool turn headers, `<tool_call>`, `</tool_call>`, `<|end|>`, `<|pad|>`), 264
//!   ids in all. Any id sequence round-trips exactly through [`ByteTokenizer::decode_bytes`] /
//!   [`ByteTokenizer::encode_bytes`] (specials included, since their text is reserved).
//! - [`render_chat`] renders messages to token ids plus a per-token [`Role`] and loss mask, so
//!   the trainer masks everything but assistant output.
//! - [`HfTokenizer`] wraps the `tokenizers` crate for a `tokenizer.json`.
//!
//! Text from users and tools is encoded with [`ByteTokenizer::encode_plain`], which never
//! yields a special token: a tool cannot forge `<tool_call>` or end a turn. Assistant text is
//! parsed for `<tool_call>` / `</tool_call>` (the model emits them as single tokens).
//!
//! ```
//! use corvid_learner::tokenizer::{render_chat, ByteTokenizer, Message, Role};
//! let tok = ByteTokenizer::new();
//! let chat = render_chat(&tok, &[
//!     Message::new(Role::User, "Find the value."),
//!     Message::new(Role::Assistant, "<tool_call>{\"name\":\"read_file\"}</tool_call>"),
//! ]);
//! assert_eq!(chat.ids.len(), chat.roles.len());
//! assert_eq!(tok.decode(&chat.ids), "<|user|>Find the value.<|end|><|assistant|><tool_call>{\"name\":\"read_file\"}</tool_call><|end|>");
//! // Only the assistant's content and its end token are trained on.
//! let trained: Vec<u32> = chat.ids.iter().zip(&chat.loss_mask).filter(|(_, m)| **m).map(|(i, _)| *i).collect();
//! assert_eq!(tok.decode(&trained), "<tool_call>{\"name\":\"read_file\"}</tool_call><|end|>");
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Tokenizer errors.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The Hugging Face tokenizer failed to load or run.
    #[error("tokenizer {what}: {message}")]
    Hf {
        /// What was being done (the file, or `encode`/`decode`).
        what: String,
        /// The library's message.
        message: String,
    },
}

/// Special tokens, in id order after the 256 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Special {
    /// `<|system|>` opens a system turn.
    System,
    /// `<|user|>` opens a user turn.
    User,
    /// `<|assistant|>` opens an assistant turn.
    Assistant,
    /// `<|tool|>` opens a tool-result turn.
    Tool,
    /// `<tool_call>` opens a tool call inside an assistant turn.
    ToolCallOpen,
    /// `</tool_call>` closes it.
    ToolCallClose,
    /// `<|end|>` ends a turn.
    End,
    /// `<|pad|>` pads a batch (never trained on).
    Pad,
}

impl Special {
    /// All specials in id order.
    pub const ALL: [Special; 8] = [
        Special::System,
        Special::User,
        Special::Assistant,
        Special::Tool,
        Special::ToolCallOpen,
        Special::ToolCallClose,
        Special::End,
        Special::Pad,
    ];

    /// The token id.
    pub fn id(self) -> u32 {
        256 + Self::ALL.iter().position(|s| *s == self).expect("listed") as u32
    }

    /// The reserved text.
    pub fn text(self) -> &'static str {
        match self {
            Special::System => "<|system|>",
            Special::User => "<|user|>",
            Special::Assistant => "<|assistant|>",
            Special::Tool => "<|tool|>",
            Special::ToolCallOpen => "<tool_call>",
            Special::ToolCallClose => "</tool_call>",
            Special::End => "<|end|>",
            Special::Pad => "<|pad|>",
        }
    }

    /// The special with this id, if any.
    pub fn from_id(id: u32) -> Option<Special> {
        id.checked_sub(256)
            .and_then(|i| Self::ALL.get(i as usize).copied())
    }
}

/// Byte-level tokenizer with [`Special`] tokens.
#[derive(Clone, Debug, Default)]
pub struct ByteTokenizer;

impl ByteTokenizer {
    /// Vocabulary size: 256 bytes + 8 specials.
    pub const VOCAB_SIZE: u32 = 264;

    /// The tokenizer (stateless).
    pub fn new() -> Self {
        ByteTokenizer
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> u32 {
        Self::VOCAB_SIZE
    }

    /// Bytes only: never produces a special, whatever the text says.
    pub fn encode_plain(&self, text: &str) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }

    /// Parses every special token's text into its id; the rest becomes bytes.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.encode_bytes(text.as_bytes())
    }

    /// [`Self::encode`] over raw bytes: the exact inverse of [`Self::decode_bytes`].
    pub fn encode_bytes(&self, bytes: &[u8]) -> Vec<u32> {
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        'outer: while i < bytes.len() {
            if bytes[i] == b'<' {
                for s in Special::ALL {
                    if bytes[i..].starts_with(s.text().as_bytes()) {
                        out.push(s.id());
                        i += s.text().len();
                        continue 'outer;
                    }
                }
            }
            out.push(u32::from(bytes[i]));
            i += 1;
        }
        out
    }

    /// Only the tool-call markers are parsed (assistant content).
    pub fn encode_assistant(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut rest = text;
        loop {
            let next = [Special::ToolCallOpen, Special::ToolCallClose]
                .into_iter()
                .filter_map(|s| rest.find(s.text()).map(|at| (at, s)))
                .min_by_key(|(at, _)| *at);
            match next {
                Some((at, s)) => {
                    out.extend(self.encode_plain(&rest[..at]));
                    out.push(s.id());
                    rest = &rest[at + s.text().len()..];
                }
                None => {
                    out.extend(self.encode_plain(rest));
                    return out;
                }
            }
        }
    }

    /// Bytes of `ids`, specials written as their text; ids ≥ 264 are skipped.
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            if id < 256 {
                out.push(id as u8);
            } else if let Some(s) = Special::from_id(id) {
                out.extend_from_slice(s.text().as_bytes());
            }
        }
        out
    }

    /// Text of `ids` (invalid UTF-8 replaced).
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids)).into_owned()
    }
}

/// Who speaks a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// System prompt.
    System,
    /// The user (task prompt).
    User,
    /// The policy.
    Assistant,
    /// A tool result.
    Tool,
}

impl Role {
    /// The header token of the role's turns.
    pub fn header(self) -> Special {
        match self {
            Role::System => Special::System,
            Role::User => Special::User,
            Role::Assistant => Special::Assistant,
            Role::Tool => Special::Tool,
        }
    }
}

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Speaker.
    pub role: Role,
    /// Text.
    pub content: String,
}

impl Message {
    /// A message.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
        }
    }
}

/// A rendered conversation: ids with the role and loss mask of each token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RenderedChat {
    /// Token ids.
    pub ids: Vec<u32>,
    /// The role of the turn each token belongs to (headers included).
    pub roles: Vec<Role>,
    /// True for tokens the policy produced: assistant content and its `<|end|>` (not the
    /// `<|assistant|>` header, which the prompt supplies).
    pub loss_mask: Vec<bool>,
}

impl RenderedChat {
    fn push(&mut self, ids: &[u32], role: Role, trained: bool) {
        self.ids.extend_from_slice(ids);
        self.roles.extend(std::iter::repeat_n(role, ids.len()));
        self.loss_mask
            .extend(std::iter::repeat_n(trained, ids.len()));
    }

    /// Appends `<|assistant|>` so the model continues with an assistant turn.
    pub fn add_generation_prompt(&mut self) {
        self.push(&[Special::Assistant.id()], Role::Assistant, false);
    }
}

/// Renders `<|role|>content<|end|>` per message. Assistant content is parsed for tool-call
/// markers; other content is plain bytes.
pub fn render_chat(tok: &ByteTokenizer, messages: &[Message]) -> RenderedChat {
    let mut out = RenderedChat::default();
    for m in messages {
        let assistant = m.role == Role::Assistant;
        out.push(&[m.role.header().id()], m.role, false);
        let body = if assistant {
            tok.encode_assistant(&m.content)
        } else {
            tok.encode_plain(&m.content)
        };
        out.push(&body, m.role, assistant);
        out.push(&[Special::End.id()], m.role, assistant);
    }
    out
}

/// A Hugging Face `tokenizer.json` through the `tokenizers` crate.
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl HfTokenizer {
    /// Loads a `tokenizer.json` file.
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError::Hf {
            what: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(HfTokenizer { inner })
    }

    /// Parses `tokenizer.json` bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| TokenizerError::Hf {
            what: "bytes".into(),
            message: e.to_string(),
        })?;
        Ok(HfTokenizer { inner })
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Token ids of `text` (special tokens in the text are recognised; no template added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| TokenizerError::Hf {
                what: "encode".into(),
                message: e.to_string(),
            })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids` (special tokens kept).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| TokenizerError::Hf {
                what: "decode".into(),
                message: e.to_string(),
            })
    }

    /// The id of a token string, if in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}
