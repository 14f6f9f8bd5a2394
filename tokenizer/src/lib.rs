//! corvid-tokenizer: text to token ids and back. It knows no tasks and no tensors.
//!
//! # Brief overview
//!
//! - [`ByteTokenizer`]: ids 0..=255 are bytes; [`Special`] tokens follow (system, user,
//!   assistant and tool turn headers, `<tool_call>`, `</tool_call>`, `<|end|>`, `<|pad|>`), 264
//!   ids in all. Any id sequence round-trips exactly through [`ByteTokenizer::decode_bytes`] /
//!   [`ByteTokenizer::encode_bytes`] (specials included, since their text is reserved).
//! - [`render_chat`] renders messages to token ids plus a per-token [`Role`] and loss mask, so
//!   the trainer masks everything but assistant output.
//! - [`HfTokenizer`] wraps the `tokenizers` crate for a `tokenizer.json`; [`ChatTemplate`]
//!   renders its folder's Jinja `chat_template` as transformers' `apply_chat_template` does
//!   (same text, so the same ids), with the folder's [`special_tokens`] in the context;
//!   [`TurnRenderer`] gives an episode's prompt and the segments between generated turns
//!   without re-rendering history.
//! - [`Tokenizer`] is what an episode format asks of either: plain text (never a special),
//!   text with specials, decoding, and a special token's id by its text.
//!
//! Text from users and tools is encoded with [`ByteTokenizer::encode_plain`], which never
//! yields a special token: a tool cannot forge `<tool_call>` or end a turn. Assistant text is
//! parsed for `<tool_call>` / `</tool_call>` (the model emits them as single tokens).
//!
//! ```
//! use corvid_tokenizer::{render_chat, ByteTokenizer, Message, Role};
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

#![deny(missing_docs)]

mod byte;
mod chat;
mod hf;
mod template;
mod turns;

pub use byte::{ByteTokenizer, Special};
pub use chat::{render_chat, Message, RenderedChat, Role};
pub use hf::HfTokenizer;
pub use template::{python_json, special_tokens, ChatInput, ChatTemplate};
pub use turns::TurnRenderer;

/// What an episode format needs of a tokenizer: ids for text, with and without special
/// tokens, text for ids, and the id of a special token by its text.
pub trait Tokenizer: Send + Sync {
    /// Ids are `0..vocab_size()`.
    fn vocab_size(&self) -> u32;
    /// Text as ordinary tokens: never a special token, whatever the text says (tool output
    /// and user text cannot forge a turn marker).
    fn encode_plain(&self, text: &str) -> Result<Vec<u32>, TokenizerError>;
    /// Text with every special token's text read as that token.
    fn encode_with_specials(&self, text: &str) -> Result<Vec<u32>, TokenizerError>;
    /// The text of `ids`, special tokens written as their text.
    fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError>;
    /// The id of the special token spelled `text`, if the tokenizer has one.
    fn special_id(&self, text: &str) -> Option<u32>;
}

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
    /// A chat template failed to compile or render.
    #[error("chat template {template}{}: {message}", line.map(|l| format!(", line {l}")).unwrap_or_default())]
    Template {
        /// Where the template came from.
        template: String,
        /// The template line, when known.
        line: Option<usize>,
        /// What went wrong.
        message: String,
    },
    /// A tokenizer folder's file is missing or wrong.
    #[error("{file}: {problem}")]
    Config {
        /// The file.
        file: String,
        /// What is wrong with it.
        problem: String,
    },
}
