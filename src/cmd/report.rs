//! `corvid report`: (re)write the report of a finished or interrupted run from its folder.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use crate::report;

/// Rewrite a run's report.json, charts and report.html from its metrics, evaluations and run.json.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid report --run-dir runs/demo          rewrite runs/demo/report.{json,html} and runs/demo/plots/
  corvid report --run-dir runs/demo --json   the same, then print the headline figures and goals as JSON

Works on an interrupted run too: what is missing is listed in the report.")]
pub struct ReportArgs {
    /// The run folder (`runs/<name>`), holding run.json, metrics/ and eval/.
    #[arg(long, value_name = "DIR")]
    run_dir: PathBuf,
    /// Print one JSON object (paths, headline, goals, missing) instead of text.
    #[arg(long)]
    json: bool,
}

fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "n/a".into(), |x| format!("{:.1}%", 100.0 * x))
}

/// Runs the command.
pub fn run(args: ReportArgs) -> Result<ExitCode> {
    let s = report::write(&args.run_dir)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.json {
        let v = serde_json::json!({
            "json": s.json,
            "html": s.html,
            "plots": s.plots,
            "headline": s.headline,
            "goals": s.goals,
            "missing": s.missing,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let h = &s.headline;
    let at = match (&h.main_family, h.frontier_level) {
        (Some(f), Some(l)) => format!("{f} level {l}"),
        _ => "unknown frontier".into(),
    };
    writeln!(
        out,
        "success at the frontier ({at}): random {}, SFT {}, RL {}",
        pct(h.success.random),
        pct(h.success.sft),
        pct(h.success.rl)
    )?;
    writeln!(
        out,
        "ablation at the frontier: step-level {}, trajectory GRPO {}",
        pct(h.ablation.step_level),
        pct(h.ablation.trajectory_grpo)
    )?;
    if !h.arms.is_empty() {
        let arms: Vec<String> = h
            .arms
            .iter()
            .map(|(stage, s)| format!("{stage} {}", pct(*s)))
            .collect();
        writeln!(out, "every arm at the frontier: {}", arms.join(", "))?;
    }
    for g in &s.goals {
        let word = match (g.met, g.measured) {
            (true, _) => "MET",
            (false, Some(_)) => "MISSED",
            (false, None) => "NOT MEASURED",
        };
        writeln!(out, "goal {word:<12} {}: {}", g.name, g.note)?;
    }
    for m in &s.missing {
        writeln!(out, "missing: {m}")?;
    }
    writeln!(out, "report: {}", s.html.display())?;
    writeln!(out, "        {}", s.json.display())?;
    writeln!(out, "charts: {}", s.plots.len())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
