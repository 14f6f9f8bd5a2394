//! [`Assignment`]: one episode the learner hands an actor (`NextTasks`), with its conversions
//! to and from the wire, and the [`ContextFold`] it runs under.

use serde::{Deserialize, Serialize};

use crate::pb;
use crate::types::{ProtoError, SamplingParams, TaskRef};

/// What an episode does when its next turn would not fit its window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fold {
    /// Nothing: the episode ends as `context_full`.
    #[default]
    None,
    /// A new segment keeps the calls of the recent turns, their outputs replaced by a fixed
    /// marker but the latest's (observation masking).
    DropToolOutput,
    /// A new segment carries the policy's notes file, written with its own tools.
    Notes,
    /// The policy is asked for a summary turn, which the new segment carries.
    Summary,
}

impl Fold {
    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            Fold::None => "none",
            Fold::DropToolOutput => "drop_tool_output",
            Fold::Notes => "notes",
            Fold::Summary => "summary",
        }
    }

    /// Whether a new segment carries a memory (notes or a summary).
    pub fn carries_memory(self) -> bool {
        matches!(self, Fold::Notes | Fold::Summary)
    }
}

/// Most bytes of the request a `summary` fold adds after the output that fills the window
/// (`corvid_episode::fold::SUMMARY_REQUEST` and its separator; a test there holds it).
pub const SUMMARY_REQUEST_BYTES: u64 = 256;

/// An episode's context window and its fold ([`Fold`]): each segment holds at most
/// `window_tokens`; the assignment's `context_budget` bounds the whole episode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextFold {
    /// Most tokens of one segment.
    pub window_tokens: u32,
    /// What happens when a turn would not fit.
    pub fold: Fold,
    /// Most tokens of the carried memory (notes or summary); a longer memory is cut.
    pub memory_tokens: u32,
    /// The workspace file [`Fold::Notes`] carries.
    pub notes_path: String,
}

impl ContextFold {
    /// Why these settings cannot run turns of up to `max_new_tokens`, as the field, its
    /// value and the reason (`None` when they can): a new segment holds the prompt, the
    /// memory and the recent turns in half the window, so the memory and a whole turn must
    /// fit in the other half.
    pub fn unfit(&self, max_new_tokens: u32) -> Option<(&'static str, String, String)> {
        let carries = self.fold.carries_memory();
        if carries && self.memory_tokens == 0 {
            return Some((
                "memory_tokens",
                "0".into(),
                format!(
                    "fold = \"{}\" carries a memory of at least 1 token",
                    self.fold.as_str()
                ),
            ));
        }
        if self.fold == Fold::Notes && !plain_relative(&self.notes_path) {
            return Some((
                "notes_path",
                format!("{:?}", self.notes_path),
                "a relative path inside the workspace, such as \"notes.md\"".into(),
            ));
        }
        let half = self.window_tokens / 2;
        // What must fit beside a new segment's prompt and recent turns: a turn, and under
        // `summary` a second turn, the request (its bytes bound its tokens) and the summary.
        let (need, what) = match self.fold {
            Fold::None => (1, "a token".to_string()),
            Fold::DropToolOutput => (max_new_tokens, format!("a whole turn (max_new_tokens = {max_new_tokens})")),
            Fold::Notes => (
                self.memory_tokens.saturating_add(max_new_tokens),
                format!("the notes ({} tokens) and a whole turn (max_new_tokens = {max_new_tokens})", self.memory_tokens),
            ),
            Fold::Summary => (
                (2 * u64::from(max_new_tokens) + u64::from(self.memory_tokens) + SUMMARY_REQUEST_BYTES)
                    .min(u64::from(u32::MAX)) as u32,
                format!(
                    "two turns (max_new_tokens = {max_new_tokens} each), the summary request ({SUMMARY_REQUEST_BYTES} bytes) and the summary ({} tokens)",
                    self.memory_tokens
                ),
            ),
        };
        if need > half {
            return Some((
                "window_tokens",
                self.window_tokens.to_string(),
                format!(
                    "room for {what} in half the window ({half}); the other half holds the prompt and the recent turns"
                ),
            ));
        }
        None
    }
}

/// A relative path with no empty, `.` or `..` component.
fn plain_relative(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

impl From<ContextFold> for pb::ContextFold {
    fn from(c: ContextFold) -> Self {
        Self {
            window_tokens: c.window_tokens,
            fold: match c.fold {
                Fold::None => pb::FoldMode::FoldNone,
                Fold::DropToolOutput => pb::FoldMode::FoldDropToolOutput,
                Fold::Notes => pb::FoldMode::FoldNotes,
                Fold::Summary => pb::FoldMode::FoldSummary,
            } as i32,
            memory_tokens: c.memory_tokens,
            notes_path: c.notes_path,
        }
    }
}

impl TryFrom<pb::ContextFold> for ContextFold {
    type Error = ProtoError;

    fn try_from(c: pb::ContextFold) -> Result<Self, ProtoError> {
        let fold = match pb::FoldMode::try_from(c.fold) {
            Ok(pb::FoldMode::FoldNone) => Fold::None,
            Ok(pb::FoldMode::FoldDropToolOutput) => Fold::DropToolOutput,
            Ok(pb::FoldMode::FoldNotes) => Fold::Notes,
            Ok(pb::FoldMode::FoldSummary) => Fold::Summary,
            Err(_) => {
                return Err(ProtoError::Invalid {
                    field: "assignment.context.fold".into(),
                    reason: format!("{} is not a fold this version knows", c.fold),
                })
            }
        };
        if c.window_tokens == 0 {
            return Err(ProtoError::Invalid {
                field: "assignment.context.window_tokens".into(),
                reason: "0: a window holds at least one token".into(),
            });
        }
        Ok(Self {
            window_tokens: c.window_tokens,
            fold,
            memory_tokens: c.memory_tokens,
            notes_path: c.notes_path,
        })
    }
}

/// One episode to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// The task instance.
    pub task: TaskRef,
    /// The group it belongs to.
    pub group_id: String,
    /// G, the episodes of its group.
    pub group_size: u32,
    /// Most turns.
    pub max_turns: u32,
    /// Context budget, tokens.
    pub context_budget: u32,
    /// Sampling, with this episode's own seed.
    pub sampling: SamplingParams,
    /// The window and the fold; `None`: the whole budget is one window, no fold.
    pub context: Option<ContextFold>,
}

impl From<Assignment> for pb::TaskAssignment {
    fn from(a: Assignment) -> Self {
        Self {
            task: Some(a.task.into()),
            group_id: a.group_id,
            group_size: a.group_size,
            max_turns: a.max_turns,
            context_budget: a.context_budget,
            sampling: Some(a.sampling.into()),
            context: a.context.map(Into::into),
        }
    }
}

impl TryFrom<pb::TaskAssignment> for Assignment {
    type Error = ProtoError;

    fn try_from(a: pb::TaskAssignment) -> Result<Self, ProtoError> {
        let task = a.task.ok_or(ProtoError::Missing("assignment.task"))?;
        let sampling = a
            .sampling
            .ok_or(ProtoError::Missing("assignment.sampling"))?;
        Ok(Self {
            task: TaskRef::try_from(task)?,
            group_id: a.group_id,
            group_size: a.group_size,
            max_turns: a.max_turns,
            context_budget: a.context_budget,
            sampling: SamplingParams::try_from(sampling)?,
            context: a.context.map(ContextFold::try_from).transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_round_trips_through_the_wire_and_a_missing_part_is_named() {
        let a = Assignment {
            task: TaskRef {
                family: "hops".into(),
                level: 2,
                seed: 7,
                spec_hash: "ab".into(),
            },
            group_id: "g1".into(),
            group_size: 8,
            max_turns: 6,
            context_budget: 1024,
            sampling: SamplingParams::default(),
            context: Some(ContextFold {
                window_tokens: 2048,
                fold: Fold::Notes,
                memory_tokens: 256,
                notes_path: "notes.md".into(),
            }),
        };
        let wire = pb::TaskAssignment::from(a.clone());
        assert_eq!(Assignment::try_from(wire.clone()).unwrap(), a);
        let err = Assignment::try_from(pb::TaskAssignment {
            sampling: None,
            ..wire
        })
        .unwrap_err();
        assert!(err.to_string().contains("assignment.sampling"), "{err}");
    }
}
