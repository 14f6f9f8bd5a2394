//! `corvid replay`: list, show, export, re-score and count stored trajectories.
//!
//! Reads the learner's sled store directly. sled allows one process per store,
//! so run it on a stopped learner's store (or a copy of a live one).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use corvid_learner::episode::EpisodeFormat;
use corvid_learner::store::{ExportSummary, Filter, TrajectoryRecord, TrajectoryStore};
use corvid_proto::{Step, Termination};
use corvid_rewards::{step_advantages, StepBaseline, StepEpisode};
use corvid_tasks::{Episode, TaskEnv};

/// List, show and export stored trajectories.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid replay list --store runs/demo/store --family hops --success false
  corvid replay show --store runs/demo/store actor-1.ep-17
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
    /// results, per-turn process rewards and step-level advantages within its group.
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
        /// Write here instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Re-executes every stored tool call in a fresh sandbox workspace of the same task
    /// instance, reports calls whose result differs from the stored one, and re-runs the
    /// checker on the final state. Exits 0 if every verdict matches the stored success, 1 if
    /// any differs, 2 if it could not re-score (a bad store, an unknown family: pass the
    /// trajectories' task packs with --pack; a trajectory whose task generator changed since
    /// it was stored). Trajectories that ended without a verdict (abandoned) are skipped.
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
    let rescoring = matches!(args.command, ReplayCommand::Rescore { .. });
    match run_command(args) {
        // `rescore` keeps 1 for "a verdict differs", so that a script can tell it from an error.
        Err(err) if rescoring && !crate::is_broken_pipe(&err) => {
            eprintln!("error: {}", crate::error_text(&err));
            Ok(ExitCode::from(RESCORE_ERROR))
        }
        r => r,
    }
}

/// `replay rescore`'s exit status when it could not re-score.
const RESCORE_ERROR: u8 = 2;

fn run_command(args: ReplayArgs) -> Result<ExitCode> {
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
                    "{:<48} {:<14} {:>7} {:>7} {:<12} {:>7} {:>9} {:>8}",
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
        ReplayCommand::Show {
            store,
            id,
            json,
            full,
        } => {
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
                let advantages = group_advantages(&store, &rec)?;
                write_transcript(&mut out, &rec, &steps, advantages.as_deref(), full)?;
            }
        }
        ReplayCommand::Export {
            store,
            filter,
            format,
            out: path,
        } => {
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
                Some(p) => {
                    let file = std::fs::File::create(p)
                        .with_context(|| format!("creating {}", p.display()))?;
                    let mut w = std::io::BufWriter::new(file);
                    let s = export(&mut w)?;
                    w.flush()
                        .with_context(|| format!("writing {}", p.display()))?;
                    s
                }
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
                "{} trajectories re-executed; {} verdict(s) differ from the stored outcome",
                records.len() - not_scored - stale,
                mismatched,
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
            if mismatched > 0 {
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
        "{:<48} {:<14} {:>7} {:>7} {:<12} {:>7} {:>9} {:>8.3}",
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

/// Step-level advantages of `rec`'s turns within its group (the trajectories sharing its
/// `group_id`): `A_t = (G_t − mean_t) / (std_t + 1e-6)` over the group's scored episodes at
/// turn `t`, with `G_t` the undiscounted return-to-go of process rewards plus the outcome
/// (`corvid_rewards::step_advantages`, turn-index buckets). `None` when the group has no
/// other scored member here.
fn group_advantages(store: &TrajectoryStore, rec: &TrajectoryRecord) -> Result<Option<Vec<f64>>> {
    let filter = Filter {
        family: Some(rec.header.task.family.clone()),
        level: Some(rec.header.task.level),
        ..Filter::default()
    };
    let mut members: Vec<(TrajectoryRecord, Vec<f64>)> = Vec::new();
    for r in store.list(&filter) {
        let r = r?;
        if r.header.group_id != rec.header.group_id || r.footer.is_none() {
            continue;
        }
        let rewards: Vec<f64> = store
            .steps(&r.header.trajectory_id)?
            .into_iter()
            .flatten()
            .map(|s| s.map(|s| s.process_reward as f64))
            .collect::<Result<_, _>>()?;
        members.push((r, rewards));
    }
    if members.len() < 2 {
        return Ok(None);
    }
    let episodes: Vec<StepEpisode<'_>> = members
        .iter()
        .map(|(r, p)| {
            let f = r.footer.expect("filtered above");
            StepEpisode {
                process_rewards: p,
                outcome: f.outcome_reward as f64,
                termination: f.termination,
                state_keys: &[],
            }
        })
        .collect();
    let adv = step_advantages(&episodes, 1.0, StepBaseline::TurnIndex, true, 1e-6)?;
    let me = members
        .iter()
        .position(|(r, _)| r.header.trajectory_id == rec.header.trajectory_id);
    Ok(me.and_then(|i| adv[i].clone()))
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
    advantages: Option<&[f64]>,
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
    if advantages.is_none() {
        writeln!(
            out,
            "  (no step advantages: no other scored member of group {} is stored)",
            h.group_id
        )?;
    }
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
        match advantages.and_then(|a| a.get(s.turn as usize)) {
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
    let mut ep = Episode::start(env, &task)?;
    for step in store
        .steps(&rec.header.trajectory_id)?
        .into_iter()
        .flatten()
    {
        let step = step?;
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
        if let Some(stored) = &step.tool_result {
            if stored.status != now.result.status
                || stored.exit_code != now.result.exit_code
                || stored.bytes_shown != now.result.bytes_shown
            {
                r.diverged.push(format!(
                    "turn {}: {}: stored {} exit {} {} bytes, now {} exit {} {} bytes",
                    step.turn,
                    call.name,
                    stored.status,
                    stored.exit_code,
                    stored.bytes_shown,
                    now.result.status,
                    now.result.exit_code,
                    now.result.bytes_shown
                ));
            }
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
        for &(id, member) in members {
            let wrong = member == Member::WrongAnswer;
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
                    seed: 0,
                },
                group_id: "g1".into(),
                started_unix_ms: 0,
            };
            let Begin::New(mut w) = store.begin(header).expect("begin") else {
                panic!("duplicate")
            };
            let tokens: usize = demo.len();
            let generated: usize = demo.steps.iter().map(|s| s.generated_count()).sum();
            let n = demo.steps.len();
            for (seq, step) in demo.steps.into_iter().enumerate() {
                w.append(seq as u64, step).expect("append");
            }
            let success = demo.verdict.passed();
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

    #[test]
    fn advantages_favour_the_successful_member_of_the_group() {
        let dir = tempfile::tempdir().expect("tmp");
        let (store, _env) = store_group(dir.path());
        let good = store.get("good").expect("get").expect("stored");
        let bad = store.get("bad").expect("get").expect("stored");
        let a_good = group_advantages(&store, &good)
            .expect("adv")
            .expect("group of 2");
        let a_bad = group_advantages(&store, &bad)
            .expect("adv")
            .expect("group of 2");
        // Identical reads, so equal returns-to-go until the answer decides: the last turn's
        // advantage is positive for the success and negative for the failure.
        assert!(a_good.last().expect("turns") > &0.5, "{a_good:?}");
        assert!(a_bad.last().expect("turns") < &-0.5, "{a_bad:?}");
        let mut text = Vec::new();
        let steps: Vec<Step> = store
            .steps("good")
            .expect("steps")
            .into_iter()
            .flatten()
            .collect::<Result<_, _>>()
            .expect("steps");
        write_transcript(&mut text, &good, &steps, Some(&a_good), false).expect("show");
        let text = String::from_utf8(text).expect("utf8");
        assert!(text.contains("advantage +"), "{text}");
        assert!(text.contains("call  | read_file("), "{text}");
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
