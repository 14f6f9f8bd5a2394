//! The byte tokenizer of Corvid's own policies: ids 0..=255 are bytes, eight [`Special`]
//! tokens follow. Any id sequence round-trips exactly through [`ByteTokenizer::decode_bytes`]
//! / [`ByteTokenizer::encode_bytes`] (specials included, since their text is reserved).

use serde::{Deserialize, Serialize};

use crate::{Tokenizer, TokenizerError};

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

impl Tokenizer for ByteTokenizer {
    fn vocab_size(&self) -> u32 {
        Self::VOCAB_SIZE
    }

    fn encode_plain(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        Ok(ByteTokenizer::encode_plain(self, text))
    }

    fn encode_with_specials(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        Ok(ByteTokenizer::encode(self, text))
    }

    fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        Ok(ByteTokenizer::decode(self, ids))
    }

    fn special_id(&self, text: &str) -> Option<u32> {
        Special::ALL
            .into_iter()
            .find(|s| s.text() == text)
            .map(Special::id)
    }
}
