//! `corvid replay`: list, show, export, re-score and count stored trajectories.
//!
//! Reads the learner's sled store directly. sled allows one process per store,
//! so run it on a stopped learner's store (or a copy of a live one).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use corvid_learner::config::LearnerConfig;
use corvid_learner::episode::EpisodeFormat;
use corvid_learner::store::{ExportSummary, Filter, TrajectoryRecord, TrajectoryStore};
use corvid_learner::tokenizer::Special;
use corvid_learner::train::batch::{turn_advantages, TrainingTrajectory};
use corvid_learner::train::{AdvantageMode, RlConfig};
use corvid_proto::{Step, Termination};
use corvid_tasks::{Episode, TaskEnv};

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
        /// The learner config whose `[rl]` settings (advantage, gamma, process_weight,
        /// process_clip, normalize_step_advantages, adv_eps) the advantages are computed with.
        /// Default: the run's `config.toml`, else `learner.toml`, in the folder holding the
        /// store.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Matching trajectories as JSON lines. `raw`: {"header", "footer", "stored_unix_ms",
    /// "steps"} with exact token ids. `chat`: {"messages": [...OpenAI-style, with
    /// tool_calls...], "task", "success", "reward"}, usable by other SFT tools.
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

/// Opens an existing store for reading. A folder that holds no store is refused rather than
/// turned into an empty one (a run folder given for its `store/` would look empty).
fn open(path: &Path) -> Result<Arc<TrajectoryStore>> {
    if !path.exists() {
        anyhow::bail!("no store at {}: it does not exist", path.display());
    }
    if !path.is_dir() {
        anyhow::bail!("no store at {}: it is a file, not a folder", path.display());
    }
    // sled keeps its configuration in `conf` and its log in `db`.
    if !(path.join("conf").is_file() && path.join("db").is_file()) {
        let hint = if path.join("store").is_dir() {
            format!("; did you mean {}?", path.join("store").display())
        } else {
            String::new()
        };
        anyhow::bail!(
            "no store at {}: the folder holds no trajectory store (no sled `conf` and `db`){hint}",
            path.display()
        );
    }
    TrajectoryStore::open(path).map(Arc::new).map_err(|e| {
        let why = if e.is_locked() {
            "another process has it open (sled allows one; replay a stopped learner's store or a copy)"
        } else {
            "the store is unreadable"
        };
        anyhow::Error::new(e).context(format!("opening the store at {}: {why}", path.display()))
    })
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
            Ok(ExitCode::from(RESCORE_ERROR))
        }
        r => r,
    }
}

/// `replay rescore`'s exit status when it could not re-score.
const RESCORE_ERROR: u8 = 2;

fn run_command(args: ReplayArgs, mut out: &mut dyn Write) -> Result<ExitCode> {
    match args.command {
        ReplayCommand::List {
            store,
            filter,
            json,
        } => {
            let store = open(&store.store)?;
            let filter = Filter::from(filter);
            if !json {
                // Family/level and the id, the columns of any width, come last so the others
                // line up.
                writeln!(
                    out,
                    "{:>20} {:>7} {:<12} {:>7} {:>9} {:>8}  {:<16} id",
                    "seed", "version", "termination", "success", "tokens", "reward", "family/level"
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
        ReplayCommand::Show {
            store,
            id,
            json,
            full,
            config,
        } => {
            let rl = if json {
                None
            } else {
                run_rl_config(&store.store, config.as_deref())?
            };
            let store = open(&store.store)?;
            let Some(rec) = store.get(&id)? else {
                anyhow::bail!(
                    "no finished trajectory {id:?} in {}",
                    store.path().display()
                );
            };
            let steps: Vec<Step> = store
                .steps(&id)?
                .into_iter()
                .flatten()
                .collect::<Result<_, _>>()?;
            if json {
                let v = serde_json::json!({"record": rec, "steps": steps});
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                let advantages = group_advantages(&store, &rec, rl.as_ref())?;
                write_transcript(&mut out, &rec, &steps, &advantages, full)?;
            }
        }
        ReplayCommand::Export {
            store,
            filter,
            format,
            out: path,
        } => {
            if let Some(p) = &path {
                refuse_out_inside_store(p, &store.store)?;
            }
            let store = open(&store.store)?;
            let filter = Filter::from(filter);
            let export = |w: &mut dyn Write| -> Result<ExportSummary> {
                if format == "chat" {
                    export_chat(&store, &filter, w)
                } else {
                    Ok(store.export_jsonl(&filter, w)?)
                }
            };
            let summary = match &path {
                Some(p) => export_to_file(p, export)?,
                None => export(&mut out)?,
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
        ReplayCommand::Rescore {
            store,
            filter,
            packs,
            id,
        } => {
            let store = open(&store.store)?;
            let families = Families::new(&packs)?;
            let env = super::task_env()?;
            let records: Vec<TrajectoryRecord> = match id {
                Some(id) => vec![store
                    .get(&id)?
                    .with_context(|| format!("no finished trajectory {id:?}"))?],
                None => store
                    .list(&Filter::from(filter))
                    .collect::<Result<_, _>>()?,
            };
            let (mut mismatched, mut not_scored, mut stale) = (0usize, 0usize, 0usize);
            let (mut diverged_calls, mut diverged_trajectories) = (0usize, 0usize);
            writeln!(
                out,
                "{:<48} {:>6} {:>9} {:>7} {:>9}  note",
                "id", "calls", "diverged", "stored", "rescored"
            )?;
            for rec in &records {
                let r = rescore(&store, &env, &families, rec)?;
                if r.verdict_differs() {
                    mismatched += 1;
                }
                if !r.diverged.is_empty() {
                    diverged_calls += r.diverged.len();
                    diverged_trajectories += 1;
                }
                match r.skipped {
                    Some(Skip::NotScored) => not_scored += 1,
                    Some(Skip::SpecChanged) => stale += 1,
                    None => {}
                }
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
            write!(
                out,
                "{} trajectories re-executed; {diverged_calls} call(s) diverged from the stored \
                 result in {diverged_trajectories} trajectory(ies); {mismatched} verdict(s) \
                 differ from the stored outcome",
                records.len() - not_scored - stale,
            )?;
            if not_scored > 0 {
                write!(
                    out,
                    "; {not_scored} skipped: never scored, nothing to compare"
                )?;
            }
            if stale > 0 {
                write!(
                    out,
                    "; {stale} skipped: their task generator changed, they cannot be re-scored"
                )?;
            }
            writeln!(out)?;
            out.flush()?;
            // A diverged call is a replay that no longer reproduces what the policy saw, even
            // when the checker happens to agree: a script checking the status must see it.
            if mismatched > 0 || diverged_calls > 0 {
                return Ok(ExitCode::from(1));
            }
            if stale > 0 {
                return Ok(ExitCode::from(RESCORE_ERROR));
            }
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

/// The trainer's `[rl]` settings of a run, and the file they were read from.
#[derive(Debug, Clone)]
struct RunRl {
    path: PathBuf,
    rl: RlConfig,
}

/// The run config files looked for next to a store, in order: the learner's own resolved
/// copy (`config.toml`, rewritten at every start, so it is what the trainer last ran with),
/// then the learner part that `corvid run` writes (`learner.toml`).
const RUN_CONFIGS: [&str; 2] = ["config.toml", "learner.toml"];

/// The `[rl]` settings `replay show` computes advantages with: `explicit` (`--config`), else
/// the run config in the folder holding the store (a run's `store/` sits in its run folder),
/// else `None` (a bare eval store: there is no trainer whose numbers could be shown). A file
/// that is there but unreadable is an error, not a silent fallback to defaults.
fn run_rl_config(store: &Path, explicit: Option<&Path>) -> Result<Option<RunRl>> {
    if let Some(path) = explicit {
        return load_rl(path).map(Some);
    }
    let dir = match store.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    for name in RUN_CONFIGS {
        let path = dir.join(name);
        if path.is_file() {
            // Found, not named: a file that is not a run config only costs the advantages.
            return Ok(load_rl(&path)
                .map_err(|e| {
                    eprintln!(
                        "note: {} next to the store is not a run config ({e:#}); no advantages are shown (pass --config FILE)",
                        path.display()
                    )
                })
                .ok());
        }
    }
    Ok(None)
}

/// Reads `path` as a learner config (the file `corvid learner` and `corvid run` read) and
/// checks its `[rl]` table. The rest of the config is not validated: it may name task packs
/// or devices relative to where the run was started, which replay neither needs nor has.
fn load_rl(path: &Path) -> Result<RunRl> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let cfg: LearnerConfig = toml::from_str(&text)
        .with_context(|| format!("{} is not a learner config", path.display()))?;
    cfg.rl
        .validate()
        .with_context(|| format!("{}: the [rl] table", path.display()))?;
    Ok(RunRl {
        path: path.to_path_buf(),
        rl: cfg.rl,
    })
}

/// What `replay show` prints about a trajectory's advantages.
#[derive(Debug, Clone, PartialEq)]
struct Advantages {
    /// The advantage of each turn, by turn index (every step of a turn split into several
    /// steps shows its turn's); `None` when none is shown.
    by_turn: Option<BTreeMap<u32, f64>>,
    /// One line: how they were computed, or why none is shown.
    note: String,
}

impl Advantages {
    fn none(note: impl Into<String>) -> Self {
        Self {
            by_turn: None,
            note: note.into(),
        }
    }
}

/// The advantage the trainer gives each of `rec`'s turns within its group (the stored,
/// finished trajectories sharing its `group_id`), by the trainer's own code
/// (`corvid_learner::train::batch::turn_advantages`): its turns built from steps the way
/// the trainer builds them (a turn split over several steps is one turn), under `rl`'s
/// estimator, gamma, process_weight, normalisation and eps. Without `rl` nothing is shown:
/// any fixed recipe would print numbers the trainer never used.
///
/// The group is every member stored here that the trainer could train on, less second
/// copies of an episode (same sampler seed, a later finish: the collector never trains on
/// them); which members a past update left out as stale depends on the policy version at
/// that update, which the store does not record, so they are counted in. The trainer's
/// vocabulary check is not repeated (replay loads no model).
fn group_advantages(
    store: &TrajectoryStore,
    rec: &TrajectoryRecord,
    rl: Option<&RunRl>,
) -> Result<Advantages> {
    let Some(run) = rl else {
        return Ok(Advantages::none(format!(
            "not shown, no run config found next to the store; pass --config FILE (the \
             trainer's [rl] settings decide them; looked for {} in the store's folder)",
            RUN_CONFIGS.join(" and ")
        )));
    };
    let id = &rec.header.trajectory_id;
    let group = &rec.header.group_id;
    let filter = Filter {
        family: Some(rec.header.task.family.clone()),
        level: Some(rec.header.task.level),
        ..Filter::default()
    };
    // The group's finished members in finish order, as the trainer's collector reads them.
    let mut found: Vec<TrajectoryRecord> = Vec::new();
    for r in store.list(&filter) {
        let r = r?;
        if &r.header.group_id == group && r.footer.is_some() {
            found.push(r);
        }
    }
    found.sort_by_key(|r| r.finish_seq);
    let mut members: Vec<TrainingTrajectory> = Vec::new();
    let mut seeds: Vec<(u64, String)> = Vec::new();
    for r in found {
        let Some(footer) = r.footer else {
            continue;
        };
        // A second copy of an episode (same sampler seed; its first actor was taken for gone
        // and was not) is stored but never trained on (the collector's rule 4).
        let seed = r.header.sampling.seed;
        if let Some((_, first)) = seeds.iter().find(|(s, _)| seed != 0 && *s == seed) {
            if &r.header.trajectory_id == id {
                return Ok(Advantages::none(format!(
                    "none, a second copy of episode {first} (same group and sampler seed): the trainer does not train on it"
                )));
            }
            continue;
        }
        seeds.push((seed, r.header.trajectory_id.clone()));
        let steps: Vec<Step> = store
            .steps(&r.header.trajectory_id)?
            .into_iter()
            .flatten()
            .collect::<Result<_, _>>()
            .with_context(|| format!("reading the steps of {}", r.header.trajectory_id))?;
        let t = TrainingTrajectory {
            header: r.header,
            footer,
            steps,
        };
        // The trainer leaves out what it cannot train on (`Trainer::trainable`).
        if let Err(e) = t.check_trainable() {
            if &t.header.trajectory_id == id {
                return Ok(Advantages::none(format!(
                    "none, the trainer leaves this trajectory out: {e}"
                )));
            }
            continue;
        }
        members.push(t);
    }
    let Some(me) = members.iter().position(|t| &t.header.trajectory_id == id) else {
        return Ok(Advantages::none(
            "none, the trajectory is not among its group's finished members",
        ));
    };
    let refs: Vec<&TrainingTrajectory> = members.iter().collect();
    let mut adv = turn_advantages(&refs, &run.rl)
        .with_context(|| format!("the advantages of group {group}"))?;
    let scored = adv.iter().filter(|a| a.is_some()).count();
    let Some(per_turn) = adv.swap_remove(me) else {
        return Ok(Advantages::none(format!(
            "none, it ended without a verdict ({}): the trainer leaves it out of baselines and \
             the loss",
            members[me].footer.termination
        )));
    };
    // `turn_advantages` lists turns in order of first appearance (`TrainingTrajectory::turns`).
    let mut order: Vec<u32> = Vec::new();
    for s in &members[me].steps {
        if !order.contains(&s.turn) {
            order.push(s.turn);
        }
    }
    let by_turn: BTreeMap<u32, f64> = order.into_iter().zip(per_turn).collect();
    let c = &run.rl;
    let how = match c.advantage {
        AdvantageMode::Step => format!(
            "step (gamma {}, process_weight {}, process_clip {}, normalize_step_advantages {}, \
             adv_eps {})",
            c.gamma, c.process_weight, c.process_clip, c.normalize_step_advantages, c.adv_eps
        ),
        AdvantageMode::Grpo | AdvantageMode::DrGrpo | AdvantageMode::Rloo => format!(
            "{} (process_weight {}, process_clip {}, adv_eps {}; one per trajectory, repeated \
             on each turn)",
            serde_json::to_value(c.advantage)?
                .as_str()
                .unwrap_or_default(),
            c.process_weight,
            c.process_clip,
            c.adv_eps
        ),
    };
    let mut note = format!(
        "the trainer's, advantage = {how} from {}, within the {scored} scored member(s) of \
         group {group} stored here",
        run.path.display()
    );
    if store.consumed_at(id)?.is_none() {
        note.push_str("; never consumed by a trainer, so what it would have been given");
    }
    Ok(Advantages {
        by_turn: Some(by_turn),
        note,
    })
}

/// Refuses an export file inside the store's folder: sled owns every file there, and an
/// export over one of them (`--out <store>/db`) destroys the store.
fn refuse_out_inside_store(out: &Path, store: &Path) -> Result<()> {
    // A store that does not resolve does not exist; `open` says so.
    let Ok(store) = store.canonicalize() else {
        return Ok(());
    };
    let target = out.canonicalize().ok().or_else(|| {
        let dir = match out.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Some(dir.canonicalize().ok()?.join(out.file_name()?))
    });
    if target.is_some_and(|t| t.starts_with(&store)) {
        anyhow::bail!(
            "refusing to export into {}: it is inside the store {}; write the export elsewhere",
            out.display(),
            store.display()
        );
    }
    Ok(())
}

/// Runs `export` into a temporary file next to `path` and renames it over `path` only when
/// the whole export is written and holds at least one trajectory. A failed export, or a
/// filter that matches nothing (a typo), leaves an earlier file at `path` as it was.
fn export_to_file(
    path: &Path,
    export: impl FnOnce(&mut dyn Write) -> Result<ExportSummary>,
) -> Result<ExportSummary> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".corvid-export-").suffix(".tmp");
    // Readable like a file created by `File::create` (a temporary file is 0600).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o644));
    }
    let mut tmp = builder.tempfile_in(dir).with_context(|| {
        format!(
            "creating a temporary file in {} for {}",
            dir.display(),
            path.display()
        )
    })?;
    let summary = {
        let mut w = std::io::BufWriter::new(tmp.as_file_mut());
        let s = export(&mut w)?;
        w.flush()
            .with_context(|| format!("writing the export for {}", path.display()))?;
        s
    };
    if summary.trajectories == 0 {
        anyhow::bail!(
            "no trajectory matches the filters; {} {}",
            path.display(),
            if path.exists() {
                "is left as it was"
            } else {
                "is not written"
            }
        );
    }
    tmp.as_file()
        .sync_all()
        .with_context(|| format!("writing the export for {}", path.display()))?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("renaming the export into {}", path.display()))?;
    Ok(summary)
}

fn clip_text(s: &str, full: bool) -> String {
    const SHOWN: usize = 400;
    if full || s.chars().count() <= SHOWN {
        return s.to_string();
    }
    let head: String = s.chars().take(SHOWN).collect();
    format!(
        "{head}… [{} more characters; --full shows all]",
        s.chars().count() - SHOWN
    )
}

fn write_transcript(
    out: &mut impl Write,
    rec: &TrajectoryRecord,
    steps: &[Step],
    advantages: &Advantages,
    full: bool,
) -> Result<()> {
    let h = &rec.header;
    let format = EpisodeFormat::default();
    let tok = format.tokenizer();
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
    writeln!(out, "  advantages: {}", advantages.note)?;
    for s in steps {
        let generated = s.generated_count();
        let first_gen = s
            .loss_mask
            .iter()
            .position(|m| *m)
            .unwrap_or(s.token_ids.len());
        write!(
            out,
            "\n  turn {:>3}: {} tokens ({} generated)",
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
        write!(out, ", process reward {:+.3}", s.process_reward)?;
        match advantages.by_turn.as_ref().and_then(|a| a.get(&s.turn)) {
            Some(a) => writeln!(out, ", advantage {a:+.3}")?,
            None => writeln!(out)?,
        }
        let context = tok.decode(&s.token_ids[..first_gen]);
        writeln!(
            out,
            "    read  | {}",
            clip_text(&context, full).replace('\n', "\n          | ")
        )?;
        let wrote = tok.decode(&s.token_ids[first_gen..]);
        writeln!(
            out,
            "    wrote | {}",
            clip_text(&wrote, full).replace('\n', "\n          | ")
        )?;
        if let Some(call) = &s.tool_call {
            writeln!(out, "    call  | {}({})", call.name, call.arguments_json)?;
        }
        if let Some(r) = &s.tool_result {
            writeln!(
                out,
                "    result| {} exit {} shown {}/{} bytes, fuel {}, {} us",
                r.status, r.exit_code, r.bytes_shown, r.bytes_total, r.fuel_used, r.wall_us
            )?;
        }
    }
    if let Some(f) = rec.footer {
        writeln!(
            out,
            "\n  end: {} success={} outcome reward {:.3}; {} steps, {} tokens ({} generated), {} ms",
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

/// `--format chat`: one OpenAI-style transcript per trajectory.
fn export_chat(
    store: &TrajectoryStore,
    filter: &Filter,
    out: &mut dyn Write,
) -> Result<ExportSummary> {
    let format = EpisodeFormat::default();
    let mut summary = ExportSummary::default();
    for rec in store.list(filter) {
        let rec = rec?;
        let steps: Vec<Step> = store
            .steps(&rec.header.trajectory_id)?
            .into_iter()
            .flatten()
            .collect::<Result<_, _>>()?;
        summary.steps += steps.len() as u64;
        summary.tokens += steps.iter().map(|s| s.token_ids.len() as u64).sum::<u64>();
        let line = serde_json::json!({
            "trajectory_id": rec.header.trajectory_id,
            "task": rec.header.task,
            "policy_version": rec.header.policy_version,
            "success": rec.footer.map(|f| f.success),
            "reward": rec.footer.map(|f| f.outcome_reward),
            "termination": rec.footer.map(|f| f.termination.as_str()),
            "messages": format.to_messages(&steps),
        });
        writeln!(out, "{line}")?;
        summary.trajectories += 1;
    }
    Ok(summary)
}

/// Built-in families plus the packs named on the command line.
struct Families {
    packs: Vec<corvid_tasks::TaskPack>,
}

impl Families {
    fn new(paths: &[PathBuf]) -> Result<Self> {
        let packs = paths
            .iter()
            .map(|p| corvid_tasks::load_pack(p).with_context(|| format!("loading {}", p.display())))
            .collect::<Result<_>>()?;
        Ok(Self { packs })
    }

    fn instance(&self, task: &corvid_proto::TaskRef) -> Result<corvid_tasks::TaskInstance> {
        use corvid_tasks::TaskFamily;
        let inst = match self.packs.iter().find(|p| p.name() == task.family) {
            Some(p) => p.instance(task.level, task.seed)?,
            None => corvid_tasks::builtin_family(&task.family)
                .with_context(|| {
                    format!("task family {:?} (pass its pack with --pack)", task.family)
                })?
                .instance(task.level, task.seed)?,
        };
        Ok(inst)
    }
}

/// What re-executing one trajectory found.
struct Rescored {
    calls: usize,
    diverged: Vec<String>,
    stored_success: bool,
    rescored: Option<bool>,
    /// Why nothing was re-executed, when it was not.
    skipped: Option<Skip>,
    note: String,
}

/// Why a trajectory was not re-executed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Skip {
    /// It ended without a verdict (abandoned, infrastructure error): nothing to compare.
    NotScored,
    /// Its task generator changed since it was stored: it cannot be re-scored.
    SpecChanged,
}

impl Rescored {
    fn verdict_differs(&self) -> bool {
        self.rescored.is_some_and(|r| r != self.stored_success)
    }
}

fn rescore(
    store: &TrajectoryStore,
    env: &TaskEnv,
    families: &Families,
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
    let task = families.instance(&rec.header.task)?;
    if task.spec_hash != rec.header.task.spec_hash {
        r.skipped = Some(Skip::SpecChanged);
        r.note = format!(
            "the task generator changed since this was stored (spec {} now {}); skipped",
            rec.header.task.spec_hash, task.spec_hash
        );
        return Ok(r);
    }
    let steps: Vec<Step> = store
        .steps(&rec.header.trajectory_id)?
        .into_iter()
        .flatten()
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading the steps of {}", rec.header.trajectory_id))?;
    let format = EpisodeFormat::default();
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
        let read = read_back(&steps[i + 1..]);
        if !read.is_empty() {
            let expected = format.result_ids(format.closed_by_call(&step.token_ids), &now.text);
            if read != expected {
                if texts_shown {
                    differs.push("output text differs".into());
                } else {
                    texts_shown = true;
                    let tok = format.tokenizer();
                    let (was, is) = (tool_text(tok, &read), tool_text(tok, &expected));
                    let at = first_difference(&was, &is);
                    differs.push(format!(
                        "output text differs at character {at}:\n      stored {}\n      now    {}",
                        text_around(&was, at),
                        text_around(&is, at)
                    ));
                }
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

/// The tool's text in a tool-message context (`EpisodeFormat::result_ids`): what follows
/// `<|tool|>` up to its `<|end|>`. Tool text is encoded plain, so it holds no special token;
/// a context of another shape is decoded whole.
fn tool_text(tok: &corvid_learner::tokenizer::ByteTokenizer, ids: &[u32]) -> String {
    let body = ids
        .iter()
        .position(|&t| t == Special::Tool.id())
        .map(|start| {
            let rest = &ids[start + 1..];
            let end = rest
                .iter()
                .position(|&t| t == Special::End.id())
                .unwrap_or(rest.len());
            &rest[..end]
        });
    tok.decode(body.unwrap_or(ids))
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

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_learner::episode::oracle_steps;
    use corvid_learner::store::Begin;
    use corvid_proto::{SamplingParams, TrajectoryFooter, TrajectoryHeader};

    /// How a stored member of [`store_episodes`]'s group differs from the oracle episode.
    #[derive(Clone, Copy, PartialEq)]
    enum Member {
        /// The oracle episode as it is: a success.
        Oracle,
        /// The final answer replaced by a wrong one: a failure.
        WrongAnswer,
        /// Cut off by actor shutdown: no verdict.
        Abandoned,
        /// Stored under another task-generator spec than today's.
        OldSpec,
        /// The oracle episode with turn 1 split into two steps of the same turn index, as
        /// an actor splits a turn longer than its step limit.
        SplitTurn,
        /// The oracle episode with the first character of the tool output read back at turn
        /// 1 changed (same length, same status: only the text tells).
        ForgedOutput,
        /// A failed second copy of the group's first episode (its sampler seed), as an
        /// actor taken for gone delivers it late.
        SecondCopy,
    }

    /// `steps` with turn 1 split in two steps: the first holds half its context, the second
    /// the rest, the call, its result and the process reward (as the actor splits a turn).
    fn split_turn_1(mut steps: Vec<Step>) -> Vec<Step> {
        let i = steps.iter().position(|s| s.turn == 1).expect("turn 1");
        let whole = steps.remove(i);
        let k = whole.loss_mask.iter().position(|m| *m).expect("generated") / 2;
        assert!(k > 0, "turn 1 has a context to split");
        let mut first = whole.clone();
        first.token_ids.truncate(k);
        first.loss_mask.truncate(k);
        first.logprobs.truncate(k);
        first.policy_versions.truncate(k);
        first.tool_call = None;
        first.tool_result = None;
        first.process_reward = 0.0;
        let mut rest = whole;
        rest.token_ids.drain(..k);
        rest.loss_mask.drain(..k);
        rest.logprobs.drain(..k);
        rest.policy_versions.drain(..k);
        steps.insert(i, rest);
        steps.insert(i, first);
        steps
    }

    /// `steps` with the first character of turn 1's tool text replaced by another ASCII one.
    fn forge_output(mut steps: Vec<Step>) -> Vec<Step> {
        let s = steps.iter_mut().find(|s| s.turn == 1).expect("turn 1");
        let at = 1 + s
            .token_ids
            .iter()
            .position(|&t| t == Special::Tool.id())
            .expect("a tool message");
        let c = s.token_ids[at];
        assert!(c < 128, "an ASCII character");
        s.token_ids[at] = if c == u32::from(b'x') {
            u32::from(b'y')
        } else {
            u32::from(b'x')
        };
        steps
    }

    /// Stores the oracle episode of hops/L2/s4 twice in one group: once as it is (success)
    /// and once with the final answer replaced by a wrong one (failure).
    fn store_group(dir: &Path) -> (Arc<TrajectoryStore>, TaskEnv) {
        store_episodes(
            dir,
            &[("good", Member::Oracle), ("bad", Member::WrongAnswer)],
        )
    }

    /// Stores one group of hops/L2/s4 episodes, each made from the oracle episode as
    /// `members` says.
    fn store_episodes(dir: &Path, members: &[(&str, Member)]) -> (Arc<TrajectoryStore>, TaskEnv) {
        let store = Arc::new(TrajectoryStore::open(dir.join("store")).expect("store"));
        let env = TaskEnv::new(
            corvid_sandbox::Sandbox::builder()
                .search_tool(true)
                .build()
                .expect("sandbox"),
        );
        let format = EpisodeFormat::default();
        let task = corvid_tasks::builtin_family("hops")
            .expect("hops")
            .instance(2, 4)
            .expect("task");
        for (i, &(id, member)) in members.iter().enumerate() {
            let wrong = matches!(member, Member::WrongAnswer | Member::SecondCopy);
            let mut task = task.clone();
            if wrong {
                task.oracle.answer = "12345678".into();
            }
            let demo = oracle_steps(&format, &env, &task).expect("demo");
            let mut task_ref = task.task_ref();
            if member == Member::OldSpec {
                task_ref.spec_hash = "0123456789abcdef".into();
            }
            let header = TrajectoryHeader {
                trajectory_id: id.into(),
                task: task_ref,
                actor_id: "test".into(),
                policy_version: 0,
                sampling: SamplingParams {
                    temperature: 1.0,
                    top_p: 1.0,
                    max_new_tokens: 256,
                    // Episode i's own seed; a second copy repeats the first's.
                    seed: if member == Member::SecondCopy {
                        1
                    } else {
                        i as u64 + 1
                    },
                },
                group_id: "g1".into(),
                started_unix_ms: 0,
            };
            let Begin::New(mut w) = store.begin(header).expect("begin") else {
                panic!("duplicate")
            };
            let tokens: usize = demo.len();
            let generated: usize = demo.steps.iter().map(|s| s.generated_count()).sum();
            let success = demo.verdict.passed();
            let steps = match member {
                Member::SplitTurn => split_turn_1(demo.steps),
                Member::ForgedOutput => forge_output(demo.steps),
                _ => demo.steps,
            };
            let n = steps.len();
            for (seq, step) in steps.into_iter().enumerate() {
                w.append(seq as u64, step).expect("append");
            }
            assert_eq!(success, !wrong);
            w.finish_blocking(TrajectoryFooter {
                outcome_reward: if success { 1.0 } else { 0.0 },
                success,
                termination: if member == Member::Abandoned {
                    Termination::Abandoned
                } else {
                    Termination::Answered
                },
                step_count: n as u64,
                token_count: tokens as u64,
                generated_token_count: generated as u64,
                wall_ms: 1,
                finished_unix_ms: 1,
            })
            .expect("finish");
        }
        (store, env)
    }

    #[test]
    fn list_keeps_its_columns_under_their_headers_whatever_the_id() {
        let dir = tempfile::tempdir().expect("tmp");
        let long = "an-evaluation-label.hops.L2.s4611686018427387904.k0";
        let (store, _env) = store_episodes(
            dir.path(),
            &[("short", Member::Oracle), (long, Member::WrongAnswer)],
        );
        drop(store);
        let store = dir.path().join("store");
        let (status, text) = run_captured(&["replay", "list", "--store", store.to_str().unwrap()]);
        assert_eq!(status.expect("lists"), ExitCode::SUCCESS);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        // Each column ends where its header does; family/level and the id come last.
        let end_of = |line: &str, word: &str| line.find(word).map(|i| i + word.len());
        let reward_end = end_of(lines[0], "reward").expect("header");
        for (row, id, reward) in [(lines[1], "short", "1.000"), (lines[2], long, "0.000")] {
            assert_eq!(end_of(row, reward), Some(reward_end), "{text}");
            assert!(
                row.ends_with(&format!("  hops/2{} {id}", " ".repeat(10))),
                "{text}"
            );
        }
    }

    #[test]
    fn rescore_reproduces_stored_results_and_verdicts() {
        let dir = tempfile::tempdir().expect("tmp");
        let (store, env) = store_group(dir.path());
        let families = Families::new(&[]).expect("families");
        for id in ["good", "bad"] {
            let rec = store.get(id).expect("get").expect("stored");
            let r = rescore(&store, &env, &families, &rec).expect("rescore");
            assert_eq!(r.calls, 3, "{id}: two reads and the answer");
            assert!(r.diverged.is_empty(), "{id}: {:?}", r.diverged);
            assert_eq!(r.rescored, Some(id == "good"), "{id}: {}", r.note);
            assert!(!r.verdict_differs());
        }
        // A stored outcome that the checker does not reproduce is flagged.
        let mut rec = store.get("bad").expect("get").expect("stored");
        if let Some(f) = rec.footer.as_mut() {
            f.success = true;
        }
        let r = rescore(&store, &env, &families, &rec).expect("rescore");
        assert!(r.verdict_differs());
    }

    #[test]
    fn rescore_exits_0_when_verdicts_match_and_2_when_it_cannot_rescore() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            replay: ReplayArgs,
        }
        let dir = tempfile::tempdir().expect("tmp");
        drop(store_group(dir.path()));
        let path = dir.path().join("store");
        let path = path.to_str().expect("utf8");
        let status = |extra: &[&str]| {
            let mut argv = vec!["replay", "rescore", "--store", path];
            argv.extend_from_slice(extra);
            run(Cli::try_parse_from(argv).expect("arguments").replay).expect("an exit status")
        };
        assert_eq!(status(&[]), ExitCode::SUCCESS);
        assert_eq!(status(&["--id", "no-such-trajectory"]), ExitCode::from(2));
    }

    #[test]
    fn a_folder_without_a_store_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().expect("tmp");
        drop(store_group(&dir.path().join("run")));
        let refused = |path: &Path| match open(path) {
            Ok(_) => panic!("{} opened as a store", path.display()),
            Err(e) => e,
        };
        // The run folder, not its store/: refused, pointing at store/, and nothing written.
        let run = dir.path().join("run");
        let before: Vec<_> = std::fs::read_dir(&run).expect("ls").collect();
        let err = format!("{:#}", refused(&run));
        assert!(err.contains("did you mean"), "{err}");
        assert!(
            err.contains(&run.join("store").display().to_string()),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(&run).expect("ls").count(), before.len());
        let err = format!("{:#}", refused(&dir.path().join("nowhere")));
        assert!(err.contains("does not exist"), "{err}");
        let file = dir.path().join("file");
        std::fs::write(&file, "x").expect("write");
        let err = format!("{:#}", refused(&file));
        assert!(err.contains("is a file"), "{err}");
        assert!(open(&run.join("store")).is_ok());
    }

    #[test]
    fn rescore_skips_unscored_trajectories_and_exits_2_for_one_it_cannot_rescore() {
        let dir = tempfile::tempdir().expect("tmp");
        let (store, env) = store_episodes(
            dir.path(),
            &[
                ("good", Member::Oracle),
                ("cut", Member::Abandoned),
                ("old", Member::OldSpec),
            ],
        );
        let families = Families::new(&[]).expect("families");
        let rescored = |id: &str| {
            let rec = store.get(id).expect("get").expect("stored");
            rescore(&store, &env, &families, &rec).expect("rescore")
        };
        assert_eq!(rescored("good").skipped, None);
        let cut = rescored("cut");
        assert_eq!((cut.skipped, cut.calls), (Some(Skip::NotScored), 0));
        let old = rescored("old");
        assert_eq!((old.skipped, old.calls), (Some(Skip::SpecChanged), 0));
        assert!(old.note.contains("task generator changed"), "{}", old.note);
        drop((store, env));

        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            replay: ReplayArgs,
        }
        let path = dir.path().join("store");
        let path = path.to_str().expect("utf8");
        let status = |id: &str| {
            let argv = ["replay", "rescore", "--store", path, "--id", id];
            run(Cli::try_parse_from(argv).expect("arguments").replay).expect("an exit status")
        };
        assert_eq!(status("good"), ExitCode::SUCCESS);
        assert_eq!(status("cut"), ExitCode::SUCCESS, "nothing to compare");
        assert_eq!(status("old"), ExitCode::from(2), "could not re-score");
    }

    /// The command line `argv` (after `corvid`) run as `corvid replay` does, its standard
    /// output captured.
    fn run_captured(argv: &[&str]) -> (Result<ExitCode>, String) {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            replay: ReplayArgs,
        }
        let args = Cli::try_parse_from(argv).expect("arguments").replay;
        let mut out = Vec::new();
        let status = run_to(args, &mut out);
        (status, String::from_utf8(out).expect("utf8"))
    }

    fn stored_steps(store: &TrajectoryStore, id: &str) -> Vec<Step> {
        store
            .steps(id)
            .expect("steps")
            .into_iter()
            .flatten()
            .collect::<Result<_, _>>()
            .expect("steps")
    }

    /// `id` as the trainer reads it.
    fn training_trajectory(store: &TrajectoryStore, id: &str) -> TrainingTrajectory {
        let rec = store.get(id).expect("get").expect("stored");
        TrainingTrajectory {
            header: rec.header,
            footer: rec.footer.expect("finished"),
            steps: stored_steps(store, id),
        }
    }

    fn rl_from(path: &Path, toml: &str) -> RunRl {
        std::fs::write(path, toml).expect("config");
        load_rl(path).expect("rl config")
    }

    /// What `replay show` prints for `rec` with `steps` and `advantages`.
    fn shown(rec: &TrajectoryRecord, steps: &[Step], advantages: &Advantages) -> String {
        let mut text = Vec::new();
        write_transcript(&mut text, rec, steps, advantages, false).expect("show");
        String::from_utf8(text).expect("utf8")
    }

    #[test]
    fn advantages_favour_the_successful_member_of_the_group() {
        let dir = tempfile::tempdir().expect("tmp");
        let (store, _env) = store_group(dir.path());
        let rl = rl_from(
            &dir.path().join("learner.toml"),
            "[rl]\nnormalize_step_advantages = true\n",
        );
        let good = store.get("good").expect("get").expect("stored");
        let bad = store.get("bad").expect("get").expect("stored");
        let a_good = group_advantages(&store, &good, Some(&rl)).expect("adv");
        let a_bad = group_advantages(&store, &bad, Some(&rl)).expect("adv");
        let last = |a: &Advantages| {
            *a.by_turn
                .as_ref()
                .expect("shown")
                .values()
                .last()
                .expect("turns")
        };
        // Identical reads, so equal returns-to-go until the answer decides: the last turn's
        // advantage is positive for the success and negative for the failure.
        assert!(last(&a_good) > 0.5, "{a_good:?}");
        assert!(last(&a_bad) < -0.5, "{a_bad:?}");
        let text = shown(&good, &stored_steps(&store, "good"), &a_good);
        assert!(text.contains("advantage +"), "{text}");
        assert!(text.contains("call  | read_file("), "{text}");
        assert!(
            text.contains("advantages: the trainer's, advantage = step")
                && text.contains("learner.toml"),
            "{text}"
        );
        assert!(text.contains("never consumed by a trainer"), "{text}");
    }

    #[test]
    fn a_second_copy_shows_no_advantage_and_is_not_in_its_group_s_baseline() {
        let dir = tempfile::tempdir().expect("tmp");
        let (store, _env) = store_episodes(
            dir.path(),
            &[
                ("good", Member::Oracle),
                ("bad", Member::WrongAnswer),
                ("copy", Member::SecondCopy),
            ],
        );
        let rl = rl_from(&dir.path().join("config.toml"), "[rl]\n");
        let (good, bad) = (
            training_trajectory(&store, "good"),
            training_trajectory(&store, "bad"),
        );
        // The trainer's group: the copy is not in it.
        let trainer = turn_advantages(&[&good, &bad], &rl.rl).expect("trainer");
        let rec = store.get("good").expect("get").expect("stored");
        let shown = group_advantages(&store, &rec, Some(&rl)).expect("adv");
        let by_turn: Vec<f64> = shown.by_turn.expect("shown").values().copied().collect();
        assert_eq!(&by_turn, trainer[0].as_ref().expect("scored"));
        let rec = store.get("copy").expect("get").expect("stored");
        let shown = group_advantages(&store, &rec, Some(&rl)).expect("adv");
        assert!(shown.by_turn.is_none());
        assert!(
            shown.note.contains("second copy of episode good"),
            "{}",
            shown.note
        );
    }

    #[test]
    fn shown_advantages_are_the_trainers_on_a_group_with_a_split_turn() {
        let dir = tempfile::tempdir().expect("tmp");
        let (store, _env) = store_episodes(
            dir.path(),
            &[("good", Member::SplitTurn), ("bad", Member::WrongAnswer)],
        );
        // The run's config sits next to its store; the demo trains without normalisation.
        let rl = rl_from(
            &dir.path().join("config.toml"),
            "[rl]\nnormalize_step_advantages = false\n",
        );
        let found = run_rl_config(&dir.path().join("store"), None)
            .expect("config")
            .expect("found next to the store");
        assert_eq!(found.path, dir.path().join("config.toml"));
        assert!(!found.rl.normalize_step_advantages);
        let (good, bad) = (
            training_trajectory(&store, "good"),
            training_trajectory(&store, "bad"),
        );
        assert_eq!(good.steps.len(), 4, "turn 1 is split over two steps");
        assert_eq!(bad.steps.len(), 3);
        let trainer = turn_advantages(&[&good, &bad], &rl.rl).expect("trainer");
        // By hand: gamma 1, no normalisation, so A_t = G_t - mean over the two at turn t,
        // G_t the outcome plus the process rewards of turns t.. (a split turn's summed, then
        // clipped at process_clip 1).
        let returns = |t: &TrainingTrajectory| -> Vec<f64> {
            let p: Vec<f64> = t.turns().iter().map(|(p, _)| p.clamp(-1.0, 1.0)).collect();
            (0..p.len())
                .map(|i| p[i..].iter().sum::<f64>() + t.footer.outcome_reward as f64)
                .collect()
        };
        let (g_good, g_bad) = (returns(&good), returns(&bad));
        assert_eq!(g_good.len(), 3);
        for (i, (name, t)) in [("good", &good), ("bad", &bad)].into_iter().enumerate() {
            let rec = store.get(name).expect("get").expect("stored");
            let shown = group_advantages(&store, &rec, Some(&found)).expect("adv");
            let by_turn = shown.by_turn.as_ref().expect("shown");
            let expected = trainer[i].as_ref().expect("scored");
            assert_eq!(
                by_turn.values().copied().collect::<Vec<_>>(),
                *expected,
                "{name}: the trainer's per-turn advantages, in turn order"
            );
            assert_eq!(by_turn.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
            for turn in 0..3 {
                let mine = if name == "good" {
                    g_good[turn]
                } else {
                    g_bad[turn]
                };
                let hand = mine - (g_good[turn] + g_bad[turn]) / 2.0;
                assert!(
                    (by_turn[&(turn as u32)] - hand).abs() < 1e-9,
                    "{name} turn {turn}"
                );
            }
            // Every step of the split turn shows its turn's advantage.
            let text = self::shown(&rec, &t.steps, &shown);
            let turn_1: Vec<&str> = text.lines().filter(|l| l.contains("turn   1:")).collect();
            assert_eq!(turn_1.len(), if name == "good" { 2 } else { 1 }, "{text}");
            let a1 = format!("advantage {:+.3}", by_turn[&1]);
            assert!(turn_1.iter().all(|l| l.ends_with(&a1)), "{a1}: {text}");
            assert!(text.contains("normalize_step_advantages false"), "{text}");
        }
        // The settings decide the numbers: normalised, the same group shows others.
        let rec = store.get("good").expect("get").expect("stored");
        let mut normalised = found.clone();
        normalised.rl.normalize_step_advantages = true;
        assert_ne!(
            group_advantages(&store, &rec, Some(&normalised))
                .expect("adv")
                .by_turn,
            group_advantages(&store, &rec, Some(&found))
                .expect("adv")
                .by_turn
        );
    }

    #[test]
    fn without_a_run_config_no_advantage_is_shown_and_config_selects_the_estimator() {
        let dir = tempfile::tempdir().expect("tmp");
        let (store, _env) = store_group(dir.path());
        let store_dir = dir.path().join("store");
        // A bare store (an eval store): no numbers, and why.
        assert!(run_rl_config(&store_dir, None).expect("none").is_none());
        let good = store.get("good").expect("get").expect("stored");
        let none = group_advantages(&store, &good, None).expect("adv");
        assert_eq!(none.by_turn, None);
        let text = shown(&good, &stored_steps(&store, "good"), &none);
        assert!(
            text.contains(
                "advantages: not shown, no run config found next to the store; pass --config"
            ),
            "{text}"
        );
        assert!(!text.contains(", advantage "), "{text}");
        // --config: GRPO gives the trajectory's advantage on every turn.
        let other = dir.path().join("elsewhere.toml");
        std::fs::write(&other, "[rl]\nadvantage = \"grpo\"\n").expect("config");
        let grpo = run_rl_config(&store_dir, Some(&other))
            .expect("config")
            .expect("given");
        let shown = group_advantages(&store, &good, Some(&grpo)).expect("adv");
        let values: Vec<f64> = shown.by_turn.expect("shown").into_values().collect();
        let trainer = turn_advantages(
            &[
                &training_trajectory(&store, "good"),
                &training_trajectory(&store, "bad"),
            ],
            &grpo.rl,
        )
        .expect("trainer");
        assert_eq!(Some(&values), trainer[0].as_ref());
        assert_eq!(values.len(), 3);
        assert!(
            values.iter().all(|a| *a == values[0] && *a > 0.0),
            "{values:?}"
        );
        assert!(shown.note.contains("grpo"), "{}", shown.note);
        // A file found next to the store that is no run config costs only the advantages
        // (never silent defaults); named with --config, it is an error naming it.
        let found = dir.path().join("config.toml");
        std::fs::write(&found, "[rl]\ngamma = 2.0\n").expect("config");
        assert!(run_rl_config(&store_dir, None).expect("a note").is_none());
        let err = format!(
            "{:#}",
            run_rl_config(&store_dir, Some(&found)).expect_err("refused")
        );
        assert!(
            err.contains("config.toml") && err.contains("gamma"),
            "{err}"
        );
        drop((store, _env));
        // Through the command: the note is printed.
        let (status, out) = run_captured(&[
            "replay",
            "show",
            "--store",
            store_dir.to_str().expect("utf8"),
            "--config",
            other.to_str().expect("utf8"),
            "good",
        ]);
        assert_eq!(status.expect("shown"), ExitCode::SUCCESS);
        assert!(out.contains("advantage = grpo"), "{out}");
    }

    #[test]
    fn export_out_is_replaced_only_by_a_whole_export_with_trajectories() {
        let dir = tempfile::tempdir().expect("tmp");
        drop(store_group(dir.path()));
        let store = dir.path().join("store");
        let store = store.to_str().expect("utf8");
        let file = dir.path().join("out.jsonl");
        let file_s = file.to_str().expect("utf8");
        let export = |extra: &[&str]| {
            let mut argv = vec!["replay", "export", "--store", store, "--out", file_s];
            argv.extend_from_slice(extra);
            run_captured(&argv).0
        };
        // Nothing there yet and nothing matches: refused, nothing written.
        let err = format!("{:#}", export(&["--family", "hopz"]).expect_err("refused"));
        assert!(err.contains("no trajectory matches"), "{err}");
        assert!(!file.exists());
        export(&[]).expect("exported");
        let before = std::fs::read(&file).expect("written");
        assert_eq!(String::from_utf8_lossy(&before).lines().count(), 2);
        // A filter typo leaves the earlier export as it was.
        let err = format!("{:#}", export(&["--family", "hopz"]).expect_err("refused"));
        assert!(err.contains("left as it was"), "{err}");
        assert_eq!(std::fs::read(&file).expect("kept"), before);
        // A narrower export replaces it whole.
        export(&["--success", "true", "--format", "chat"]).expect("exported");
        let after = std::fs::read_to_string(&file).expect("written");
        assert_eq!(after.lines().count(), 1);
        // No temporary file is left behind.
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    }

    #[test]
    fn export_out_inside_the_store_is_refused_and_the_store_kept() {
        let dir = tempfile::tempdir().expect("tmp");
        drop(store_group(dir.path()));
        let store = dir.path().join("store");
        let db = std::fs::read(store.join("db")).expect("db");
        for out in [store.join("db"), store.join("new.jsonl"), store.clone()] {
            let (status, _) = run_captured(&[
                "replay",
                "export",
                "--store",
                store.to_str().expect("utf8"),
                "--out",
                out.to_str().expect("utf8"),
            ]);
            let err = format!("{:#}", status.expect_err("refused"));
            assert!(err.contains("inside the store"), "{}: {err}", out.display());
        }
        // The same file named through a relative path with `..` is refused too.
        let sneaky = store.join("..").join("store").join("db");
        let (status, _) = run_captured(&[
            "replay",
            "export",
            "--store",
            store.to_str().expect("utf8"),
            "--out",
            sneaky.to_str().expect("utf8"),
        ]);
        assert!(status.is_err());
        assert_eq!(std::fs::read(store.join("db")).expect("db"), db);
        assert!(!store.join("new.jsonl").exists());
        let store = open(&store).expect("the store still opens");
        assert_eq!(store.list(&Filter::default()).count(), 2);
    }

    #[test]
    fn rescore_compares_the_output_text_the_policy_read() {
        let dir = tempfile::tempdir().expect("tmp");
        let (store, env) = store_episodes(
            dir.path(),
            &[("good", Member::Oracle), ("forged", Member::ForgedOutput)],
        );
        let families = Families::new(&[]).expect("families");
        let rec = store.get("forged").expect("get").expect("stored");
        let r = rescore(&store, &env, &families, &rec).expect("rescore");
        assert_eq!(r.calls, 3);
        // Same status, exit code and size: only the text differs, and the verdict agrees.
        assert_eq!(r.diverged.len(), 1, "{:?}", r.diverged);
        let d = &r.diverged[0];
        assert!(
            d.starts_with("turn 0: read_file: output text differs at character 0"),
            "{d}"
        );
        assert!(!d.contains("bytes"), "{d}");
        let lines: Vec<&str> = d.lines().collect();
        assert_eq!(lines.len(), 3, "{d}");
        assert!(
            lines[1].trim_start().starts_with("stored \"x")
                || lines[1].trim_start().starts_with("stored \"y"),
            "{d}"
        );
        assert!(lines[2].trim_start().starts_with("now    \""), "{d}");
        assert_ne!(lines[1].trim_start()[6..], lines[2].trim_start()[6..]);
        assert_eq!(r.rescored, Some(true));
        assert!(!r.verdict_differs());
        let good = store.get("good").expect("get").expect("stored");
        assert!(rescore(&store, &env, &families, &good)
            .expect("rescore")
            .diverged
            .is_empty());
    }

    #[test]
    fn rescore_counts_diverged_calls_and_exits_1_although_every_verdict_matches() {
        let dir = tempfile::tempdir().expect("tmp");
        drop(store_episodes(
            dir.path(),
            &[("good", Member::Oracle), ("forged", Member::ForgedOutput)],
        ));
        let store = dir.path().join("store");
        let store = store.to_str().expect("utf8");
        let (status, out) = run_captured(&["replay", "rescore", "--store", store]);
        assert_eq!(status.expect("an exit status"), ExitCode::from(1), "{out}");
        assert!(
            out.contains(
                "2 trajectories re-executed; 1 call(s) diverged from the stored result in 1 \
                 trajectory(ies); 0 verdict(s) differ"
            ),
            "{out}"
        );
        assert!(out.contains("output text differs"), "{out}");
        let (status, out) = run_captured(&["replay", "rescore", "--store", store, "--id", "good"]);
        assert_eq!(status.expect("an exit status"), ExitCode::SUCCESS, "{out}");
        assert!(out.contains("0 call(s) diverged"), "{out}");
    }

    #[test]
    fn chat_export_writes_one_transcript_per_trajectory() {
        let dir = tempfile::tempdir().expect("tmp");
        let (store, _env) = store_group(dir.path());
        let mut buf = Vec::new();
        let summary = export_chat(&store, &Filter::default(), &mut buf).expect("export");
        assert_eq!(summary.trajectories, 2);
        let lines: Vec<serde_json::Value> = String::from_utf8(buf)
            .expect("utf8")
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect();
        assert_eq!(lines.len(), 2);
        for l in &lines {
            let msgs = l["messages"].as_array().expect("messages");
            assert_eq!(msgs[0]["role"], "system");
            assert_eq!(msgs[1]["role"], "user");
            assert!(msgs
                .iter()
                .any(|m| m["tool_calls"][0]["function"]["name"] == "answer"));
        }
    }
}
