//! Chat transcripts: an episode's steps read back as an OpenAI-style chat, and a chat laid out
//! as an episode's exact tokens (`corvid replay export --format chat`, SFT imports).

use corvid_proto::{Step, ToolCall};
use corvid_tokenizer::{ByteTokenizer, Special};
use serde::{Deserialize, Serialize};

use crate::chat_format::ChatFormat;
use crate::format::EpisodeFormat;

/// One message of an OpenAI-style chat transcript, the interchange format of
/// `corvid replay export --format chat` and of SFT imports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text (for an assistant turn that only calls a tool: empty; `null` reads as empty).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub content: String,
    /// On an assistant message in a model's own layout: the text the model wrote inside its
    /// `<think>` block (the field Qwen3's and DeepSeek's templates read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The assistant's tool calls (at most one per turn in Corvid).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ChatToolCall>,
    /// On a `tool` message: the `id` of the call it answers (always set on export, where
    /// the environment's answer to a malformed turn is a `user` message; ignored on import).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// A tool call inside a [`ChatMessage`]: `{"type": "function", "function": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatToolCall {
    /// The call's id, which the `tool` message answering it names (`call_<n>` on export, n the step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Always `function`.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// The call.
    pub function: ChatFunction,
}

fn function_type() -> String {
    "function".into()
}

impl ChatMessage {
    /// A message of `role` holding `content` only.
    pub fn text(role: &str, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// The messages an episode is built from, as its template reads them, and the task's tools:
/// the prompt's messages (a system turn where the layout has one, the user's task), then each
/// generated turn as an assistant message and each tool result as a tool message. An episode
/// keeps one beside its ids: a model's own layout renders the segment after each turn against
/// it, and a chat export takes its system and user text from it, never from decoded ids.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    /// The messages so far.
    pub messages: Vec<ChatMessage>,
    /// The task's tools in OpenAI function format.
    pub tools: Vec<serde_json::Value>,
}

impl Conversation {
    /// The prompt's messages (those before the first assistant message).
    pub fn prompt(&self) -> &[ChatMessage] {
        let end = self
            .messages
            .iter()
            .position(|m| m.role == "assistant")
            .unwrap_or(self.messages.len());
        &self.messages[..end]
    }

    /// How many assistant messages it holds.
    pub fn assistant_turns(&self) -> usize {
        self.messages
            .iter()
            .filter(|m| m.role == "assistant")
            .count()
    }
}

impl ChatToolCall {
    /// The call `call` with the id `id`.
    pub fn new(id: String, call: ToolCall) -> Self {
        ChatToolCall {
            id: Some(id),
            kind: function_type(),
            function: ChatFunction {
                name: call.name,
                arguments: call.arguments_json,
            },
        }
    }
}

/// Name and JSON-string arguments of a call, as OpenAI writes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatFunction {
    /// Tool name.
    pub name: String,
    /// The arguments as a JSON string, exactly as the model wrote them. An imported
    /// transcript may give them as a JSON object instead (as transformers' templates take
    /// them), read as its JSON text.
    #[serde(deserialize_with = "string_or_object")]
    pub arguments: String,
}

impl ChatFunction {
    /// The call, as a turn's parse gives it.
    pub fn call(&self) -> ToolCall {
        ToolCall {
            name: self.name.clone(),
            arguments_json: self.arguments.clone(),
        }
    }
}

/// A string, or `null` as the empty string (OpenAI writes a call-only turn's content so).
fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

/// A string as it is, any other JSON value as a template's `tojson` writes it.
fn string_or_object<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s,
        other => corvid_tokenizer::python_json(&other),
    })
}

/// A piece of a context's ids read back ([`EpisodeFormat::to_messages`]).
enum ContextPart {
    /// A system, user or tool message.
    Message(ChatMessage),
    /// An assistant turn kept in a folded segment's opening context: its ids.
    Assistant(Vec<u32>),
}

/// Why a chat transcript cannot be laid out as an episode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranscriptError {
    /// A role other than system, user, assistant, tool.
    #[error("message {index}: unknown role {role:?} (use system, user, assistant or tool)")]
    UnknownRole {
        /// Message index.
        index: usize,
        /// The role given.
        role: String,
    },
    /// More than one tool call in an assistant message.
    #[error("message {index}: {n} tool calls in one assistant turn; Corvid makes one per turn")]
    SeveralCalls {
        /// Message index.
        index: usize,
        /// How many.
        n: usize,
    },
    /// A call's arguments are not a JSON object.
    #[error("message {index}: tool call arguments are not a JSON object: {message}")]
    Arguments {
        /// Message index.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// No assistant turn: nothing to train on.
    #[error("the transcript has no assistant message")]
    NoAssistant,
    /// The model's chat template or tokenizer could not lay the messages out.
    #[error("message {index}: the chat template cannot lay it out: {message}")]
    Render {
        /// Index of the message whose turn failed.
        index: usize,
        /// What went wrong.
        message: String,
    },
}

impl EpisodeFormat {
    /// Reads an episode's steps back as an OpenAI-style chat transcript, valid for the
    /// chat format other SFT tools expect:
    ///
    /// - turn 0's context gives the `system` and `user` messages, and each turn's generated
    ///   tokens an `assistant` message;
    /// - a turn whose call parses is an assistant message carrying it in `tool_calls` (id
    ///   `call_<n>`, `n` the step), with the text it wrote before `<tool_call>` as `content`;
    ///   the tool output that opens the next turn is the `tool` message answering it
    ///   (`tool_call_id = call_<n>`), right after it;
    /// - a malformed turn (no call, an unclosed one, bad JSON, …) is an assistant message
    ///   without `tool_calls`, whose `content` is what the policy wrote; the error the
    ///   environment answered it with (`error: invalid_call: …`) is a `user` message, since a
    ///   `tool` message may only answer a call of the assistant message before it;
    /// - `content` is plain text: Corvid's special tokens (`<|assistant|>`, `<tool_call>`,
    ///   `</tool_call>`, `<|end|>`, …) are the layout that roles and `tool_calls` stand for,
    ///   and are left out, so an assistant message never holds them (a malformed call keeps
    ///   its JSON text, without the tags). The system, user and tool messages are exactly
    ///   the text the policy read, which may spell a tag as plain text (the call syntax that
    ///   the system turn and a parse error show);
    /// - the episode's last call (the `answer` that ends it, or a call cut off by the turn or
    ///   context limit) has no `tool` reply: no turn read its result (the verdict is the
    ///   export's `success` and `reward`). A transcript that ends with an assistant message
    ///   with `tool_calls` is the shape of OpenAI's function-calling fine-tuning examples.
    ///
    /// [`from_messages`](Self::from_messages) lays a transcript of well-formed turns out as
    /// the episode's exact tokens; one with a malformed turn comes back different (its error
    /// is a user turn, and the special tokens it wrote are gone): `--format raw` keeps those.
    ///
    /// In a model's own layout the prompt gives the `user` message (the tools are the
    /// template's, not a message); a generated turn's `<think>` block is its
    /// `reasoning_content`, and a turn that is exactly one call in the model's syntax (after
    /// its reasoning) carries it in `tool_calls` with empty `content`, which the template
    /// writes back as the same text; any other turn is verbatim `content`, and the error it
    /// got stays a `tool` message (without `tool_call_id`), as it was laid out. Rendered
    /// with the task's tools, such a transcript is the episode's text wherever the template
    /// extends turn by turn ([`ChatFormat::divergence`](crate::ChatFormat::divergence) names
    /// where it does not).
    ///
    /// `conversation` is the one the episode was built from (see
    /// [`conversation`](Self::conversation)): a model's own layout takes the prompt's messages
    /// from it, since text cannot be parsed back out of a template's rendering; the byte
    /// layout reads them from the ids, whose markers are unambiguous.
    ///
    /// For a segment after a fold, `conversation` is the one it opened with
    /// ([`segment_conversation`](Self::segment_conversation)).
    pub fn to_messages(&self, steps: &[Step], conversation: &Conversation) -> Vec<ChatMessage> {
        if let Some(chat) = self.chat_format() {
            return chat.to_messages(&joined_turns(steps), conversation);
        }
        let mut out = Vec::new();
        // The call of the latest assistant message, until the tool message answering it.
        let mut unanswered: Option<String> = None;
        let mut kept = 0;
        for (n, (token_ids, loss_mask)) in joined_turns(steps).iter().enumerate() {
            let first_gen = loss_mask.iter().position(|m| *m).unwrap_or(token_ids.len());
            let mut context = Vec::new();
            // Only a folded segment's opening (its first turn) holds turns the policy wrote;
            // elsewhere an unlearnt turn (a demonstration's mistake) reads as before.
            let opening = n == 0 && steps.first().is_some_and(|s| s.segment > 0);
            self.context_messages(&token_ids[..first_gen], opening, &mut context);
            for part in context {
                let mut m = match part {
                    // A turn a fold kept in a new segment's opening context.
                    ContextPart::Assistant(ids) => {
                        kept += 1;
                        let (m, call) = self.assistant_message(&ids, format!("call_kept{kept}"));
                        unanswered = call;
                        out.push(m);
                        continue;
                    }
                    ContextPart::Message(m) => m,
                };
                if m.role == "tool" {
                    match unanswered.take() {
                        Some(id) => m.tool_call_id = Some(id),
                        // The environment's answer to a turn that made no call.
                        None => m.role = "user".into(),
                    }
                }
                out.push(m);
            }
            let generated = &token_ids[first_gen..];
            if generated.is_empty() {
                continue;
            }
            let (message, call) = self.assistant_message(generated, format!("call_{n}"));
            unanswered = call;
            out.push(message);
        }
        out
    }

    /// The conversation the context segment of `steps` opened with, for
    /// [`to_messages`](Self::to_messages): `base` (the task's prompt) for an episode's first
    /// segment and in the byte layout, which reads a fold's opening from its markers; after a
    /// fold in a model's own layout, the prompt with the carried memory and the turns the fold
    /// kept, read back from the segment's first context ([`fold::read_opening`]). `None` when
    /// that context is not one a fold of `base` lays out.
    ///
    /// [`fold::read_opening`]: crate::fold::read_opening
    pub fn segment_conversation(
        &self,
        steps: &[Step],
        base: &Conversation,
    ) -> Option<Conversation> {
        let chat = match self.chat_format() {
            Some(chat) if steps.first().is_some_and(|s| s.segment > 0) => chat,
            _ => return Some(base.clone()),
        };
        // The first turn's steps (an actor splits a long turn): its context is the opening.
        let first = steps.iter().take_while(|s| s.turn == steps[0].turn).count();
        let turns = joined_turns(&steps[..first]);
        let (ids, mask) = turns.first()?;
        let context = ChatFormat::context_len(ids, mask, &chat.generation_prompt_ids());
        crate::fold::read_opening(self, base, &ids[..context]).map(|s| s.conversation)
    }

    /// The assistant message of the byte layout's turn `generated`: its call in `tool_calls`
    /// under `id` (returned) with the text before it as content, or, for a malformed turn,
    /// what it wrote as text (no id).
    fn assistant_message(&self, generated: &[u32], id: String) -> (ChatMessage, Option<String>) {
        match self.parse_call(generated) {
            Ok(c) => {
                let open = Special::ToolCallOpen.id();
                let text_end = generated
                    .iter()
                    .position(|&t| t == open)
                    .unwrap_or(generated.len());
                let message = ChatMessage {
                    role: "assistant".into(),
                    content: self.plain_text(&generated[..text_end]),
                    reasoning_content: None,
                    tool_calls: vec![ChatToolCall {
                        id: Some(id.clone()),
                        kind: function_type(),
                        function: ChatFunction {
                            name: c.name,
                            arguments: c.arguments_json,
                        },
                    }],
                    tool_call_id: None,
                };
                (message, Some(id))
            }
            // A malformed turn: what the policy wrote, as text.
            Err(_) => (
                ChatMessage {
                    role: "assistant".into(),
                    content: self.plain_text(generated),
                    reasoning_content: None,
                    tool_calls: Vec::new(),
                    tool_call_id: None,
                },
                None,
            ),
        }
    }

    /// The text of `ids` without Corvid's special tokens.
    pub(crate) fn plain_text(&self, ids: &[u32]) -> String {
        let plain: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&t| Special::from_id(t).is_none())
            .collect();
        self.decode(&plain)
    }

    /// The messages of a context's ids: the system, user and tool turns as text, and, with
    /// `kept_turns` (a folded segment's opening), the assistant turns the fold kept as their
    /// ids; other assistant text in a context is left out, as is the assistant header that
    /// opens the next generated turn.
    fn context_messages(&self, ids: &[u32], kept_turns: bool, out: &mut Vec<ContextPart>) {
        let mut role: Option<&str> = None;
        let mut body: Vec<u32> = Vec::new();
        let flush = |role: Option<&str>, body: &mut Vec<u32>, out: &mut Vec<ContextPart>| {
            match role {
                Some("assistant") if kept_turns && !body.is_empty() => {
                    out.push(ContextPart::Assistant(std::mem::take(body)))
                }
                Some("assistant") | None => {}
                Some(r) => out.push(ContextPart::Message(ChatMessage::text(
                    r,
                    self.plain_text(body),
                ))),
            }
            body.clear();
        };
        for &t in ids {
            let header = match Special::from_id(t) {
                Some(Special::System) => Some("system"),
                Some(Special::User) => Some("user"),
                Some(Special::Tool) => Some("tool"),
                Some(Special::Assistant) => Some("assistant"),
                Some(Special::End) | Some(Special::Pad) => {
                    flush(role.take(), &mut body, out);
                    continue;
                }
                _ => None,
            };
            match header {
                Some(r) => {
                    flush(role.take(), &mut body, out);
                    role = Some(r);
                }
                None => body.push(t),
            }
        }
        flush(role, &mut body, out);
    }

    /// Lays out a chat transcript (for example an imported SFT file) in the episode format:
    /// token ids and the loss mask, true on exactly what the assistant writes — its text,
    /// its call, and the end of its turn (`<|end|>` when the byte layout's turn makes no
    /// call). A model's own layout declares `tools` in its template; the byte layout reads
    /// them from a system message.
    pub fn from_messages(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
    ) -> Result<(Vec<u32>, Vec<bool>), TranscriptError> {
        if let Some(chat) = self.chat_format() {
            return chat.messages_to_ids(messages, tools);
        }
        let tokenizer = ByteTokenizer::new();
        let mut ids = Vec::new();
        let mut mask = Vec::new();
        let mut push = |t: &[u32], m: bool, ids: &mut Vec<u32>| {
            ids.extend_from_slice(t);
            mask.extend(std::iter::repeat_n(m, t.len()));
        };
        let mut any_assistant = false;
        for (index, m) in messages.iter().enumerate() {
            let header = match m.role.as_str() {
                "system" => Special::System,
                "user" => Special::User,
                "tool" => Special::Tool,
                "assistant" => Special::Assistant,
                other => {
                    return Err(TranscriptError::UnknownRole {
                        index,
                        role: other.to_string(),
                    })
                }
            };
            push(&[header.id()], false, &mut ids);
            if header != Special::Assistant {
                push(&tokenizer.encode_plain(&m.content), false, &mut ids);
                push(&[Special::End.id()], false, &mut ids);
                continue;
            }
            any_assistant = true;
            if m.tool_calls.len() > 1 {
                return Err(TranscriptError::SeveralCalls {
                    index,
                    n: m.tool_calls.len(),
                });
            }
            push(&tokenizer.encode_plain(&m.content), true, &mut ids);
            match m.tool_calls.first() {
                Some(c) => {
                    let args: serde_json::Value = serde_json::from_str(&c.function.arguments)
                        .ok()
                        .filter(serde_json::Value::is_object)
                        .ok_or_else(|| TranscriptError::Arguments {
                            index,
                            message: format!("{:?}", c.function.arguments),
                        })?;
                    let call = self.call_ids(&c.function.name, &args).map_err(|e| {
                        TranscriptError::Render {
                            index,
                            message: e.to_string(),
                        }
                    })?;
                    push(&call, true, &mut ids);
                    // The `<|end|>` after a call opens the next turn's context.
                    if index + 1 < messages.len() {
                        push(&[Special::End.id()], false, &mut ids);
                    }
                }
                None => push(&[Special::End.id()], true, &mut ids),
            }
        }
        if !any_assistant {
            return Err(TranscriptError::NoAssistant);
        }
        Ok((ids, mask))
    }
}

/// Each turn's tokens and loss mask, its steps joined: an actor splits a turn longer than its
/// step limit into several steps of the same turn index, and a transcript is read per turn.
fn joined_turns(steps: &[Step]) -> Vec<(Vec<u32>, Vec<bool>)> {
    let mut out: Vec<(u32, Vec<u32>, Vec<bool>)> = Vec::new();
    for s in steps {
        match out.last_mut() {
            Some((turn, ids, mask)) if *turn == s.turn => {
                ids.extend(&s.token_ids);
                mask.extend(&s.loss_mask);
            }
            _ => out.push((s.turn, s.token_ids.clone(), s.loss_mask.clone())),
        }
    }
    out.into_iter().map(|(_, ids, mask)| (ids, mask)).collect()
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::demonstration::demo_step;
    use crate::format::CallParseError;
    use serde_json::json;

    /// Steps laid out as an actor records them: `context` then `generated` (learnt).
    fn step(turn: usize, mut context: Vec<u32>, generated: &[u32]) -> Step {
        demo_step(turn, &mut context, generated, true)
    }

    fn prompt(_f: &EpisodeFormat) -> Vec<u32> {
        let tok = ByteTokenizer::new();
        let mut ids = vec![Special::System.id()];
        ids.extend(tok.encode_plain("tools: read_file(path) answer(answer)"));
        ids.extend([Special::End.id(), Special::User.id()]);
        ids.extend(tok.encode_plain("Find the value."));
        ids.extend([Special::End.id(), Special::Assistant.id()]);
        ids
    }

    /// What an OpenAI-style chat consumer checks: known roles; a `tool` message right after
    /// the assistant message whose call it answers, each call answered once, and every call
    /// answered except in the last message; arguments that are JSON objects; and no Corvid
    /// special-token text in what the assistant says.
    fn assert_openai_chat(messages: &[ChatMessage]) {
        let mut open: Vec<String> = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            for s in Special::ALL.into_iter().filter(|_| m.role == "assistant") {
                assert!(
                    !m.content.contains(s.text()),
                    "message {i} holds {}: {m:?}",
                    s.text()
                );
            }
            match m.role.as_str() {
                "tool" => {
                    let id = m
                        .tool_call_id
                        .as_ref()
                        .expect("a tool message names its call");
                    let at = open.iter().position(|o| o == id);
                    assert!(at.is_some(), "message {i} answers no open call: {m:?}");
                    open.retain(|o| o != id);
                }
                "system" | "user" | "assistant" => {
                    assert!(
                        open.is_empty(),
                        "message {i} leaves calls {open:?} unanswered"
                    );
                    assert!(m.tool_call_id.is_none(), "message {i}: {m:?}");
                    for c in &m.tool_calls {
                        assert_eq!(c.kind, "function");
                        let args: serde_json::Value =
                            serde_json::from_str(&c.function.arguments).expect("JSON arguments");
                        assert!(args.is_object(), "message {i}: {c:?}");
                        open.push(c.id.clone().expect("a call has an id"));
                    }
                }
                other => panic!("message {i}: role {other:?}"),
            }
        }
        // Only the last message may leave its call unanswered (the episode ended with it).
        if !open.is_empty() {
            let last = messages.last().expect("messages");
            assert_eq!(last.role, "assistant");
            assert_eq!(last.tool_calls.len(), open.len());
        }
    }

    #[test]
    fn a_well_formed_episode_exports_as_valid_chat_and_imports_back_exactly() {
        let f = EpisodeFormat::default();
        let read = f.call_ids("read_file", &json!({"path": "a.txt"})).unwrap();
        let answer = f.call_ids("answer", &json!({"answer": "42"})).unwrap();
        let steps = vec![
            step(0, prompt(&f), &read),
            step(
                1,
                f.result_ids(
                    &mut Conversation::default(),
                    &[Special::ToolCallClose.id()],
                    "value: 42",
                )
                .unwrap(),
                &answer,
            ),
        ];
        let m = f.to_messages(&steps, &Conversation::default());
        assert_openai_chat(&m);
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant"]);
        assert_eq!(m[1].content, "Find the value.");
        assert_eq!(m[2].content, "");
        assert_eq!(m[2].tool_calls[0].function.name, "read_file");
        assert_eq!(m[3].tool_call_id.as_deref(), Some("call_0"));
        assert_eq!(m[3].content, "value: 42");
        // The answer ends the episode: its call is the last message, with no reply.
        assert_eq!(m[4].tool_calls[0].function.name, "answer");
        assert_eq!(m[4].tool_calls[0].id.as_deref(), Some("call_1"));
        // The JSON other tools read: tool_call_id on the tool message, none elsewhere.
        let v = serde_json::to_value(&m).expect("json");
        assert_eq!(v[3]["tool_call_id"], "call_0");
        assert!(v[2].get("tool_call_id").is_none());
        // Back to tokens: the same ids and the same trained positions.
        let (ids, mask) = f.from_messages(&m, &[]).expect("lays out");
        let want_ids: Vec<u32> = steps.iter().flat_map(|s| s.token_ids.clone()).collect();
        let want_mask: Vec<bool> = steps.iter().flat_map(|s| s.loss_mask.clone()).collect();
        assert_eq!(ids, want_ids);
        assert_eq!(mask, want_mask);
    }

    #[test]
    fn a_turn_split_over_steps_exports_as_one_turn() {
        let f = EpisodeFormat::default();
        let read = f.call_ids("read_file", &json!({"path": "a.txt"})).unwrap();
        let answer = f.call_ids("answer", &json!({"answer": "42"})).unwrap();
        let whole = vec![
            step(0, prompt(&f), &read),
            step(
                1,
                f.result_ids(
                    &mut Conversation::default(),
                    &[Special::ToolCallClose.id()],
                    "value: 42",
                )
                .unwrap(),
                &answer,
            ),
        ];
        // Turn 1 split as an actor splits a long turn: part of the tool output in one step,
        // the rest, and the call, in the next (same turn index).
        let mut split = whole.clone();
        let t1 = split.pop().expect("turn 1");
        let cut = 3;
        let a = Step::context(1, t1.token_ids[..cut].to_vec());
        let mut b = t1.clone();
        b.token_ids.drain(..cut);
        b.loss_mask.drain(..cut);
        b.logprobs.drain(..cut);
        split.extend([a, b]);
        assert_eq!(
            f.to_messages(&split, &Conversation::default()),
            f.to_messages(&whole, &Conversation::default())
        );
    }

    #[test]
    fn malformed_turns_export_as_text_answered_by_a_user_message() {
        let f = EpisodeFormat::default();
        let tok = ByteTokenizer::new();
        let read = f.call_ids("read_file", &json!({"path": "a.txt"})).unwrap();
        let answer = f.call_ids("answer", &json!({"answer": "42"})).unwrap();
        // A call cut short, closed with </tool_call>: bad JSON.
        let mut cut = read[..8].to_vec();
        cut.push(Special::ToolCallClose.id());
        let cut_err = f.parse_call(&cut).expect_err("does not parse");
        // A reply with no call, with a stray turn header in it, ended by <|end|>.
        let mut chat = vec![Special::Assistant.id()];
        chat.extend(tok.encode_plain("I will read it"));
        chat.push(Special::End.id());
        let chat_err = f.parse_call(&chat).expect_err("no call");
        assert_eq!(chat_err, CallParseError::NoCall);
        let steps = vec![
            step(0, prompt(&f), &cut),
            step(
                1,
                f.result_ids(
                    &mut Conversation::default(),
                    &[Special::ToolCallClose.id()],
                    &f.parse_error_text(&cut_err),
                )
                .unwrap(),
                &chat,
            ),
            step(
                2,
                f.result_ids(
                    &mut Conversation::default(),
                    &[],
                    &f.parse_error_text(&chat_err),
                )
                .unwrap(),
                &read,
            ),
            step(
                3,
                f.result_ids(
                    &mut Conversation::default(),
                    &[Special::ToolCallClose.id()],
                    "value: 42",
                )
                .unwrap(),
                &answer,
            ),
        ];
        let m = f.to_messages(&steps, &Conversation::default());
        assert_openai_chat(&m);
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(
            roles,
            [
                "system",
                "user",
                "assistant",
                "user",
                "assistant",
                "user",
                "assistant",
                "tool",
                "assistant"
            ]
        );
        // The malformed turns are kept as text, without Corvid's tags.
        assert!(m[2].tool_calls.is_empty());
        assert_eq!(m[2].content, tok.decode(&read[1..8]));
        assert!(m[2].content.starts_with("{\"name\""), "{:?}", m[2].content);
        assert_eq!(m[4].content, "I will read it");
        // The environment's answers to them are user messages with its error text.
        assert_eq!(m[3].content, f.parse_error_text(&cut_err));
        assert_eq!(m[5].content, f.parse_error_text(&chat_err));
        assert!(
            m[3].content.starts_with("error: invalid_call: "),
            "{:?}",
            m[3]
        );
        assert!(m[3].tool_call_id.is_none() && m[5].tool_call_id.is_none());
        // The well-formed call after them is answered by its own id.
        assert_eq!(m[6].tool_calls[0].id.as_deref(), Some("call_2"));
        assert_eq!(m[7].tool_call_id.as_deref(), Some("call_2"));
        // The transcript imports (its malformed turns as plain assistant text).
        f.from_messages(&m, &[]).expect("lays out");
    }
}
