//! A conversation as exact token ids, built turn by turn without ever re-rendering history.
//!
//! An episode's ids are the prompt the template renders, then for every turn the ids the model
//! generated (verbatim, ending with the end-of-turn token it stopped at) and the segment that
//! follows them: what the template writes after an assistant turn for the next messages (tool
//! results, a user turn) up to and including the next generation prompt. That segment is
//! rendered against a fixed stand-in history (a user message and an assistant reply), never
//! against the real one, so a template that rewrites earlier turns (Qwen3 drops the `<think>`
//! blocks of turns before the last user query) cannot change tokens the model already saw.
//!
//! Each segment is encoded on its own. A segment starts right after the end-of-turn special
//! token and ends with the generation prompt, so its boundaries are special tokens, where the
//! tokenizer splits anyway: for a template whose full rendering extends turn by turn, the
//! concatenation equals the tokenisation of the full rendering (tested on every fixture).

use serde_json::{json, Map, Value};

use crate::template::{ChatInput, ChatTemplate};
use crate::TokenizerError;

/// Renders a conversation's prompt and the segments between its generated turns.
#[derive(Debug)]
pub struct TurnRenderer {
    template: ChatTemplate,
    extra: Map<String, Value>,
    end_of_turn: String,
}

/// The stand-in reply the segments are rendered after.
const STAND_IN_REPLY: &str = "ok";

impl TurnRenderer {
    /// `end_of_turn` is the token text a generated assistant turn ends with (the tokenizer's
    /// `eos_token` for ChatML templates, `<|im_end|>`); `extra` (special tokens,
    /// `enable_thinking`, ...) goes into every rendering.
    pub fn new(
        template: ChatTemplate,
        extra: Map<String, Value>,
        end_of_turn: impl Into<String>,
    ) -> Self {
        TurnRenderer {
            template,
            extra,
            end_of_turn: end_of_turn.into(),
        }
    }

    /// The token text that ends a generated assistant turn.
    pub fn end_of_turn(&self) -> &str {
        &self.end_of_turn
    }

    fn render(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.template.render(&ChatInput {
            messages,
            tools,
            add_generation_prompt,
            extra: self.extra.clone(),
        })
    }

    /// The text that opens the conversation: `messages` (system, user) with `tools` declared,
    /// and the generation prompt.
    pub fn prompt(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
    ) -> Result<String, TokenizerError> {
        self.render(messages, tools, true)
    }

    /// The text after a generated assistant turn (which ended with the end-of-turn token) when
    /// `messages` follow it, through the next generation prompt; `tools` as in the prompt.
    pub fn segment_after_turn(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
    ) -> Result<String, TokenizerError> {
        let base = [
            json!({"role": "user", "content": "stand-in"}),
            json!({"role": "assistant", "content": STAND_IN_REPLY}),
        ];
        let before = self.render(&base, tools, false)?;
        let reply_end = format!("{STAND_IN_REPLY}{}", self.end_of_turn);
        let cut = before
            .rfind(&reply_end)
            .map(|at| at + reply_end.len())
            .ok_or_else(|| TokenizerError::Template {
                template: self.template.origin().to_string(),
                line: None,
                message: format!(
                    "an assistant turn does not end with {:?}: the end-of-turn token does not match the template",
                    self.end_of_turn
                ),
            })?;
        let mut all = base.to_vec();
        all.extend_from_slice(messages);
        let after = self.render(&all, tools, true)?;
        if !after.starts_with(&before[..cut]) {
            return Err(TokenizerError::Template {
                template: self.template.origin().to_string(),
                line: None,
                message: "rendering further messages changes an earlier assistant turn: the template does not extend turn by turn".into(),
            });
        }
        Ok(after[cut..].to_string())
    }
}
