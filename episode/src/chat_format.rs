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
use corvid_tokenizer::{special_tokens, ChatTemplate, HfTokenizer, TokenizerError, TurnRenderer};
use serde_json::{json, Value};

use crate::format::CallParseError;
use crate::tool_syntax::ToolCallSyntax;

/// A Hugging Face model's episode layout.
#[derive(Debug)]
pub struct ChatFormat {
    tokenizer: HfTokenizer,
    turns: TurnRenderer,
    syntax: ToolCallSyntax,
    eos: u32,
    pad: u32,
}

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
        Ok(ChatFormat {
            turns: TurnRenderer::new(template, specials, eos_text),
            tokenizer,
            syntax,
            eos,
            pad,
        })
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
        messages.push(json!({"role": "user", "content": user}));
        let text = self.turns.prompt(&messages, Some(tools))?;
        self.tokenizer.encode(&text)
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
            .segment_after_turn(&[json!({"role": "tool", "content": text})], Some(tools))?;
        let mut ids = Vec::new();
        if !ended {
            ids.push(self.eos);
        }
        ids.extend(self.tokenizer.encode(&segment)?);
        Ok(ids)
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
