//! The byte policy's chat layout for plain conversations: `<|role|>content<|end|>` per
//! message, with a per-token [`Role`] and loss mask (only assistant output is trained).
//! Episodes with tool calls are laid out by `corvid-episode`'s `EpisodeFormat`.

use serde::{Deserialize, Serialize};

use crate::byte::{ByteTokenizer, Special};

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
