//! `corvid replay rescore`: re-executes every stored tool call of a trajectory in a fresh
//! sandbox workspace of the same task instance, compares each result (status, exit code,
//! bytes shown, and the output text the policy read back) with the stored one, and re-runs
//! the checker on the final state.
//!
//! Exit status: 0 when every call and every verdict matches what was stored, 1 when a call
//! or a verdict differs, [`RESCORE_ERROR`] when it could not re-score.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use corvid_episode::fold::SUMMARY_REQUEST;
use corvid_episode::EpisodeFormat;
use corvid_proto::Step;
use corvid_store::{Filter, TrajectoryRecord, TrajectoryStore};
use corvid_tasks::{Episode, Families, TaskEnv};

use super::{open, stored_steps};

/// `replay rescore`'s exit status when it could not re-score.
pub(super) const RESCORE_ERROR: u8 = 2;

/// Re-scores the trajectory `id`, or else every one `filter` matches, of the store at
/// `store_path` (their families built in or in `packs`), writing a row for each and a
/// summary to `out`.
pub(super) fn run(
    store_path: &Path,
    filter: Filter,
    packs: &[PathBuf],
    id: Option<String>,
    format: &EpisodeFormat,
    out: &mut dyn Write,
) -> Result<ExitCode> {
    let store = open(store_path)?;
    let families = Families::new(packs).context("loading the task packs (--pack)")?;
    let env = crate::cmd::task_env()?;
    let records: Vec<TrajectoryRecord> = match id {
        Some(id) => vec![store
            .get(&id)?
            .with_context(|| format!("no finished trajectory {id:?}"))?],
        None => store.list(&filter).collect::<Result<_, _>>()?,
    };
    let mut totals = Totals::default();
    writeln!(
        out,
        "{:<48} {:>6} {:>9} {:>7} {:>9}  note",
        "id", "calls", "diverged", "stored", "rescored"
    )?;
    for rec in &records {
        let r = rescore(&store, &env, &families, format, rec)?;
        totals.add(&r);
        writeln!(
            out,
            "{:<48} {:>6} {:>9} {:>7} {:>9}  {}",
            rec.header.trajectory_id,
            r.calls,
            r.diverged.len(),
            r.stored_success,
            r.rescored
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into()),
            r.note
        )?;
        for d in &r.diverged {
            writeln!(out, "    {d}")?;
        }
    }
    totals.write(out, records.len())?;
    // A diverged call is a replay that no longer reproduces what the policy saw, even when
    // the checker happens to agree: a script checking the status must see it.
    Ok(if totals.mismatched > 0 || totals.diverged_calls > 0 {
        ExitCode::from(1)
    } else if totals.stale > 0 {
        ExitCode::from(RESCORE_ERROR)
    } else {
        ExitCode::SUCCESS
    })
}

/// What re-scoring a set of trajectories found, summed.
#[derive(Debug, Default)]
struct Totals {
    /// Verdicts that differ from the stored outcome.
    mismatched: usize,
    /// Skipped as never scored.
    not_scored: usize,
    /// Skipped because their task generator changed.
    stale: usize,
    diverged_calls: usize,
    diverged_trajectories: usize,
}

impl Totals {
    fn add(&mut self, r: &Rescored) {
        if r.verdict_differs() {
            self.mismatched += 1;
        }
        if !r.diverged.is_empty() {
            self.diverged_calls += r.diverged.len();
            self.diverged_trajectories += 1;
        }
        match r.skipped {
            Some(Skip::NotScored) => self.not_scored += 1,
            Some(Skip::SpecChanged) => self.stale += 1,
            None => {}
        }
    }

    /// The summary line after the rows of `records` trajectories.
    fn write(&self, out: &mut dyn Write, records: usize) -> Result<()> {
        let Self {
            mismatched,
            not_scored,
            stale,
            diverged_calls,
            diverged_trajectories,
        } = self;
        write!(
            out,
            "{} trajectories re-executed; {diverged_calls} call(s) diverged from the stored \
             result in {diverged_trajectories} trajectory(ies); {mismatched} verdict(s) \
             differ from the stored outcome",
            records - not_scored - stale,
        )?;
        if *not_scored > 0 {
            write!(
                out,
                "; {not_scored} skipped: never scored, nothing to compare"
            )?;
        }
        if *stale > 0 {
            write!(
                out,
                "; {stale} skipped: their task generator changed, they cannot be re-scored"
            )?;
        }
        writeln!(out)?;
        Ok(())
    }
}

/// What re-executing one trajectory found.
pub(super) struct Rescored {
    /// Calls re-executed (turns whose output parsed as a call).
    pub(super) calls: usize,
    /// One line per call whose result differs from the stored one.
    pub(super) diverged: Vec<String>,
    /// The stored outcome.
    pub(super) stored_success: bool,
    /// The checker's verdict now; `None` when skipped.
    pub(super) rescored: Option<bool>,
    /// Why nothing was re-executed, when it was not.
    pub(super) skipped: Option<Skip>,
    /// Why the checker failed it, or why it was skipped.
    pub(super) note: String,
}

/// Why a trajectory was not re-executed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Skip {
    /// It ended without a verdict (abandoned, infrastructure error): nothing to compare.
    NotScored,
    /// Its task generator changed since it was stored: it cannot be re-scored.
    SpecChanged,
}

impl Rescored {
    /// Whether the checker's verdict now differs from the stored outcome.
    pub(super) fn verdict_differs(&self) -> bool {
        self.rescored.is_some_and(|r| r != self.stored_success)
    }
}

/// Re-executes `rec`'s calls in a fresh workspace of its task instance and re-runs the
/// checker; `format` reads back the output text its policy read.
pub(super) fn rescore(
    store: &TrajectoryStore,
    env: &TaskEnv,
    families: &Families,
    format: &EpisodeFormat,
    rec: &TrajectoryRecord,
) -> Result<Rescored> {
    let footer = rec.footer.context("record without footer")?;
    let mut r = Rescored {
        calls: 0,
        diverged: Vec::new(),
        stored_success: footer.success,
        rescored: None,
        skipped: None,
        note: String::new(),
    };
    if !footer.termination.is_scored() {
        r.skipped = Some(Skip::NotScored);
        r.note = format!("not scored ({}); skipped", footer.termination);
        return Ok(r);
    }
    let task = families
        .get(&rec.header.task.family)
        .with_context(|| {
            format!(
                "task family {:?} (pass its pack with --pack)",
                rec.header.task.family
            )
        })?
        .instance(rec.header.task.level, rec.header.task.seed)?;
    if task.spec_hash != rec.header.task.spec_hash {
        r.skipped = Some(Skip::SpecChanged);
        r.note = format!(
            "the task generator changed since this was stored (spec {} now {}); skipped",
            rec.header.task.spec_hash, task.spec_hash
        );
        return Ok(r);
    }
    let steps = stored_steps(store, &rec.header.trajectory_id)?;
    let summary = rec.header.context.as_ref().map(|c| c.fold) == Some(corvid_proto::Fold::Summary);
    let mut ep = Episode::start(env, &task)?;
    // Both texts are printed for the first call whose output text differs; later ones in a
    // trajectory usually follow from it.
    let mut texts_shown = false;
    for (i, step) in steps.iter().enumerate() {
        // Turns whose output did not parse as a call ran no tool; nothing to re-execute.
        let Some(call) = step.tool_call.as_ref().filter(|c| {
            !c.name.is_empty()
                && serde_json::from_str::<serde_json::Value>(&c.arguments_json)
                    .is_ok_and(|v| v.is_object())
        }) else {
            continue;
        };
        r.calls += 1;
        let now = ep.call(call);
        let Some(stored) = &step.tool_result else {
            continue;
        };
        let mut differs: Vec<String> = Vec::new();
        if stored.status != now.result.status
            || stored.exit_code != now.result.exit_code
            || stored.bytes_shown != now.result.bytes_shown
        {
            differs.push(format!(
                "stored {} exit {} {} bytes, now {} exit {} {} bytes",
                stored.status,
                stored.exit_code,
                stored.bytes_shown,
                now.result.status,
                now.result.exit_code,
                now.result.bytes_shown
            ));
        }
        // The output the policy read is the context that opens the next turn; the result
        // record only holds its size, so a same-length change (a forged transcript, a tool
        // that is not deterministic) shows only here. A call that ended the episode was
        // never read back: nothing to compare.
        if let Some(was) = read_output(format, &steps[i..], call, summary) {
            if was != now.text {
                differs.push(text_differs(&was, &now.text, !texts_shown));
                texts_shown = true;
            }
        }
        if !differs.is_empty() {
            r.diverged.push(format!(
                "turn {}: {}: {}",
                step.turn,
                call.name,
                differs.join("; ")
            ));
        }
    }
    let verdict = ep.check();
    r.rescored = Some(verdict.passed());
    r.note = match verdict {
        corvid_tasks::Verdict::Fail(why) => why,
        _ => String::new(),
    };
    if r.verdict_differs() {
        r.note = format!("VERDICT DIFFERS: {}", r.note);
    }
    Ok(r)
}

/// The context tokens that open the turn after a call: the leading unmasked tokens of the
/// steps after it (a long context may be split over several steps of one turn). Empty when
/// no turn followed.
/// The output of the call `call` that `steps[0]` made, as the policy read it: in the context
/// that opens the next turn (the last tool result of a folded segment's opening). Under a
/// `summary` fold (`summary`) the request that follows the output is not part of it, and where
/// the request stood in for the output, the output is the one the next segment opens with.
/// `None` when no turn read it (the call ended the episode).
fn read_output(
    format: &EpisodeFormat,
    steps: &[Step],
    call: &corvid_proto::ToolCall,
    summary: bool,
) -> Option<String> {
    let text_at = |j: usize| {
        let opening = steps.get(j)?.segment != steps[j - 1].segment;
        let read = read_back(&steps[j..]);
        (!read.is_empty()).then(|| match opening {
            true => format.opening_result_text(&read, Some(call)),
            false => format.tool_result_text(&read, Some(call)),
        })
    };
    let was = text_at(1)?;
    if !summary {
        return Some(was);
    }
    if was == SUMMARY_REQUEST {
        let next = (2..steps.len()).find(|&j| steps[j].segment != steps[j - 1].segment)?;
        return text_at(next);
    }
    let asked = format!("\n\n{SUMMARY_REQUEST}");
    Some(was.strip_suffix(&asked).map_or(was.clone(), str::to_string))
}

fn read_back(after: &[Step]) -> Vec<u32> {
    let mut ids = Vec::new();
    for s in after {
        match s.loss_mask.iter().position(|m| *m) {
            Some(first_gen) => {
                ids.extend_from_slice(&s.token_ids[..first_gen]);
                break;
            }
            None => ids.extend_from_slice(&s.token_ids),
        }
    }
    ids
}

/// The note for a call whose output text the policy read (`was`) is not the one it gives
/// now (`is`); `with_texts`: the two texts around their first difference.
fn text_differs(was: &str, is: &str, with_texts: bool) -> String {
    if !with_texts {
        return "output text differs".into();
    }
    let at = first_difference(was, is);
    format!(
        "output text differs at character {at}:\n      stored {}\n      now    {}",
        text_around(was, at),
        text_around(is, at)
    )
}

/// The index of the first character where `a` and `b` differ (the shorter one's length if
/// one is a prefix of the other).
fn first_difference(a: &str, b: &str) -> usize {
    a.chars()
        .zip(b.chars())
        .position(|(x, y)| x != y)
        .unwrap_or_else(|| a.chars().count().min(b.chars().count()))
}

/// `text` shortened to a window around character `at`, quoted and escaped so that newlines
/// and trailing spaces are visible.
fn text_around(text: &str, at: usize) -> String {
    const BEFORE: usize = 30;
    const AFTER: usize = 50;
    let n = text.chars().count();
    let lo = at.saturating_sub(BEFORE);
    let hi = (at + AFTER).min(n);
    let part: String = text.chars().skip(lo).take(hi - lo).collect();
    format!(
        "{}{part:?}{} ({n} characters)",
        if lo > 0 { "…" } else { "" },
        if hi < n { "…" } else { "" }
    )
}
