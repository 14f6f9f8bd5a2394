//! `corvid replay`: list, show, export and count stored trajectories.
//!
//! Reads the learner's sled store directly. sled allows one process per store,
//! so run it on a stopped learner's store (or a copy of a live one).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use corvid_learner::store::{Filter, TrajectoryRecord, TrajectoryStore};
use corvid_proto::{Step, Termination};

/// List, show and export stored trajectories.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid replay list --store runs/demo/store --family hops --success false
  corvid replay show --store runs/demo/store actor-1.ep-17
  corvid replay export --store runs/demo/store --level 3 --out hops3.jsonl
  corvid replay stats --store runs/demo/store")]
pub struct ReplayArgs {
    #[command(subcommand)]
    command: ReplayCommand,
}

#[derive(Subcommand, Debug)]
enum ReplayCommand {
    /// One line per finished trajectory: id, task, version, outcome, size.
    List {
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        filter: FilterArgs,
        /// Print JSON lines (the records) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One trajectory, turn by turn: tokens, tool calls, results, rewards.
    Show {
        #[command(flatten)]
        store: StoreArg,
        /// Trajectory id.
        id: String,
        /// Print the whole trajectory as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Matching trajectories as JSON lines: {"header", "footer", "stored_unix_ms", "steps"}.
    Export {
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        filter: FilterArgs,
        /// Write here instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Counts: finished, open, consumed, tokens, by termination and by task.
    Stats {
        #[command(flatten)]
        store: StoreArg,
    },
}

#[derive(Args, Debug)]
struct StoreArg {
    /// The store directory (a run's `store/`).
    #[arg(long, value_name = "PATH")]
    store: PathBuf,
}

#[derive(Args, Debug, Default)]
struct FilterArgs {
    /// Only this task family.
    #[arg(long)]
    family: Option<String>,
    /// Only this level.
    #[arg(long)]
    level: Option<u32>,
    /// Only successes (true) or failures (false).
    #[arg(long)]
    success: Option<bool>,
    /// Lowest policy version at episode start.
    #[arg(long)]
    min_version: Option<u64>,
    /// Highest policy version at episode start.
    #[arg(long)]
    max_version: Option<u64>,
    /// Only this termination: answered, max_turns, context_full, infra_error, abandoned.
    #[arg(long, value_parser = parse_termination)]
    termination: Option<Termination>,
    /// At most this many trajectories.
    #[arg(long)]
    limit: Option<usize>,
}

fn parse_termination(s: &str) -> Result<Termination, String> {
    s.parse()
        .map_err(|e: corvid_proto::ProtoError| e.to_string())
}

impl From<FilterArgs> for Filter {
    fn from(a: FilterArgs) -> Self {
        Filter {
            family: a.family,
            level: a.level,
            success: a.success,
            min_policy_version: a.min_version,
            max_policy_version: a.max_version,
            termination: a.termination,
            limit: a.limit,
        }
    }
}

fn open(path: &Path) -> Result<Arc<TrajectoryStore>> {
    if !path.is_dir() {
        anyhow::bail!(
            "no store at {}: the directory does not exist",
            path.display()
        );
    }
    TrajectoryStore::open(path).map(Arc::new).with_context(|| {
        format!(
            "opening the store at {} (is a learner using it?)",
            path.display()
        )
    })
}

/// Runs the command.
pub fn run(args: ReplayArgs) -> Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    match args.command {
        ReplayCommand::List {
            store,
            filter,
            json,
        } => {
            let store = open(&store.store)?;
            let filter = Filter::from(filter);
            if !json {
                writeln!(
                    out,
                    "{:<32} {:<14} {:>7} {:>7} {:<12} {:>7} {:>9} {:>8}",
                    "id",
                    "family/level",
                    "seed",
                    "version",
                    "termination",
                    "success",
                    "tokens",
                    "reward"
                )?;
            }
            for rec in store.list(&filter) {
                let rec = rec?;
                if json {
                    writeln!(out, "{}", serde_json::to_string(&rec)?)?;
                } else {
                    write_row(&mut out, &rec)?;
                }
            }
        }
        ReplayCommand::Show { store, id, json } => {
            let store = open(&store.store)?;
            let Some(rec) = store.get(&id)? else {
                anyhow::bail!(
                    "no finished trajectory {id:?} in {}",
                    store.path().display()
                );
            };
            let steps = store.steps(&id)?.into_iter().flatten();
            if json {
                let steps: Vec<Step> = steps.collect::<Result<_, _>>()?;
                let v = serde_json::json!({"record": rec, "steps": steps});
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                write_transcript(&mut out, &rec, steps)?;
            }
        }
        ReplayCommand::Export {
            store,
            filter,
            out: path,
        } => {
            let store = open(&store.store)?;
            let filter = Filter::from(filter);
            let summary = match &path {
                Some(p) => {
                    let file = std::fs::File::create(p)
                        .with_context(|| format!("creating {}", p.display()))?;
                    store.export_jsonl(&filter, &mut std::io::BufWriter::new(file))?
                }
                None => store.export_jsonl(&filter, &mut out)?,
            };
            eprintln!(
                "exported {} trajectories ({} steps, {} tokens){}",
                summary.trajectories,
                summary.steps,
                summary.tokens,
                path.map(|p| format!(" to {}", p.display()))
                    .unwrap_or_default()
            );
        }
        ReplayCommand::Stats { store } => {
            let store = open(&store.store)?;
            writeln!(out, "{}", serde_json::to_string_pretty(&store.stats()?)?)?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn write_row(out: &mut impl Write, rec: &TrajectoryRecord) -> Result<()> {
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
        "{:<32} {:<14} {:>7} {:>7} {:<12} {:>7} {:>9} {:>8.3}",
        h.trajectory_id,
        format!("{}/{}", h.task.family, h.task.level),
        h.task.seed,
        h.policy_version,
        term,
        success,
        tokens,
        reward
    )?;
    Ok(())
}

fn write_transcript(
    out: &mut impl Write,
    rec: &TrajectoryRecord,
    steps: impl Iterator<Item = corvid_learner::store::Result<Step>>,
) -> Result<()> {
    let h = &rec.header;
    writeln!(out, "trajectory {}", h.trajectory_id)?;
    writeln!(
        out,
        "  task {}/{} seed {} (spec {})  actor {}  policy v{}  group {}",
        h.task.family,
        h.task.level,
        h.task.seed,
        h.task.spec_hash,
        h.actor_id,
        h.policy_version,
        h.group_id
    )?;
    writeln!(
        out,
        "  sampling: temperature {} top_p {} max_new_tokens {} seed {}",
        h.sampling.temperature, h.sampling.top_p, h.sampling.max_new_tokens, h.sampling.seed
    )?;
    for step in steps {
        let s = step?;
        let generated = s.generated_count();
        write!(
            out,
            "  turn {:>3}: {} tokens ({} generated)",
            s.turn,
            s.token_ids.len(),
            generated
        )?;
        if generated > 0 {
            let sum: f32 = s
                .logprobs
                .iter()
                .zip(&s.loss_mask)
                .filter(|(_, m)| **m)
                .map(|(l, _)| l)
                .sum();
            write!(out, ", mean logprob {:.3}", sum / generated as f32)?;
        }
        writeln!(out, ", process reward {:+.3}", s.process_reward)?;
        if let Some(call) = &s.tool_call {
            writeln!(out, "      call   {}({})", call.name, call.arguments_json)?;
        }
        if let Some(r) = &s.tool_result {
            writeln!(
                out,
                "      result {} exit {} shown {}/{} bytes, fuel {}, {} us",
                r.status, r.exit_code, r.bytes_shown, r.bytes_total, r.fuel_used, r.wall_us
            )?;
        }
    }
    if let Some(f) = rec.footer {
        writeln!(
            out,
            "  end: {} success={} outcome reward {:.3}; {} steps, {} tokens ({} generated), {} ms",
            f.termination,
            f.success,
            f.outcome_reward,
            f.step_count,
            f.token_count,
            f.generated_token_count,
            f.wall_ms
        )?;
    }
    Ok(())
}
