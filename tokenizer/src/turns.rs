//! A conversation as exact token ids, built turn by turn without ever re-rendering history.
//!
//! An episode's ids are the prompt the template renders, then for every turn the ids the model
//! generated (verbatim, ending with the end-of-turn token it stopped at) and the segment that
//! follows them: what the template writes after that closed assistant turn for the next
//! messages (tool results, a user turn) up to and including the next generation prompt. The
//! segment is cut from the template's rendering of the real conversation (the history so far
//! and the new messages) at the boundary where the last assistant turn ends: the end-of-turn
//! token that closes it. What comes before the boundary is never used, so a template that
//! rewrites earlier turns (Qwen3 writes an empty `<think>` block only on the last assistant
//! turn, and drops reasoning before the last user query) cannot change tokens the model
//! already saw; the trajectory is what the policy saw.
//!
//! The boundary is found by counting: the rendering of the history alone (ending with the
//! assistant turn, no generation prompt) holds `n` end-of-turn tokens, and the segment starts
//! right after the `n`-th one of the longer rendering. Templates rewrite the text of earlier
//! turns, never how many turns there are.
//!
//! Each segment is encoded on its own. A segment starts right after the end-of-turn special
//! token and ends with the generation prompt, so its boundaries are special tokens, where the
//! tokenizer splits anyway: for a template whose full rendering extends turn by turn, the
//! concatenation equals the tokenisation of the full rendering (tested on every fixture).

use serde_json::{Map, Value};

use crate::template::{ChatInput, ChatTemplate};
use crate::TokenizerError;

/// Renders a conversation's prompt and the segments between its generated turns.
#[derive(Debug)]
pub struct TurnRenderer {
    template: ChatTemplate,
    extra: Map<String, Value>,
    end_of_turn: String,
}

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

    /// The template.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// `messages` rendered whole, with the generation prompt when `add_generation_prompt`.
    pub fn render(
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

    fn error(&self, message: String) -> TokenizerError {
        TokenizerError::Template {
            template: self.template.origin().to_string(),
            line: None,
            message,
        }
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

    /// The text after the generated assistant turn that ends `history` (closed by the
    /// end-of-turn token) when `new` messages follow it, through the next generation prompt;
    /// `tools` as in the prompt. Cut from the rendering of `history` and `new` together, so the
    /// segment is what the template writes for this conversation (a tool result that names
    /// its call's id, a template that counts turns), while nothing before it is re-rendered.
    pub fn segment_after_turn(
        &self,
        history: &[Value],
        new: &[Value],
        tools: Option<&[Value]>,
    ) -> Result<String, TokenizerError> {
        if history.last().and_then(|m| m["role"].as_str()) != Some("assistant") {
            return Err(self.error(
                "a segment follows an assistant turn: the history must end with one".into(),
            ));
        }
        let closed = self.render(history, tools, false)?;
        let turns = closed.matches(self.end_of_turn.as_str()).count();
        if turns == 0 || !closed.trim_end().ends_with(self.end_of_turn.as_str()) {
            return Err(self.error(format!(
                "an assistant turn does not end with {:?}: the end-of-turn token does not match the template",
                self.end_of_turn
            )));
        }
        let mut all = history.to_vec();
        all.extend_from_slice(new);
        let full = self.render(&all, tools, true)?;
        let boundary = full
            .match_indices(self.end_of_turn.as_str())
            .nth(turns - 1)
            .map(|(at, m)| at + m.len())
            .ok_or_else(|| {
                self.error(format!(
                    "rendering {} more message(s) leaves fewer than the {turns} {:?} tokens of the history: the template drops turns",
                    new.len(),
                    self.end_of_turn
                ))
            })?;
        Ok(full[boundary..].to_string())
    }
}
