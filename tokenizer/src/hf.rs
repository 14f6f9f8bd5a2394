//! A Hugging Face `tokenizer.json`, through the `tokenizers` crate.

use std::collections::HashSet;
use std::path::Path;

use crate::{Tokenizer, TokenizerError};

/// A Hugging Face `tokenizer.json` through the `tokenizers` crate.
pub struct HfTokenizer {
    /// Reads the text of added special tokens as those tokens.
    inner: tokenizers::Tokenizer,
    /// The same tokenizer with special tokens encoded as ordinary text (Python's
    /// `split_special_tokens=True`): for text that must never produce one.
    plain: tokenizers::Tokenizer,
    /// Ids of the added tokens marked `special`.
    specials: HashSet<u32>,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

fn hf_error(what: impl Into<String>) -> impl FnOnce(tokenizers::Error) -> TokenizerError {
    let what = what.into();
    move |e| TokenizerError::Hf {
        what,
        message: e.to_string(),
    }
}

impl HfTokenizer {
    /// Loads a `tokenizer.json` file.
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let inner =
            tokenizers::Tokenizer::from_file(path).map_err(hf_error(path.display().to_string()))?;
        Ok(Self::wrap(inner))
    }

    /// Parses `tokenizer.json` bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(hf_error("bytes"))?;
        Ok(Self::wrap(inner))
    }

    fn wrap(inner: tokenizers::Tokenizer) -> Self {
        let specials = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);
        HfTokenizer {
            inner,
            plain,
            specials,
        }
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Token ids of `text` (special tokens in the text are recognised; no template added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.inner.encode(text, false).map_err(hf_error("encode"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids` (special tokens kept).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner.decode(ids, false).map_err(hf_error("decode"))
    }

    /// The id of a token string, if in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Whether `id` is an added token marked `special`.
    pub fn is_special(&self, id: u32) -> bool {
        self.specials.contains(&id)
    }
}

impl Tokenizer for HfTokenizer {
    fn vocab_size(&self) -> u32 {
        HfTokenizer::vocab_size(self) as u32
    }

    fn encode_plain(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.plain.encode(text, false).map_err(hf_error("encode"))?;
        Ok(enc.get_ids().to_vec())
    }

    fn encode_with_specials(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        HfTokenizer::encode(self, text)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        HfTokenizer::decode(self, ids)
    }

    fn special_id(&self, text: &str) -> Option<u32> {
        self.token_to_id(text).filter(|&id| self.is_special(id))
    }
}
