//! Context folding: the context a new segment opens with when an episode outgrows its window.
//!
//! A fold rebuilds the context from the episode's prompt, the carried memory and the most
//! recent turns that fit, laid out by the same [`EpisodeFormat`] calls that built them the
//! first time ([`EpisodeFormat::prompt_ids`], then each kept turn's generated ids and
//! [`EpisodeFormat::result_ids`]), so the byte layout and a model's own chat template fold
//! alike and a segment's ids are exactly what the policy sees:
//!
//! ```text
//! segment s+1:  prompt(user task + memory) · gen_k · result_k · … · gen_t · result_t   context
//!               then the next generated turn                                           generated
//! ```
//!
//! The memory goes at the end of the user's message (a template that wants roles to
//! alternate still renders it); the fixed texts below are the format's, the same for every
//! task.

use corvid_proto::Fold;

use crate::chat_format::ChatFormat;
use crate::format::{EpisodeFormat, FormatError};
use crate::transcript::Conversation;

/// What replaces an earlier tool output in a `drop_tool_output` fold.
pub const DROPPED_OUTPUT: &str = "[output dropped when the context was folded]";

/// The heading of the memory a `notes` or `summary` fold carries, after the user's task.
pub const MEMORY_HEADING: &str = "[memory carried over from the earlier context]";

/// What a `summary` fold asks for after the tool output that fills the window: the policy's
/// answer (its next turn) becomes the next segment's memory.
pub const SUMMARY_REQUEST: &str = "[the context is full] Write down everything you still need: facts found, partial results, and what is left to do. This text will replace the context. Do not call a tool in this turn.";

/// A finished turn as a fold may keep it: the ids the policy generated and the text that
/// answered them (the tool output, or the error a malformed turn got).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoldedTurn {
    /// The turn's generated ids.
    pub generated: Vec<u32>,
    /// The text of the message that followed it.
    pub result: String,
}

/// A new segment's opening context.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The conversation the segment is built from (a model's own layout renders the turns
    /// after it against this).
    pub conversation: Conversation,
    /// Its ids: the next turn's context.
    pub ids: Vec<u32>,
}

/// The context that opens a new segment after a fold: `base`'s prompt (its last message, the
/// user's task, with `memory` under [`MEMORY_HEADING`] when there is one), then the `turns`
/// kept, oldest first, each answered by its result — or by [`DROPPED_OUTPUT`] for every turn
/// but the last under [`Fold::DropToolOutput`].
pub fn segment(
    format: &EpisodeFormat,
    base: &Conversation,
    fold: Fold,
    memory: Option<&str>,
    turns: &[FoldedTurn],
) -> Result<Segment, FormatError> {
    let mut conversation = Conversation {
        messages: base.prompt().to_vec(),
        tools: base.tools.clone(),
    };
    if let (Some(memory), Some(user)) = (memory, conversation.messages.last_mut()) {
        user.content = format!("{}\n\n{MEMORY_HEADING}\n{memory}", user.content);
    }
    let mut ids = format.prompt_ids(&conversation)?;
    for (i, t) in turns.iter().enumerate() {
        let masked = fold == Fold::DropToolOutput && i + 1 < turns.len();
        let text = if masked { DROPPED_OUTPUT } else { &t.result };
        ids.extend_from_slice(&t.generated);
        ids.extend(format.result_ids(&mut conversation, &t.generated, text)?);
    }
    Ok(Segment { conversation, ids })
}

/// The segment a fold opens, and how many of the latest `turns` it keeps: the most recent
/// ones whose context fits in `half` tokens (half the window), at least the latest (whose
/// result the policy has not read yet). The count is estimated from bytes (at least the
/// tokens of plain text; `prompt_len` the first segment's prompt), then checked on the real
/// layout, one turn fewer at a time.
pub fn rebuild(
    format: &EpisodeFormat,
    base: &Conversation,
    fold: Fold,
    memory: Option<&str>,
    turns: &[FoldedTurn],
    prompt_len: usize,
    half: usize,
) -> Result<(Segment, usize), FormatError> {
    let n = turns.len();
    let mut sum = prompt_len + memory.map_or(0, str::len);
    let mut keep = 0;
    for (i, t) in turns.iter().enumerate().rev() {
        let masked = fold == Fold::DropToolOutput && i + 1 < n;
        let result = if masked {
            DROPPED_OUTPUT.len()
        } else {
            t.result.len()
        };
        let est = t.generated.len() + result + 8;
        if keep > 0 && sum + est > half {
            break;
        }
        sum += est;
        keep += 1;
    }
    loop {
        let seg = segment(format, base, fold, memory, &turns[n - keep..])?;
        if seg.ids.len() <= half || keep <= 1 {
            return Ok((seg, keep));
        }
        keep -= 1;
    }
}

/// The segment a fold opened, read back from `opening` (the segment's first context) in a
/// model's own layout, where text cannot be parsed back out of a template's rendering: the
/// memory is the text under [`MEMORY_HEADING`] up to where the prompt's frame resumes, each
/// kept turn runs to its end token and its result to the next generation prompt, and a
/// reading counts only when [`segment`] lays it out as `opening` again, id for id. `None` in
/// the byte layout (whose markers [`EpisodeFormat::to_messages`] reads directly) and for ids
/// that no fold of `base` lays out.
pub fn read_opening(
    format: &EpisodeFormat,
    base: &Conversation,
    opening: &[u32],
) -> Option<Segment> {
    let chat = format.chat_format()?;
    let user = &base.prompt().last()?.content;
    let (before, after) = chat.prompt_frame(base).ok()?;
    let text = chat.decode_lossy(opening);
    let rest = text
        .strip_prefix(before.as_str())?
        .strip_prefix(user.as_str())?;
    // The memory may spell the frame's text itself: each place the frame could resume is a
    // reading, the layout decides.
    let mut memories: Vec<Option<&str>> = Vec::new();
    if rest.starts_with(after.as_str()) {
        memories.push(None);
    }
    if let Some(m) = rest.strip_prefix(format!("\n\n{MEMORY_HEADING}\n").as_str()) {
        memories.extend(
            m.match_indices(after.as_str())
                .map(|(at, _)| Some(&m[..at])),
        );
    }
    memories.into_iter().find_map(|memory| {
        // The results as the policy read them (a dropped one is the marker): nothing to
        // mask again, so the layout is `Notes`'s.
        let prompt = segment(format, base, Fold::Notes, memory, &[]).ok()?;
        let turns = kept_turns(chat, opening.strip_prefix(prompt.ids.as_slice())?)?;
        let seg = segment(format, base, Fold::Notes, memory, &turns).ok()?;
        (seg.ids == opening).then_some(seg)
    })
}

/// The turns a fold kept, read from the ids after a folded segment's prompt: each generated
/// turn up to its end token (a turn its budget cut was closed by its result's, the same
/// ids), then the result up to the next generation prompt. Tool text is encoded as plain
/// text, so neither marker can be forged by it. `None` when the ids do not split so.
fn kept_turns(chat: &ChatFormat, mut ids: &[u32]) -> Option<Vec<FoldedTurn>> {
    let end_id = chat.end_id();
    let prompt_end = chat.generation_prompt_ids();
    if prompt_end.is_empty() {
        return None;
    }
    let mut turns = Vec::new();
    while !ids.is_empty() {
        let end = ids.iter().position(|&t| t == end_id)? + 1;
        let result_end = end
            + ids[end..]
                .windows(prompt_end.len())
                .position(|w| w == prompt_end.as_slice())?
            + prompt_end.len();
        let generated = ids[..end].to_vec();
        let call = chat.parse_call(&generated).ok();
        let result = chat.result_text(&ids[end..result_end], call.as_ref(), turns.len(), false);
        turns.push(FoldedTurn { generated, result });
        ids = &ids[result_end..];
    }
    Some(turns)
}

/// The longest prefix of `text` of at most `max_bytes` bytes that ends on a character
/// boundary: a memory of at most `max_bytes` bytes is at most that many tokens in the byte
/// layout and in a byte-level BPE tokenizer, where every token of plain text covers a byte
/// or more.
pub fn cut_memory(text: &str, max_bytes: usize) -> &str {
    let mut end = text.len().min(max_bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The learner's config check counts the request as at most
    /// `corvid_proto::assignment::SUMMARY_REQUEST_BYTES` bytes with its separator.
    #[test]
    fn the_summary_request_fits_the_bytes_the_config_check_counts() {
        assert!(
            SUMMARY_REQUEST.len() + 2 <= corvid_proto::assignment::SUMMARY_REQUEST_BYTES as usize
        );
        assert_eq!(cut_memory("héllo", 2), "h");
        assert_eq!(cut_memory("héllo", 3), "hé");
    }
}
