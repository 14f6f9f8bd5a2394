//! `corvid replay list`: one row per finished trajectory matching the filters (seed,
//! version, outcome, size, family/level, id), or its record as a JSON line.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use corvid_store::{Filter, TrajectoryRecord, TrajectoryStore};

/// Writes the trajectories of `store` that `filter` matches to `out`.
pub(super) fn run(
    store: &TrajectoryStore,
    filter: &Filter,
    json: bool,
    out: &mut dyn Write,
) -> Result<ExitCode> {
    if !json {
        // Family/level and the id, the columns of any width, come last so the others line up.
        writeln!(
            out,
            "{:>20} {:>7} {:<12} {:>7} {:>9} {:>8}  {:<16} id",
            "seed", "version", "termination", "success", "tokens", "reward", "family/level"
        )?;
    }
    for rec in store.list(filter) {
        let rec = rec?;
        if json {
            writeln!(out, "{}", serde_json::to_string(&rec)?)?;
        } else {
            write_row(out, &rec)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn write_row(out: &mut dyn Write, rec: &TrajectoryRecord) -> Result<()> {
    let h = &rec.header;
    let (term, success, tokens, reward) = rec
        .footer
        .map(|f| {
            (
                f.termination.as_str(),
                f.success,
                f.token_count,
                f.outcome_reward,
            )
        })
        .unwrap_or(("?", false, 0, 0.0));
    writeln!(
        out,
        "{:>20} {:>7} {:<12} {:>7} {:>9} {:>8.3}  {:<16} {}",
        h.task.seed,
        h.policy_version,
        term,
        success,
        tokens,
        reward,
        format!("{}/{}", h.task.family, h.task.level),
        h.trajectory_id,
    )?;
    Ok(())
}
