//! One pass over a received step's bytes: the fast path of [`CheckedStep::received`].
//!
//! A step as prost writes it — fields in number order, each at most once, minimal varints,
//! no field at its default, none this version does not know — can be checked where it
//! lies: token ids against the vocabulary, the loss mask against the log-probs, without
//! decoding the per-token arrays into vectors. [`scan`] does that and answers `Some` only
//! for such bytes that also pass every check; anything else (another encoding, an unknown
//! field, a broken invariant) is `None`, and the reference path — decode, convert, check —
//! decides, names the error, and re-encodes where prost would. So the two paths accept the
//! same steps and store the same bytes (`checked::tests` holds them equal).
//!
//! [`CheckedStep::received`]: crate::CheckedStep::received

use prost::Message;

use crate::pb;
use crate::types::{generated_logprob_fits, ToolResult};

/// What a step's bytes hold, for the checks that need the rules and for the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scan<'a> {
    /// Entries of `token_ids`.
    pub tokens: usize,
    /// Tokens with `loss_mask` set.
    pub generated: usize,
    /// The `segment` field.
    pub segment: u32,
    /// The `routes` field's bytes.
    pub routes: &'a [u8],
}

/// Reads `bytes` as a `corvid.v1.Step` in prost's own encoding that passes
/// [`Step::validate`](crate::Step::validate) and, with `vocab`, has every token id below it;
/// `None` otherwise (see the module's notes).
pub(crate) fn scan(bytes: &[u8], vocab: Option<u32>) -> Option<Scan<'_>> {
    let mut r = Reader { bytes, at: 0 };
    let (mut ids, mut mask, mut logprobs): (&[u8], &[u8], &[u8]) = (&[], &[], &[]);
    let (mut segment, mut routes, mut last_field) = (0u32, &[][..], 0u8);
    while !r.done() {
        // Every field number is below 16, so prost writes each tag as one byte.
        let tag = r.byte()?;
        let (field, wire) = (tag >> 3, tag & 7);
        if tag & 0x80 != 0 || field <= last_field {
            return None;
        }
        last_field = field;
        match (field, wire) {
            // turn, policy_version, segment: present only when not 0.
            (1, 0) => nonzero(u64::from(r.varint32()?))?,
            (11, 0) => nonzero(r.varint()?)?,
            (12, 0) => {
                segment = r.varint32()?;
                nonzero(u64::from(segment))?;
            }
            (2, 2) => ids = r.packed()?,
            (3, 2) => mask = r.packed()?,
            (4, 2) => logprobs = r.packed()?,
            (10, 2) => routes = r.packed()?,
            (6, 2) => drop(canonical::<pb::ToolCall>(r.delimited()?)?),
            (7, 2) => {
                let result = canonical::<pb::ToolResult>(r.delimited()?)?;
                ToolResult::try_from(result).ok()?;
            }
            (9, 2) => drop(canonical::<pb::StepTimings>(r.delimited()?)?),
            (8, 5) => {
                let reward = f32::from_le_bytes(r.fixed32()?);
                if reward == 0.0 || !reward.is_finite() {
                    return None;
                }
            }
            _ => return None,
        }
    }
    // One byte per mask entry (0 or 1), four per log-prob.
    if logprobs.len() % 4 != 0 || mask.len() != logprobs.len() / 4 {
        return None;
    }
    let tokens = count_ids(ids, vocab.map_or(u64::MAX, u64::from))?;
    if tokens != mask.len() {
        return None;
    }
    // Branch-free over the tokens: a mask byte is 0 or 1, a generated token's log-prob fits
    // `Step::validate`'s rule, a prompt token's is 0.
    let (mut generated, mut bad) = (0usize, false);
    for (&m, lp) in mask.iter().zip(logprobs.chunks_exact(4)) {
        let lp = f32::from_le_bytes([lp[0], lp[1], lp[2], lp[3]]);
        bad |= (m > 1) | ((m == 1) & !generated_logprob_fits(lp)) | ((m == 0) & (lp != 0.0));
        generated += usize::from(m & 1);
    }
    if bad {
        return None;
    }
    Some(Scan {
        tokens,
        generated,
        segment,
        routes,
    })
}

/// Where the `routes` field (tag, length and bytes) lies in a step in prost's encoding, and
/// where its bytes start: `Some(None)` without one, `None` for bytes that do not parse. `bytes`
/// must be a step as prost writes it (a [`CheckedStep`](crate::CheckedStep)'s are), so the
/// field is met at most once.
pub(crate) fn routes_field(bytes: &[u8]) -> Option<Option<(std::ops::Range<usize>, usize)>> {
    let mut r = Reader { bytes, at: 0 };
    while !r.done() {
        let start = r.at;
        let tag = r.byte()?;
        match tag & 7 {
            0 => drop(r.varint()?),
            5 => drop(r.fixed32()?),
            2 => {
                let len = r.delimited()?.len();
                if tag >> 3 == 10 {
                    return Some(Some((start..r.at, r.at - len)));
                }
            }
            _ => return None,
        }
    }
    Some(None)
}

/// The number of packed `uint32` varints in `ids`, each in its shortest form and below
/// `vocab`; `None` otherwise.
///
/// A varint-at-a-time reader waits on each id's length before it can read the next, so the
/// ids are read as two halves (cut where an id ends) in one loop, whose steps overlap.
fn count_ids(ids: &[u8], vocab: u64) -> Option<usize> {
    let cut = ids[ids.len() / 2..]
        .iter()
        .position(|&b| b < 0x80)
        .map_or(ids.len(), |i| ids.len() / 2 + i + 1);
    let (mut a, mut b) = (Ids::new(&ids[..cut], vocab), Ids::new(&ids[cut..], vocab));
    while a.next_word() & b.next_word() {}
    Some(a.finish()? + b.finish()?)
}

/// Packed ids read four bytes at a time, without branching on an id's length (ids of two
/// and three bytes mix at random).
struct Ids<'a> {
    bytes: &'a [u8],
    at: usize,
    count: usize,
    vocab: u64,
    bad: bool,
}

impl<'a> Ids<'a> {
    fn new(bytes: &'a [u8], vocab: u64) -> Self {
        Self {
            bytes,
            at: 0,
            count: 0,
            vocab,
            bad: false,
        }
    }

    /// Reads the id at the cursor when it ends within four bytes; false when it cannot.
    #[inline(always)]
    fn next_word(&mut self) -> bool {
        let Some(word) = self.bytes.get(self.at..self.at + 4) else {
            return false;
        };
        let w = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        let ends = !w & 0x8080_8080;
        if ends == 0 {
            return false;
        }
        let len = ends.trailing_zeros() / 8 + 1;
        let x = (w & ((1u64 << (8 * len)) - 1) as u32) & 0x7f7f_7f7f;
        let id = (x & 0x7f) | (x >> 1) & 0x3f80 | (x >> 2) & 0x1f_c000 | (x >> 3) & 0xfe0_0000;
        // A multi-byte id ending in a zero byte is padded: prost writes it shorter.
        let padded = (len > 1) & ((w >> (8 * (len - 1))) & 0xff == 0);
        self.bad |= padded | (u64::from(id) >= self.vocab);
        self.at += len as usize;
        self.count += 1;
        true
    }

    /// The ids left, by the general reader; the count, or `None` if any id was refused.
    fn finish(mut self) -> Option<usize> {
        while self.next_word() {}
        let mut r = Reader {
            bytes: self.bytes,
            at: self.at,
        };
        while !r.done() {
            self.bad |= u64::from(r.varint32()?) >= self.vocab;
            self.count += 1;
        }
        (!self.bad).then_some(self.count)
    }
}

/// `Some(())` for a value prost would write (not the default).
fn nonzero(v: u64) -> Option<()> {
    (v != 0).then_some(())
}

/// A small sub-message, decoded, when its bytes are exactly what prost would write for it
/// (an equal length is not enough: a negative `int32` read from 5 bytes is written in 10,
/// which leaves room for an unknown field of the same size).
fn canonical<M: Message + Default>(bytes: &[u8]) -> Option<M> {
    let m = M::decode(bytes).ok()?;
    (m.encode_to_vec() == bytes).then_some(m)
}

/// A cursor over protobuf bytes that refuses what prost would not write.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn done(&self) -> bool {
        self.at == self.bytes.len()
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    /// A varint of at most 10 bytes in its shortest form (no trailing zero group).
    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for i in 0..10 {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                // A last byte of 0 pads a shorter varint; the tenth holds one bit.
                let shortest = (i == 0 || b != 0) && (i < 9 || b <= 1);
                return shortest.then_some(value);
            }
        }
        None
    }

    /// A varint that fits a `uint32` (prost truncates a wider one, and writes it shorter).
    fn varint32(&mut self) -> Option<u32> {
        u32::try_from(self.varint()?).ok()
    }

    fn fixed32(&mut self) -> Option<[u8; 4]> {
        let b = self.bytes.get(self.at..self.at + 4)?;
        self.at += 4;
        b.try_into().ok()
    }

    /// A length-delimited field's bytes.
    fn delimited(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        let end = self.at.checked_add(len)?;
        let b = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(b)
    }

    /// A packed or bytes field, which prost writes only when not empty.
    fn packed(&mut self) -> Option<&'a [u8]> {
        self.delimited().filter(|b| !b.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(bytes: &[u8]) -> Option<u64> {
        let mut r = Reader { bytes, at: 0 };
        r.varint().filter(|_| r.done())
    }

    #[test]
    fn varints_are_read_only_in_their_shortest_form() {
        assert_eq!(varint(&[0x00]), Some(0));
        assert_eq!(varint(&[0x96, 0x01]), Some(150));
        assert_eq!(varint(&[0x80, 0x00]), None, "0 padded to two bytes");
        assert_eq!(
            varint(&[0x96, 0x81, 0x00]),
            None,
            "150 padded to three bytes"
        );
        let mut max = vec![0xff; 9];
        max.push(0x01);
        assert_eq!(varint(&max), Some(u64::MAX));
        max[9] = 0x02;
        assert_eq!(varint(&max), None, "a tenth byte over 1 overflows");
        let eleven = [0xff; 10].iter().copied().chain([0x01]).collect::<Vec<_>>();
        assert_eq!(varint(&eleven), None);
        let mut r = Reader {
            bytes: &[0x80, 0x80, 0x80, 0x80, 0x10],
            at: 0,
        };
        assert_eq!(r.varint32(), None, "2^32 does not fit a uint32");
    }

    #[test]
    fn ids_of_every_length_are_counted_and_checked_against_the_vocabulary() {
        let ids: Vec<u32> = vec![0, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, u32::MAX];
        let packed = pb::Step {
            token_ids: ids.clone(),
            ..Default::default()
        }
        .encode_to_vec();
        let field = &packed[2..]; // tag 0x12 and a one-byte length
        assert_eq!(count_ids(field, u64::MAX), Some(ids.len()));
        assert_eq!(count_ids(field, u64::from(u32::MAX)), None);
        for cut in 0..field.len() {
            // Every prefix that ends inside an id is refused, and the rest are counted.
            let whole = field[..cut].last().is_none_or(|&b| b < 0x80);
            assert_eq!(count_ids(&field[..cut], u64::MAX).is_some(), whole, "{cut}");
        }
    }

    /// A `ToolResult` whose `exit_code = -1` is written in 5 bytes (prost writes 10), with
    /// an unknown field of 3 bytes making up the length.
    #[test]
    fn a_sub_message_of_prost_s_length_but_not_its_bytes_is_not_canonical() {
        let odd = [
            0x08, 0x01, 0x10, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x7a, 0x03, 1, 2, 3,
        ];
        let decoded = pb::ToolResult::decode(&odd[..]).unwrap();
        assert_eq!((decoded.exit_code, decoded.encoded_len()), (-1, odd.len()));
        assert!(canonical::<pb::ToolResult>(&odd).is_none());
        let written = decoded.encode_to_vec();
        assert!(canonical::<pb::ToolResult>(&written).is_some());
    }
}
