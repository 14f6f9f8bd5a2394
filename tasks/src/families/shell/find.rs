//! `find`: the record files under `records/` are named by a number and hold an `id:`,
//! an `owner:`, a `next:` id (or `none`) and notes. Level 1 asks which file holds an id
//! (`grep -rl`); from level 2 the agent starts at an id and follows `next:` until a record
//! says `next: none`, then answers that file's number. Each hop is a `grep -rl` to find
//! the file, then a `cat` to read its `next:`.

use std::collections::BTreeMap;

use super::{recover, sh, Parts};
use crate::checker::Checker;
use crate::families::{filler, PlanBuilder};
use crate::rng::SplitMix64;

/// Records in the chain, by level.
const HOPS: [usize; 8] = [1, 1, 2, 2, 3, 4, 6, 8];
/// Records outside the chain, by level.
const DISTRACTORS: [usize; 8] = [3, 4, 5, 6, 8, 10, 12, 14];
/// Note bytes per record, by level.
const NOTES: [usize; 8] = [0, 80, 120, 160, 220, 300, 420, 600];
const OWNERS: [&str; 6] = ["ana", "bruno", "chen", "dara", "emeka", "fatima"];

/// An id like `KX-417`: two capitals and three digits (fixed width, so no id is a
/// prefix of another).
fn record_id(rng: &mut SplitMix64) -> String {
    let l = |rng: &mut SplitMix64| (b'A' + rng.below(26) as u8) as char;
    format!("{}{}-{}", l(rng), l(rng), rng.range(100, 999))
}

pub(super) fn build(level: u32, recovery: bool, rng: &mut SplitMix64) -> Parts {
    let li = level as usize - 1;
    let total = HOPS[li] + DISTRACTORS[li];
    let mut ids: Vec<String> = Vec::new();
    while ids.len() < total {
        let id = record_id(rng);
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    let mut numbers: Vec<i64> = Vec::new();
    while numbers.len() < total {
        let n = rng.range(1000, 9999);
        if !numbers.contains(&n) {
            numbers.push(n);
        }
    }
    let path = |i: usize| format!("records/{}.rec", numbers[i]);
    let mut files = BTreeMap::new();
    for i in 0..total {
        let next = if i + 1 < HOPS[li] {
            ids[i + 1].clone()
        } else if i + 1 == HOPS[li] {
            "none".to_string()
        } else {
            ids[rng.below(total as u64) as usize].clone()
        };
        let mut text = format!(
            "id: {}\nowner: {}\nnext: {next}\n",
            ids[i],
            rng.pick(&OWNERS)
        );
        for l in filler(rng, NOTES[li]) {
            text.push_str(&format!("note: {l}\n"));
        }
        files.insert(path(i), text.into_bytes());
    }
    let answer = numbers[HOPS[li] - 1].to_string();
    let prompt = if level == 1 {
        format!(
            "Which file under records/ holds the record with `id: {}`? Use the shell tool \
             (grep), then call answer with the file's number (its name without .rec).",
            ids[0]
        )
    } else {
        format!(
            "The files under records/ hold one record each: `id:`, `owner:`, `next:` (the id of \
             the next record, or none) and notes. Start at the record with `id: {}` and follow \
             `next:` until a record says `next: none`. Call answer with that record's file \
             number (its name without .rec). Use the shell tool.",
            ids[0]
        )
    };
    let mut plan = PlanBuilder::new(&files, &[]);
    if recovery {
        recover(&mut plan, &format!("records/{}.rec", ids[0]), "records");
    }
    let mut needed = Vec::new();
    for (i, id) in ids.iter().take(HOPS[li]).enumerate() {
        let found = sh(&mut plan, format!("grep -rl 'id: {id}' records"));
        debug_assert_eq!(found.trim(), path(i));
        if level >= 2 {
            sh(&mut plan, format!("cat {}", path(i)));
        }
        needed.push(path(i));
    }
    Parts {
        files,
        prompt,
        steps: plan.finish(),
        checker: Checker::Exact {
            expected: answer.clone(),
            case_insensitive: false,
        },
        answer,
        needed,
    }
}
