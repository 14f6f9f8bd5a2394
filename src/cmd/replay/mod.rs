//! `corvid replay`: list, show, export, re-score and count stored trajectories.
//!
//! Reads the learner's sled store directly. sled allows one process per store,
//! so run it on a stopped learner's store (or a copy of a live one).
//!
//! - `mod.rs`: the arguments, the store opener and the dispatch to one module per
//!   subcommand (`stats` is one line, here);
//! - `list.rs`: `list`, one row per trajectory;
//! - `show.rs`: `show`, a trajectory's transcript turn by turn;
//! - `advantages.rs`: the advantages `show` prints, as the trainer computes them within the
//!   trajectory's group under the run's `[rl]` settings;
//! - `export.rs`: `export` as raw or chat JSON lines, and the file it replaces whole;
//! - `rescore.rs`: `rescore`, every stored call re-executed in a fresh sandbox and the
//!   checker re-run.

mod advantages;
mod export;
mod list;
mod rescore;
mod show;
#[cfg(test)]
mod tests;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use corvid_episode::EpisodeFormat;
use corvid_proto::{Step, Termination};
use corvid_store::{Filter, TrajectoryStore};

/// List, show and export stored trajectories.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid replay list --store runs/demo/store --family hops --success false
  corvid replay show --store runs/demo/store actor-1.ep-17
  corvid replay show --store runs/eval/store --config runs/demo/config.toml <id>
  corvid replay export --store runs/demo/store --level 3 --out hops3.jsonl
  corvid replay export --store runs/demo/store --format chat --success true --out sft.jsonl
  corvid replay rescore --store runs/demo/store --family hops --limit 50
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
    /// One trajectory, turn by turn: what the policy read and wrote, its tool calls and
    /// results, per-turn process rewards, and the advantage the trainer gives each turn
    /// within its group under the run's `[rl]` settings (the run's `config.toml` or
    /// `learner.toml` next to the store, or --config). Without a run config no advantage is
    /// shown.
    Show {
        #[command(flatten)]
        store: StoreArg,
        /// Trajectory id.
        id: String,
        /// Print the whole trajectory as one JSON object.
        #[arg(long)]
        json: bool,
        /// Print tool output and prompts in full (default: the first 400 characters).
        #[arg(long)]
        full: bool,
        /// Print the recorded routing: for each token, the experts each MoE layer chose for
        /// the input before it.
        #[arg(long)]
        routes: bool,
        /// The learner config whose `[rl]` settings (advantage, gamma, process_weight,
        /// process_clip, normalize_step_advantages, adv_eps) the advantages are computed with.
        /// Default: the run's `config.toml`, else `learner.toml`, in the folder holding the
        /// store.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Matching trajectories as JSON lines. `raw`: {"header", "footer", "stored_unix_ms",
    /// "steps"} with exact token ids. `chat`: {"messages": [...OpenAI-style, with
    /// tool_calls...], "task", "success", "reward"}, usable by other SFT tools: one line per
    /// context segment of a trajectory that folded (with "segment" and "segments"), one per
    /// trajectory otherwise.
    Export {
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        filter: FilterArgs,
        /// `raw` or `chat`.
        #[arg(long, default_value = "raw", value_parser = ["raw", "chat"])]
        format: String,
        /// Write here instead of standard output: through a temporary file in the same
        /// folder, renamed over FILE only once the whole export is written. Refused when no
        /// trajectory matches (FILE is left as it was) and inside the store's folder. The
        /// new file replaces FILE itself (a symbolic link is replaced, not followed) with
        /// mode 0644.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Re-executes every stored tool call in a fresh sandbox workspace of the same task
    /// instance, reports calls whose result differs from the stored one (status, exit code,
    /// bytes shown, or the output text the policy read back), and re-runs the checker on the
    /// final state. Exits 0 if every call and every verdict matches what was stored, 1 if a
    /// call or a verdict differs, 2 if it could not re-score (a bad store, an unknown family:
    /// pass the trajectories' task packs with --pack; a trajectory whose task generator
    /// changed since it was stored). Trajectories that ended without a verdict (abandoned)
    /// are skipped.
    Rescore {
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        filter: FilterArgs,
        /// Task packs the trajectories may come from (built-in families are always known).
        #[arg(long = "pack", value_name = "FILE")]
        packs: Vec<PathBuf>,
        /// Only this trajectory.
        #[arg(long)]
        id: Option<String>,
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
    /// The folder whose tokenizer the episodes are in (a Hugging Face folder, or a policy
    /// folder with `hf/`). Default: the run the store belongs to (its `hf/`, found beside
    /// the store or one folder up, as for `runs/<name>/eval/store`), else the byte layout.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
}

impl StoreArg {
    /// The format the store's episodes are in (see `--model`), with the run's
    /// `[model] tool_call_format` when its `config.toml` names one.
    fn format(&self) -> Result<EpisodeFormat> {
        let run_dir = self.store.ancestors().skip(1).take(2).find(|d| {
            d.join(corvid_model::arch::ORIGIN_DIR)
                .join("tokenizer.json")
                .is_file()
        });
        let dir = match (&self.model, run_dir) {
            (Some(dir), _) => dir.as_path(),
            (None, Some(dir)) => dir,
            (None, None) => return Ok(EpisodeFormat::default()),
        };
        let tool_call_format = run_dir
            .and_then(|d| std::fs::read_to_string(d.join("config.toml")).ok())
            .and_then(|text| text.parse::<toml::Table>().ok())
            .and_then(|t| {
                t.get("model")?
                    .get("tool_call_format")?
                    .as_str()
                    .map(str::to_string)
            });
        EpisodeFormat::for_model_folder(dir, tool_call_format.as_deref())
            .with_context(|| format!("reading the episode format of {}", dir.display()))
    }
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

/// Opens an existing store for reading ([`corvid_store::open_existing`]).
fn open(path: &Path) -> Result<TrajectoryStore> {
    Ok(corvid_store::open_existing(path)?)
}

/// The stored steps of the finished trajectory `id`, in order.
fn stored_steps(store: &TrajectoryStore, id: &str) -> Result<Vec<Step>> {
    store
        .steps(id)?
        .into_iter()
        .flatten()
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading the steps of {id}"))
}

/// Runs the command.
pub fn run(args: ReplayArgs) -> Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    run_to(args, &mut out)
}

/// [`run`] with its standard output going to `out`.
fn run_to(args: ReplayArgs, out: &mut dyn Write) -> Result<ExitCode> {
    let rescoring = matches!(args.command, ReplayCommand::Rescore { .. });
    match run_command(args, out) {
        // `rescore` keeps 1 for "a call or a verdict differs", so that a script can tell it from
        // an error.
        Err(err) if rescoring && !crate::is_broken_pipe(&err) => {
            eprintln!("error: {}", crate::error_text(&err));
            Ok(ExitCode::from(rescore::RESCORE_ERROR))
        }
        r => r,
    }
}

fn run_command(args: ReplayArgs, out: &mut dyn Write) -> Result<ExitCode> {
    let status = match args.command {
        ReplayCommand::List {
            store,
            filter,
            json,
        } => list::run(&open(&store.store)?, &filter.into(), json, out)?,
        ReplayCommand::Show {
            store,
            id,
            json,
            full,
            routes,
            config,
        } => show::run(
            &store.store,
            &id,
            json,
            show::Detail { full, routes },
            config.as_deref(),
            &store.format()?,
            out,
        )?,
        ReplayCommand::Export {
            store,
            filter,
            format: kind,
            out: path,
        } => export::run(
            &store.store,
            &filter.into(),
            &kind,
            path.as_deref(),
            &store.format()?,
            out,
        )?,
        ReplayCommand::Rescore {
            store,
            filter,
            packs,
            id,
        } => rescore::run(
            &store.store,
            filter.into(),
            &packs,
            id,
            &store.format()?,
            out,
        )?,
        ReplayCommand::Stats { store } => {
            let stats = open(&store.store)?.stats()?;
            writeln!(out, "{}", serde_json::to_string_pretty(&stats)?)?;
            ExitCode::SUCCESS
        }
    };
    out.flush()?;
    Ok(status)
}
