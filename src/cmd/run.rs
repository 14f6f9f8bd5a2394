//! `corvid run`: the one-command local job. A learner and K actor *processes* on loopback,
//! SFT then RL, evaluation on held-out seeds, and a report.
//!
//! The phases, each a real child process of this binary:
//!
//! 1. **SFT**: `corvid learner` on the run folder with no actors; once the SFT reference
//!    (`ref/`) and its checkpoint exist, it is stopped with SIGTERM (it checkpoints and exits).
//! 2. **Ablation copy**: when the config names an ablation config, the stopped run folder is
//!    copied to `runs/<name>-ablation/`, so both RL runs start from the same SFT weights.
//! 3. **RL**: `corvid learner --resume` and K `corvid actor`s, for `rl_minutes` of wall time
//!    (or until the learner reaches `schedule.max_updates`); one progress line per update.
//!    With `run_minutes` set, each arm instead gets what is left of that budget after SFT,
//!    less `eval_reserve_minutes`, shared between the arms and capped at `rl_minutes`
//!    ([`rl_minutes_within`]): a slower machine's longer SFT leaves RL less, a faster one's more.
//!    Then the actors get SIGTERM (they finish or abandon their episodes, nothing is lost),
//!    then the learner (it checkpoints). The ablation runs the same way on its copy.
//! 4. **Evaluation** in this process on held-out seeds: the random initial policy, the SFT
//!    reference, the RL result (and the ablation's), `eval/<stage>.json`, episodes stored
//!    in `eval/store`. The random policy is one initialisation drawn with the config's
//!    `seed` and saved to `eval/random-init/`, so every level evaluates the same weights.
//!    `eval_workers` threads take one job per stage and level from a queue (the random
//!    policy's and the longest levels first), each decoding on one core.
//! 5. **Report**: `run.json`, then `report.json`, `report.html` and the plots.
//!
//! Children run in their own process groups, so Ctrl-C reaches only this process, which then
//! stops the children in order (actors, then learner) and goes on to evaluate and report
//! what exists. A second Ctrl-C skips evaluation.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use corvid_learner::config::LearnerConfig;
use corvid_learner::model::{checkpoint, ModelConfig};
use corvid_learner::store::TrajectoryStore;
use corvid_learner::trainer::build_model;
use serde::{Deserialize, Serialize};

use super::eval::{evaluate_into, open_store, EvalArgs, EvalResult};

/// Train an agent end to end: a learner and K actor processes, SFT then RL, evaluation and
/// a report.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid run --config configs/demo.toml
  corvid run --config configs/demo.toml --name demo2 --rl-minutes 5
  corvid report --run-dir runs/demo          rebuild the report of a finished or interrupted run

The config is a learner config (see configs/demo.toml) plus a [run] table:
  actors, actor_concurrency, rl_minutes, run_minutes, eval_reserve_minutes, sft_timeout_minutes,
  eval_family, eval_levels, eval_episodes, eval_concurrency, eval_max_new_tokens, eval_workers,
  ablation (another learner config, e.g. configs/demo-grpo.toml, trained on a copy of the SFT
  result for the same budget).
Output: runs/<name>/ with learner.log, actor-<i>.log, store/, ckpt/, ref/, metrics/, eval/,
run.json, report.json, report.html and PNG plots. Ctrl-C stops training cleanly (with a
checkpoint) and still evaluates and reports; a second Ctrl-C skips evaluation.")]
pub struct RunArgs {
    /// The run config (a learner config with a [run] table).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Run name (default: `run_name` in the config); the run folder is `runs/<name>`.
    #[arg(long)]
    name: Option<String>,
    /// Override `[run] rl_minutes`: a fixed RL budget per arm (turns `run_minutes` off).
    #[arg(long)]
    rl_minutes: Option<f64>,
    /// Override `[run] eval_episodes`.
    #[arg(long)]
    eval_episodes: Option<usize>,
    /// Skip the ablation even if the config names one.
    #[arg(long)]
    no_ablation: bool,
}

/// The `[run]` table: what `corvid run` adds to a learner config.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunSection {
    /// Actor processes. Default 2.
    pub actors: usize,
    /// Episodes each actor runs at once. Default 16.
    pub actor_concurrency: usize,
    /// Wall-clock minutes of RL per run (the learner's `schedule.max_updates` may stop it
    /// sooner); with `run_minutes` set, the most each arm gets. Default 8.
    pub rl_minutes: f64,
    /// Wall-clock minutes the whole run should take (0 = off). When set, each RL arm gets
    /// what is left after SFT, less `eval_reserve_minutes`, shared between the arms, at most
    /// `rl_minutes` and at least half a minute. Default 0.
    pub run_minutes: f64,
    /// Minutes kept for evaluation and the report when `run_minutes` is set. Default 2.5.
    pub eval_reserve_minutes: f64,
    /// Family evaluated on held-out seeds. Default `hops`.
    pub eval_family: String,
    /// Levels evaluated, `A..B`; `corvid run` extends `B` up to the higher of the arms' final
    /// frontier levels, so the headline figures are always measured. Default `1..4`.
    pub eval_levels: String,
    /// Held-out instances per level and stage. Default 200.
    pub eval_episodes: usize,
    /// Episodes decoded at once during evaluation. Default 64.
    pub eval_concurrency: usize,
    /// Most tokens per turn during evaluation. Default 160.
    pub eval_max_new_tokens: u32,
    /// Stages evaluated at once (each on one libtorch thread). Default 2.
    pub eval_workers: usize,
    /// Another learner config trained on a copy of the SFT result for the same budget, for
    /// the ablation (empty = none). Default empty.
    pub ablation: String,
    /// Most minutes to wait for SFT before giving up. Default 30.
    pub sft_timeout_minutes: f64,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            actors: 2,
            actor_concurrency: 16,
            rl_minutes: 8.0,
            run_minutes: 0.0,
            eval_reserve_minutes: 2.5,
            eval_family: "hops".into(),
            eval_levels: "1..4".into(),
            eval_episodes: 200,
            eval_concurrency: 64,
            eval_max_new_tokens: 160,
            eval_workers: 2,
            ablation: String::new(),
            sft_timeout_minutes: 30.0,
        }
    }
}

/// The longest wall-clock budget `[run]` accepts for a phase: one week, in minutes.
const MAX_PHASE_MINUTES: f64 = 7.0 * 24.0 * 60.0;

impl RunSection {
    /// Checks every field that needs nothing else, naming the offending one, so a bad value
    /// is refused before SFT rather than after training. `eval_family` is checked against
    /// the learner config's families by [`RunSection::validate_family`].
    pub fn validate(&self) -> Result<()> {
        for (field, minutes) in [
            ("rl_minutes", self.rl_minutes),
            ("sft_timeout_minutes", self.sft_timeout_minutes),
        ] {
            if !(minutes.is_finite() && minutes > 0.0 && minutes <= MAX_PHASE_MINUTES) {
                bail!("[run] {field} = {minutes}: must be a number of minutes in (0, {MAX_PHASE_MINUTES}]");
            }
        }
        for (field, minutes) in [
            ("run_minutes", self.run_minutes),
            ("eval_reserve_minutes", self.eval_reserve_minutes),
        ] {
            if !(minutes.is_finite() && (0.0..=MAX_PHASE_MINUTES).contains(&minutes)) {
                bail!("[run] {field} = {minutes}: must be a number of minutes in [0, {MAX_PHASE_MINUTES}]");
            }
        }
        for (field, n) in [
            ("actors", self.actors),
            ("actor_concurrency", self.actor_concurrency),
            ("eval_episodes", self.eval_episodes),
            ("eval_concurrency", self.eval_concurrency),
            ("eval_workers", self.eval_workers),
            ("eval_max_new_tokens", self.eval_max_new_tokens as usize),
        ] {
            if n == 0 {
                bail!("[run] {field} = 0: must be at least 1");
            }
        }
        super::eval::parse_levels(&self.eval_levels)
            .map_err(|e| anyhow::anyhow!("[run] eval_levels: {e}"))?;
        Ok(())
    }

    /// Checks that `eval_family` is one of `families` and has the levels `eval_levels` names.
    pub fn validate_family(&self, families: &corvid_tasks::Families) -> Result<()> {
        let family = families
            .get(&self.eval_family)
            .with_context(|| format!("[run] eval_family = {:?}", self.eval_family))?;
        let (_, last) = super::eval::parse_levels(&self.eval_levels)
            .map_err(|e| anyhow::anyhow!("[run] eval_levels: {e}"))?;
        if last > family.levels() {
            bail!(
                "[run] eval_levels = {:?}: {} has levels 1..={}",
                self.eval_levels,
                self.eval_family,
                family.levels()
            );
        }
        Ok(())
    }
}

/// The least RL an arm gets when `run_minutes` is set, however long SFT took.
const MIN_RL_MINUTES: f64 = 0.5;

/// Each RL arm's minutes when the whole run should take `run_minutes`: what is left after
/// `elapsed` minutes (SFT and start-up) and the evaluation reserve, shared between `arms`,
/// at most `cap` (`rl_minutes`) and at least [`MIN_RL_MINUTES`].
pub fn rl_minutes_within(
    run_minutes: f64,
    elapsed: f64,
    eval_reserve: f64,
    arms: u32,
    cap: f64,
) -> f64 {
    let left = (run_minutes - elapsed - eval_reserve) / f64::from(arms.max(1));
    left.min(cap).max(MIN_RL_MINUTES.min(cap))
}

/// The learner's run-name rule, naming where `corvid run` took the name from.
fn check_run_name(name: &str) -> Result<()> {
    corvid_learner::config::check_run_name(name)
        .context("the run name (--name, else the config's run_name)")
}

/// `run.json`: what happened, for the report.
#[derive(Debug, Clone, Serialize)]
struct RunRecord {
    name: String,
    main_family: String,
    config: String,
    started_unix_ms: u64,
    finished_unix_ms: u64,
    stages: BTreeMap<String, f64>,
    interrupted: bool,
    frontier_level: BTreeMap<String, u32>,
    level_tokens: BTreeMap<String, BTreeMap<String, usize>>,
    ablation: BTreeMap<String, Option<f64>>,
    ablation_frontier_level: BTreeMap<String, u32>,
    /// `[sft] heldout_loss_target`, so the report can say whether SFT reached it.
    sft_heldout_loss_target: Option<f64>,
}

/// Ctrl-C / SIGTERM count, set by a signal thread.
fn interrupts() -> Arc<AtomicU32> {
    let count = Arc::new(AtomicU32::new(0));
    let c = count.clone();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            else {
                return;
            };
            loop {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
                let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                eprintln!(
                    "\n[run] interrupt {n}: {}",
                    if n == 1 {
                        "stopping training cleanly (Ctrl-C again to skip evaluation)"
                    } else {
                        "evaluation will be skipped"
                    }
                );
            }
        });
    });
    count
}

/// A child process in its own process group, stopped with SIGTERM then SIGKILL.
struct Proc {
    name: String,
    child: Child,
}

impl Proc {
    /// Starts `corvid <args>` logging to `log`. `shares_cores`: other processes of this run
    /// compute at the same time (RL), so OpenMP threads should sleep rather than spin.
    fn spawn(name: &str, args: &[String], log: &Path, shares_cores: bool) -> Result<Self> {
        let exe = std::env::current_exe().context("locating the corvid binary")?;
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("duplicating a log handle")?;
        let mut cmd = Command::new(&exe);
        // libtorch's OpenMP threads busy-wait after every op: with a learner and actors
        // sharing a few cores that spinning costs 2x or more, while a process alone (SFT)
        // runs ~20% faster spinning than sleeping (BENCHMARKS.md, Model). A policy set by
        // the user wins.
        if std::env::var_os("OMP_WAIT_POLICY").is_none() {
            cmd.env(
                "OMP_WAIT_POLICY",
                if shares_cores { "PASSIVE" } else { "ACTIVE" },
            );
        }
        let child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {name} ({})", exe.display()))?;
        Ok(Self {
            name: name.to_string(),
            child,
        })
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The exit status once it has exited.
    fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    fn signal(&self, sig: i32) {
        // SAFETY: `kill` has no memory-safety preconditions; the pid is our own child's.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL. Returns whether it exited on its own.
    fn stop(&mut self, grace: Duration) -> bool {
        if !self.alive() {
            return true;
        }
        self.signal(libc::SIGTERM);
        let t = Instant::now();
        while t.elapsed() < grace {
            if !self.alive() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "[run] {} did not stop within {grace:?}; killing it",
            self.name
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.alive() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")
        .context("finding a free loopback port")?
        .local_addr()?
        .port())
}

/// Splits a run config into its learner part and the `[run]` table.
fn split_config(path: &Path) -> Result<(toml::Table, RunSection)> {
    // Checked as `corvid learner` checks it, on the file as written: errors name this file
    // and its lines (the copy written into the run folder has other line numbers).
    LearnerConfig::load(path)?;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut table: toml::Table = text
        .parse()
        .with_context(|| format!("{} is not valid TOML", path.display()))?;
    let run = match table.remove("run") {
        Some(v) => v
            .try_into::<RunSection>()
            .with_context(|| format!("{}: the [run] table", path.display()))?,
        None => RunSection::default(),
    };
    Ok((table, run))
}

/// Writes the learner part of a config into the run folder, with the run folder, listen
/// address and token fixed for this run; validates it the way `corvid learner` will.
fn write_learner_config(
    mut table: toml::Table,
    run_dir: &Path,
    port: u16,
    name: &str,
) -> Result<(PathBuf, LearnerConfig)> {
    table.insert("run_name".into(), name.into());
    table.insert("listen".into(), format!("127.0.0.1:{port}").into());
    table.insert("run_dir".into(), run_dir.display().to_string().into());
    table.remove("token_file");
    // A second learner on the same machine must not fight over the Prometheus port.
    if let Some(toml::Value::Table(m)) = table.get_mut("metrics") {
        m.insert("prometheus".into(), "".into());
    }
    let text = toml::to_string_pretty(&table).context("writing the learner config")?;
    let cfg = LearnerConfig::from_toml(&text).context("the learner part of the run config")?;
    let path = run_dir.join("learner.toml");
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    Ok((path, cfg))
}

/// The learner part of the ablation config, read once before anything runs and checked:
/// the ablation resumes a copy of the SFT run, whose curriculum has the main config's task
/// levels; its learner would refuse other levels, and an arm that never trains would be
/// evaluated as the SFT policy under the ablation's name.
fn read_ablation_config(
    main: &LearnerConfig,
    main_path: &Path,
    ablation: &Path,
) -> Result<toml::Table> {
    let (table, _) = split_config(ablation)
        .with_context(|| format!("[run] ablation = {:?}", ablation.display().to_string()))?;
    let text = toml::to_string_pretty(&table).context("reading the ablation config")?;
    let other = LearnerConfig::from_toml(&text)
        .with_context(|| format!("{}: the learner part", ablation.display()))?;
    let (a, b) = (main.family_levels()?, other.family_levels()?);
    if a != b {
        bail!(
            "the ablation config {} trains task levels {b:?} but {} trains {a:?}; the two arms \
             must share [tasks]",
            ablation.display(),
            main_path.display()
        );
    }
    Ok(table)
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let ty = entry.file_type()?;
        let dst = to.join(entry.file_name());
        if ty.is_dir() {
            copy_dir(&entry.path(), &dst)?;
        } else if ty.is_file() {
            std::fs::copy(entry.path(), &dst).with_context(|| {
                format!("copying {} to {}", entry.path().display(), dst.display())
            })?;
        }
    }
    Ok(())
}

fn has_checkpoint(run_dir: &Path) -> bool {
    std::fs::read_dir(run_dir.join("ckpt"))
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().parse::<u64>().is_ok())
        })
        .unwrap_or(false)
}

/// The RL learner's arguments: after SFT it resumes from the run's checkpoint; a run without
/// SFT (`[schedule] sft = false`) starts fresh.
fn rl_learner_args(learner_cfg: &Path, run_dir: &Path) -> Vec<String> {
    let mut args = vec![
        "learner".to_string(),
        "--config".into(),
        learner_cfg.display().to_string(),
    ];
    if has_checkpoint(run_dir) {
        args.push("--resume".into());
    }
    args
}

/// Newest run checkpoint folder.
fn latest_checkpoint(run_dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(run_dir.join("ckpt"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().parse::<u64>().ok()?;
            Some((n, e.path()))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, p)| p)
}

/// Follows a JSONL file, returning complete new lines.
struct Tail {
    path: PathBuf,
    pos: u64,
}

impl Tail {
    fn new(path: PathBuf) -> Self {
        Self { path, pos: 0 }
    }

    fn lines(&mut self) -> Vec<serde_json::Value> {
        let Ok(mut f) = File::open(&self.path) else {
            return Vec::new();
        };
        if f.seek(SeekFrom::Start(self.pos)).is_err() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut reader = BufReader::new(f);
        let mut line = String::new();
        while let Ok(n) = reader.read_line(&mut line) {
            if n == 0 || !line.ends_with('\n') {
                break;
            }
            self.pos += n as u64;
            if let Ok(v) = serde_json::from_str(&line) {
                out.push(v);
            }
            line.clear();
        }
        out
    }
}

fn progress_line(label: &str, v: &serde_json::Value, rl_start: Instant) -> String {
    let f = |p: &str| v.pointer(p).and_then(|x| x.as_f64()).unwrap_or(f64::NAN);
    let frontier = v
        .pointer("/curriculum/frontier")
        .and_then(|x| x.as_object())
        .map(|m| {
            m.iter()
                .map(|(k, l)| format!("{k} L{l}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    format!(
        "[{label} {:>5.0}s] update {:>4} v{:<4} reward {:>6.3} success {:>5.1}% | frontier {} | {:>6.0} tok/s {:>5.2} ep/s | staleness {:.2} | loss {:+.4} kl {:.4} ent {:.3}",
        rl_start.elapsed().as_secs_f64(),
        f("/step"),
        f("/policy_version"),
        f("/rollout/reward_mean"),
        100.0 * f("/rollout/success_rate"),
        frontier,
        f("/rollout/tokens_per_s"),
        f("/rollout/episodes_per_s"),
        f("/rollout/staleness_mean"),
        f("/loss/policy"),
        f("/loss/kl"),
        f("/loss/entropy"),
    )
}

/// The curriculum frontier (family → level) of a metrics line, if it has one.
fn frontier_of(v: &serde_json::Value) -> Option<BTreeMap<String, u32>> {
    let m = v.pointer("/curriculum/frontier")?.as_object()?;
    Some(
        m.iter()
            .filter_map(|(k, l)| Some((k.clone(), l.as_u64()? as u32)))
            .collect(),
    )
}

/// What one RL phase left behind.
struct RlOutcome {
    seconds: f64,
    frontier: BTreeMap<String, u32>,
}

/// Phase 1: SFT with no actors, stopped once the reference and its checkpoint exist.
fn sft_phase(
    learner_cfg: &Path,
    run_dir: &Path,
    run: &RunSection,
    stop: &AtomicU32,
) -> Result<f64> {
    let t = Instant::now();
    if run_dir.join("ref").join("config.json").exists() && has_checkpoint(run_dir) {
        eprintln!("[run] SFT already done in {}; skipping", run_dir.display());
        return Ok(0.0);
    }
    eprintln!(
        "[sft] training on oracle demonstrations (log: {}/learner.log)",
        run_dir.display()
    );
    let mut learner = Proc::spawn(
        "learner (sft)",
        &[
            "learner".into(),
            "--config".into(),
            learner_cfg.display().to_string(),
        ],
        &run_dir.join("learner.log"),
        false,
    )?;
    let mut tail = Tail::new(run_dir.join("metrics").join("sft.jsonl"));
    let deadline = Duration::from_secs_f64(run.sft_timeout_minutes * 60.0);
    // Trained tokens per second between consecutive lines.
    let mut last: Option<(f64, f64)> = None;
    loop {
        for v in tail.lines() {
            let f = |p: &str| v.pointer(p).and_then(|x| x.as_f64()).unwrap_or(f64::NAN);
            let (now_ms, seen) = (f("/unix_ms"), f("/tokens_seen"));
            let rate = match last {
                Some((ms, tok)) if now_ms > ms => {
                    format!("{:>6.0}", (seen - tok) / ((now_ms - ms) / 1e3))
                }
                _ => "     -".into(),
            };
            last = Some((now_ms, seen));
            eprintln!(
                "[sft {:>5.0}s] step {:>5} loss {:.4}{} lr {:.2e} {rate} trained tok/s",
                t.elapsed().as_secs_f64(),
                f("/step"),
                f("/loss"),
                v.get("heldout_loss")
                    .and_then(|x| x.as_f64())
                    .map(|h| format!(" held-out {h:.4}"))
                    .unwrap_or_default(),
                f("/lr"),
            );
        }
        if run_dir.join("ref").join("config.json").exists() && has_checkpoint(run_dir) {
            break;
        }
        if !learner.alive() {
            bail!(
                "the learner exited during SFT; see {}/learner.log",
                run_dir.display()
            );
        }
        if stop.load(Ordering::SeqCst) > 0 {
            learner.stop(Duration::from_secs(120));
            bail!(
                "interrupted during SFT (the learner saved a checkpoint; nothing to evaluate yet)"
            );
        }
        if t.elapsed() > deadline {
            learner.stop(Duration::from_secs(60));
            bail!(
                "SFT did not finish within {} minutes",
                run.sft_timeout_minutes
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // Let the post-SFT checkpoint land, then stop.
    learner.stop(Duration::from_secs(120));
    let s = t.elapsed().as_secs_f64();
    eprintln!(
        "[sft] done in {s:.0}s; reference policy in {}/ref",
        run_dir.display()
    );
    Ok(s)
}

/// Phase 3: the learner resumes after SFT, K actors roll out, for the RL budget.
#[allow(clippy::too_many_arguments)]
fn rl_phase(
    label: &str,
    learner_cfg: &Path,
    port: u16,
    run_dir: &Path,
    run: &RunSection,
    packs: &[PathBuf],
    stop: &AtomicU32,
) -> Result<RlOutcome> {
    let t = Instant::now();
    eprintln!(
        "[{label}] learner + {} actors x {} episodes, {} minutes (logs in {})",
        run.actors,
        run.actor_concurrency,
        run.rl_minutes,
        run_dir.display()
    );
    let mut learner = Proc::spawn(
        &format!("learner ({label})"),
        &rl_learner_args(learner_cfg, run_dir),
        &run_dir.join(format!("learner-{label}.log")),
        true,
    )?;
    let token = run_dir.join("token");
    // A run without SFT meets its learner for the first time here: the actors need the token
    // file that the learner writes as it starts.
    let waiting = Instant::now();
    while !token.exists() {
        if let Some(status) = learner.exit_status() {
            bail!(
                "the {label} learner exited ({status}) before writing its token file; see {}",
                run_dir.join(format!("learner-{label}.log")).display()
            );
        }
        if waiting.elapsed() > Duration::from_secs(120) {
            bail!(
                "the {label} learner wrote no token file {} within 120 s",
                token.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let url = format!("http://127.0.0.1:{port}");
    let mut actors = Vec::new();
    for i in 0..run.actors {
        let mut args: Vec<String> = packs
            .iter()
            .flat_map(|p| ["--task-pack".to_string(), p.display().to_string()])
            .collect();
        args.extend([
            "actor".into(),
            "--learner".into(),
            url.clone(),
            "--token-file".into(),
            token.display().to_string(),
            "--concurrency".into(),
            run.actor_concurrency.to_string(),
            "--spool".into(),
            run_dir.join(format!("spool-{i}")).display().to_string(),
            "--name".into(),
            format!("{label}-actor-{i}"),
        ]);
        args.rotate_left(2 * packs.len());
        actors.push(Proc::spawn(
            &format!("actor {i}"),
            &args,
            &run_dir.join(format!("actor-{label}-{i}.log")),
            true,
        )?);
    }
    let budget = Duration::from_secs_f64(run.rl_minutes * 60.0);
    let mut tail = Tail::new(run_dir.join("metrics").join("metrics.jsonl"));
    let mut frontier = BTreeMap::new();
    let mut learner_exited = false;
    while t.elapsed() < budget && stop.load(Ordering::SeqCst) == 0 {
        for v in tail.lines() {
            eprintln!("{}", progress_line(label, &v, t));
            if let Some(f) = frontier_of(&v) {
                frontier = f;
            }
        }
        if let Some(status) = learner.exit_status() {
            learner_ended_early(
                label,
                status,
                t.elapsed(),
                &run_dir.join(format!("learner-{label}.log")),
            )?;
            learner_exited = true;
            break;
        }
        for a in actors.iter_mut() {
            if !a.alive() {
                eprintln!("[{label}] {} exited; see its log", a.name);
            }
        }
        actors.retain_mut(|a| a.alive());
        if actors.is_empty() && run.actors > 0 {
            // Nothing can roll out any more: stop rather than spend the budget waiting.
            learner.stop(Duration::from_secs(180));
            bail!(
                "every {label} actor exited after {:.0} s; see {}/actor-{label}-*.log",
                t.elapsed().as_secs_f64(),
                run_dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("[{label}] stopping: actors first, then the learner (it checkpoints)");
    for a in actors.iter_mut() {
        a.signal(libc::SIGTERM);
    }
    for a in actors.iter_mut() {
        a.stop(Duration::from_secs(60));
    }
    if !learner_exited {
        learner.stop(Duration::from_secs(180));
    }
    for v in tail.lines() {
        eprintln!("{}", progress_line(label, &v, t));
        if let Some(f) = frontier_of(&v) {
            frontier = f;
        }
    }
    Ok(RlOutcome {
        seconds: t.elapsed().as_secs_f64(),
        frontier,
    })
}

/// A learner that exits before the RL budget is spent: a clean exit (`[schedule] max_updates`
/// reached) ends the phase early and says so; a failure stops the run, naming the learner's
/// log, rather than evaluating a policy that did not get its budget as if it had.
fn learner_ended_early(label: &str, status: ExitStatus, after: Duration, log: &Path) -> Result<()> {
    if status.success() {
        eprintln!(
            "[{label}] the learner finished on its own after {:.0} s (max_updates reached?); ending the phase",
            after.as_secs_f64()
        );
        return Ok(());
    }
    anyhow::bail!(
        "the {label} learner exited with {status} after {:.0} s of its RL budget; see {} \
         (its checkpoints are kept: `corvid report --run-dir` reports what finished)",
        after.as_secs_f64(),
        log.display()
    )
}

/// The levels to evaluate: `[run] eval_levels`, extended up to the highest final frontier level
/// of `family` among the arms, so the headline figures at the frontier are always measured.
fn eval_levels(
    configured: &str,
    family: &str,
    frontiers: &[&BTreeMap<String, u32>],
) -> Result<(u32, u32)> {
    let (first, last) = super::eval::parse_levels(configured)
        .map_err(|e| anyhow::anyhow!("[run] eval_levels: {e}"))?;
    let reached = frontiers
        .iter()
        .filter_map(|f| f.get(family).copied())
        .max()
        .unwrap_or(0);
    Ok((first, last.max(reached)))
}

/// Evaluates one stage's policy on one level (one job of the evaluation queue).
fn eval_job(
    job: &EvalJob,
    run_dir: &Path,
    run: &RunSection,
    pack: Option<PathBuf>,
    store: Arc<TrajectoryStore>,
) -> Result<EvalResult> {
    let args = EvalArgs {
        random_init: false,
        checkpoint: Some(job.checkpoint.clone()),
        model_preset: "tiny".into(),
        model_config: None,
        family: run.eval_family.clone(),
        pack,
        levels: (job.level, job.level),
        episodes: run.eval_episodes,
        k: 1,
        temperature: 0.0,
        top_p: 1.0,
        max_new_tokens: run.eval_max_new_tokens,
        seed: 1 << 62,
        concurrency: run.eval_concurrency,
        threads: 1,
        store: run_dir.join("eval").join("store"),
        label: Some(job.stage.clone()),
        json: true,
        out: None,
        stage: job.stage.clone(),
    };
    let r = evaluate_into(&args, store)
        .with_context(|| format!("evaluating the {} policy at level {}", job.stage, job.level))?;
    for f in &r.families {
        for l in &f.levels {
            eprintln!(
                "[eval] {:<8} {}/{}: success {} ({:.0} s)",
                job.stage,
                f.family,
                l.level,
                l.success_rate
                    .map(|s| format!("{:.1}%", 100.0 * s))
                    .unwrap_or_else(|| "n/a".into()),
                r.wall_s
            );
        }
    }
    Ok(r)
}

/// One job of the evaluation queue: a stage's policy on one level.
#[derive(Clone, Debug)]
struct EvalJob {
    stage: String,
    /// The policy's checkpoint folder (weights and `config.json`).
    checkpoint: PathBuf,
    level: u32,
}

/// The stage name of the random initial policy.
const RANDOM_STAGE: &str = "random";

/// The jobs for `stages` (name, checkpoint) on levels `first..=last`, longest first, so that
/// workers taking them in order finish close together: the random policy's episodes run to the
/// turn and context limits (several times an episode of a trained policy), and higher levels
/// are longer.
fn eval_jobs(stages: &[(String, PathBuf)], (first, last): (u32, u32)) -> Vec<EvalJob> {
    let mut jobs: Vec<EvalJob> = stages
        .iter()
        .flat_map(|(stage, checkpoint)| {
            (first..=last).map(move |level| EvalJob {
                stage: stage.clone(),
                checkpoint: checkpoint.clone(),
                level,
            })
        })
        .collect();
    jobs.sort_by_key(|j| (j.stage != RANDOM_STAGE, std::cmp::Reverse(j.level)));
    jobs
}

/// Saves a fresh initialisation of `model`, drawn with `seed` as the learner draws its own,
/// as a checkpoint in `dir`: the random baseline, so that every level evaluates the same
/// weights and its episodes can be replayed against them.
fn save_random_init(model: &ModelConfig, seed: u64, dir: &Path) -> Result<()> {
    let (vs, _) = build_model(model, tch::Device::Cpu, tch::Kind::Float, seed)
        .context("initialising the random baseline")?;
    checkpoint::save(&vs, model, dir)
        .with_context(|| format!("saving the random baseline to {}", dir.display()))
}

/// One stage's result from its per-level parts: levels in order; `wall_s` is the sum of the
/// parts' (the time this stage's evaluation took, whichever worker ran it) and the token
/// rate is over that sum.
fn merge_stage(mut parts: Vec<EvalResult>) -> Result<EvalResult> {
    parts.sort_by_key(|p| {
        p.families
            .first()
            .and_then(|f| f.levels.first())
            .map(|l| l.level)
    });
    let mut merged = parts
        .first()
        .cloned()
        .context("a stage with no evaluated level")?;
    let generated: f64 = parts
        .iter()
        .map(|p| p.generated_tokens_per_s * p.wall_s)
        .sum();
    merged.wall_s = parts.iter().map(|p| p.wall_s).sum();
    merged.generated_tokens_per_s = generated / merged.wall_s.max(1e-9);
    for fam in &mut merged.families {
        fam.levels = parts
            .iter()
            .flat_map(|p| p.families.iter().filter(|f| f.family == fam.family))
            .flat_map(|f| f.levels.iter().cloned())
            .collect();
    }
    Ok(merged)
}

/// Success at `level` of the evaluated family.
fn success_at(r: &EvalResult, level: u32) -> Option<f64> {
    r.families
        .first()?
        .levels
        .iter()
        .find(|l| l.level == level)?
        .success_rate
}

/// Runs the command.
pub fn run(args: RunArgs) -> Result<ExitCode> {
    let started_unix_ms = corvid_learner::store::now_unix_ms();
    let started = Instant::now();
    let stop = interrupts();
    let (table, mut run) = split_config(&args.config)?;
    if let Some(m) = args.rl_minutes {
        run.rl_minutes = m;
        run.run_minutes = 0.0;
    }
    if let Some(n) = args.eval_episodes {
        run.eval_episodes = n;
    }
    let name = match &args.name {
        Some(n) => n.clone(),
        None => table
            .get("run_name")
            .and_then(|v| v.as_str())
            .unwrap_or("demo")
            .to_string(),
    };
    run.validate()
        .with_context(|| format!("{}", args.config.display()))?;
    check_run_name(&name)?;
    let run_dir = PathBuf::from("runs").join(&name);
    if run_dir.join("run.json").exists() {
        bail!(
            "{} already holds a finished run; choose another --name or remove the folder",
            run_dir.display()
        );
    }
    // The ablation arm copies the SFT run into its own folder; an existing one is refused now,
    // not after SFT has run.
    let with_ablation = !args.no_ablation && !run.ablation.is_empty();
    let ablation_dir = PathBuf::from("runs").join(format!("{name}-ablation"));
    if with_ablation && ablation_dir.exists() {
        bail!(
            "{} exists; remove it or run with --no-ablation",
            ablation_dir.display()
        );
    }
    // A fresh run starts from `[model] init`; one that resumes a checkpoint ignores it.
    if let Some(init) = table
        .get("model")
        .and_then(|m| m.get("init"))
        .and_then(|v| v.as_str())
        .filter(|_| !has_checkpoint(&run_dir))
    {
        for file in [checkpoint::CONFIG_FILE, checkpoint::WEIGHTS_FILE] {
            if !Path::new(init).join(file).is_file() {
                bail!(
                    "{}: [model] init = {init:?} is not a policy folder (no {file} there; e.g. runs/demo/ref)",
                    args.config.display()
                );
            }
        }
    }
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let port = free_port()?;
    let (learner_cfg, cfg) = write_learner_config(table.clone(), &run_dir, port, &name)?;
    run.validate_family(&cfg.families()?)
        .with_context(|| format!("{}", args.config.display()))?;
    let ablation_table = if with_ablation {
        Some(read_ablation_config(
            &cfg,
            &args.config,
            Path::new(&run.ablation),
        )?)
    } else {
        None
    };
    let model = cfg.model.resolve()?;
    let model_json = run_dir.join("model.json");
    std::fs::write(&model_json, serde_json::to_string_pretty(&model)?)
        .with_context(|| format!("writing {}", model_json.display()))?;
    eprintln!("[run] {name}: run folder {}", run_dir.display());

    let mut stages = BTreeMap::new();
    let sft_s = if cfg.schedule.sft {
        sft_phase(&learner_cfg, &run_dir, &run, &stop)?
    } else {
        let from = match &cfg.model.init {
            Some(dir) => dir.display().to_string(),
            None => "a random initialisation".into(),
        };
        eprintln!("[run] [schedule] sft = false: RL starts from {from} (also its KL reference)");
        0.0
    };
    stages.insert("sft_s".to_string(), sft_s);

    // The ablation starts from an exact copy of the stopped SFT run.
    let mut ablation_cfg = None;
    if let Some(t) = ablation_table {
        let dir = ablation_dir;
        copy_dir(&run_dir, &dir)?;
        let aport = free_port()?;
        let (p, _) = write_learner_config(t, &dir, aport, &format!("{name}-ablation"))?;
        ablation_cfg = Some((p, aport, dir));
    }

    if run.run_minutes > 0.0 {
        let elapsed = started.elapsed().as_secs_f64() / 60.0;
        let arms = 1 + u32::from(ablation_cfg.is_some());
        let cap = run.rl_minutes;
        run.rl_minutes = rl_minutes_within(
            run.run_minutes,
            elapsed,
            run.eval_reserve_minutes,
            arms,
            cap,
        );
        eprintln!(
            "[run] {elapsed:.1} of run_minutes = {} used; RL gets {:.2} minutes per arm \
             ({arms} arm(s), {} kept for evaluation, at most rl_minutes = {cap})",
            run.run_minutes, run.rl_minutes, run.eval_reserve_minutes
        );
    }
    let packs = cfg.tasks.packs.clone();
    let main = rl_phase("rl", &learner_cfg, port, &run_dir, &run, &packs, &stop)?;
    stages.insert("rl_s".to_string(), main.seconds);
    let mut ablation_frontier = BTreeMap::new();
    if let Some((p, aport, dir)) = &ablation_cfg {
        if stop.load(Ordering::SeqCst) == 0 {
            let a = rl_phase("ablation", p, *aport, dir, &run, &packs, &stop)?;
            stages.insert("ablation_rl_s".to_string(), a.seconds);
            ablation_frontier = a.frontier;
        }
    }

    // Evaluation: random init, SFT reference, RL result (and the ablation's).
    let t_eval = Instant::now();
    // The evaluated family may be a pack of the run's.
    let eval_pack = packs.iter().find(|p| {
        corvid_tasks::load_pack(p).is_ok_and(|pk| {
            use corvid_tasks::TaskFamily;
            pk.name() == run.eval_family
        })
    });
    let (first, last) = eval_levels(
        &run.eval_levels,
        &run.eval_family,
        &[&main.frontier, &ablation_frontier],
    )?;
    let mut evals: BTreeMap<String, EvalResult> = BTreeMap::new();
    if stop.load(Ordering::SeqCst) < 2 {
        let random_dir = run_dir.join("eval").join("random-init");
        save_random_init(&model, cfg.seed, &random_dir)?;
        // (stage, checkpoint)
        let mut stages: Vec<(String, PathBuf)> = vec![
            (RANDOM_STAGE.into(), random_dir),
            ("sft".into(), run_dir.join("ref")),
        ];
        if let Some(ck) = latest_checkpoint(&run_dir) {
            stages.push(("rl".into(), ck));
        }
        if let Some((_, _, dir)) = &ablation_cfg {
            if let Some(ck) = latest_checkpoint(dir) {
                stages.push(("ablation-grpo".into(), ck));
            }
        }
        for (stage, _) in &stages {
            eprintln!(
                "[eval] {stage}: {} held-out episodes per level of {} {first}..{last}",
                run.eval_episodes, run.eval_family
            );
        }
        // An earlier, unfinished `corvid run` here may have evaluated into the store; this run
        // evaluates every stage again (RL may have moved on), and eval refuses a stage label
        // whose stored episodes came from other weights. The old episodes are kept aside.
        let store_dir = run_dir.join("eval").join("store");
        if store_dir.exists() {
            let old = run_dir
                .join("eval")
                .join(format!("store.before-{}", started_unix_ms / 1000));
            std::fs::rename(&store_dir, &old).with_context(|| {
                format!(
                    "moving the earlier evaluation's store {} aside",
                    store_dir.display()
                )
            })?;
            eprintln!(
                "[eval] {} held an earlier evaluation's episodes; moved to {}",
                store_dir.display(),
                old.display()
            );
        }
        let store = open_store(&store_dir)?;
        let queue = Mutex::new(eval_jobs(&stages, (first, last)).into_iter());
        let results = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..run.eval_workers.max(1) {
                scope.spawn(|| loop {
                    let Some(job) = queue.lock().expect("eval queue").next() else {
                        break;
                    };
                    let r = eval_job(&job, &run_dir, &run, eval_pack.cloned(), store.clone());
                    results.lock().expect("eval results").push((job.stage, r));
                });
            }
        });
        let mut parts: BTreeMap<String, Vec<EvalResult>> = BTreeMap::new();
        for (stage, r) in results.into_inner().expect("eval results") {
            parts.entry(stage).or_default().push(r?);
        }
        for (stage, p) in parts {
            let r = merge_stage(p)?;
            let out = run_dir.join("eval").join(format!("{stage}.json"));
            std::fs::write(&out, serde_json::to_string_pretty(&r)?)
                .with_context(|| format!("writing {}", out.display()))?;
            evals.insert(stage, r);
        }
        store.flush_sync().context("flushing the eval store")?;
    }
    stages.insert("eval_s".to_string(), t_eval.elapsed().as_secs_f64());

    // The frontier for the headline numbers: the main run's, for the evaluated family.
    let family = cfg.families()?.get(&run.eval_family)?;
    let frontier = main.frontier.get(&run.eval_family).copied();
    let mut level_tokens = BTreeMap::new();
    let mut per_level = BTreeMap::new();
    for level in 1..=family.levels() {
        let t = family.instance(level, 0)?.oracle_tokens();
        per_level.insert(level.to_string(), t);
    }
    level_tokens.insert(run.eval_family.clone(), per_level);
    let mut ablation_figures = BTreeMap::new();
    if let Some(level) = frontier {
        ablation_figures.insert(
            "step_level".to_string(),
            evals.get("rl").and_then(|r| success_at(r, level)),
        );
        ablation_figures.insert(
            "trajectory_grpo".to_string(),
            evals
                .get("ablation-grpo")
                .and_then(|r| success_at(r, level)),
        );
    }
    let record = RunRecord {
        name: name.clone(),
        main_family: run.eval_family.clone(),
        config: args.config.display().to_string(),
        started_unix_ms,
        finished_unix_ms: corvid_learner::store::now_unix_ms(),
        stages,
        interrupted: stop.load(Ordering::SeqCst) > 0,
        frontier_level: main.frontier.clone(),
        level_tokens,
        ablation: ablation_figures,
        ablation_frontier_level: ablation_frontier,
        sft_heldout_loss_target: cfg.sft.heldout_loss_target,
    };
    let path = run_dir.join("run.json");
    std::fs::write(&path, serde_json::to_string_pretty(&record)?)
        .with_context(|| format!("writing {}", path.display()))?;
    let summary = crate::report::write(&run_dir).context("writing the report")?;
    eprintln!("[run] report: {}", summary.html.display());
    println!("{}", summary.html.display());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod run_section_tests {
    use super::*;

    #[test]
    fn a_bad_learner_key_is_reported_at_its_line_in_the_file_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        // The [run] table first: the learner copy written into the run folder drops it, so
        // errors from that copy gave other line numbers.
        std::fs::write(&path, "[run]\nactors = 2\n\n[rl]\nlr = 1.0\n").unwrap();
        let e = format!("{:#}", split_config(&path).unwrap_err());
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert!(
            e.contains("line 5") && e.contains("unknown field `lr`"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_run_table_is_refused_naming_the_field() {
        assert!(RunSection::default().validate().is_ok());
        let refused = |edit: fn(&mut RunSection), field: &str| {
            let mut run = RunSection::default();
            edit(&mut run);
            let err = format!("{:#}", run.validate().expect_err(field));
            assert!(err.contains(&format!("[run] {field}")), "{field}: {err}");
        };
        refused(|r| r.rl_minutes = -1.0, "rl_minutes");
        refused(|r| r.rl_minutes = f64::NAN, "rl_minutes");
        refused(|r| r.rl_minutes = 1e300, "rl_minutes");
        refused(|r| r.sft_timeout_minutes = 0.0, "sft_timeout_minutes");
        refused(|r| r.actors = 0, "actors");
        refused(|r| r.actor_concurrency = 0, "actor_concurrency");
        refused(|r| r.eval_episodes = 0, "eval_episodes");
        refused(|r| r.eval_workers = 0, "eval_workers");
        refused(|r| r.eval_levels = "1-3".into(), "eval_levels");

        let families = corvid_tasks::Families::new(&[]).expect("built-in families");
        assert!(RunSection::default().validate_family(&families).is_ok());
        let family = |name: &str, levels: &str| {
            let run = RunSection {
                eval_family: name.into(),
                eval_levels: levels.into(),
                ..RunSection::default()
            };
            run.validate_family(&families).map_err(|e| format!("{e:#}"))
        };
        let err = family("hopz", "1..3").expect_err("unknown family");
        assert!(err.contains("[run] eval_family = \"hopz\""), "{err}");
        let err = family("shell", "1..9").expect_err("past the family's levels");
        assert!(err.contains("[run] eval_levels"), "{err}");
    }

    #[test]
    fn rl_arms_share_what_run_minutes_leaves_after_sft_and_the_evaluation_reserve() {
        // 19 minutes, SFT took 7.5, 2.5 kept for evaluation: 9 left, 4.5 per arm of two.
        assert_eq!(rl_minutes_within(19.0, 7.5, 2.5, 2, 6.0), 4.5);
        // One arm (no ablation) gets it all, up to the cap.
        assert_eq!(rl_minutes_within(19.0, 7.5, 2.5, 1, 6.0), 6.0);
        assert_eq!(rl_minutes_within(19.0, 12.5, 2.5, 1, 6.0), 4.0);
        // A slow SFT leaves RL the floor, not nothing.
        assert_eq!(rl_minutes_within(19.0, 18.0, 2.5, 2, 6.0), MIN_RL_MINUTES);
        assert_eq!(rl_minutes_within(19.0, 18.0, 2.5, 2, 0.25), 0.25);
        let bad = RunSection {
            run_minutes: -1.0,
            ..RunSection::default()
        };
        assert!(format!("{:#}", bad.validate().unwrap_err()).contains("[run] run_minutes"));
    }

    #[test]
    fn run_names_that_are_not_one_folder_under_runs_are_refused() {
        for ok in ["demo", "a1", "x-y_z.2"] {
            assert!(check_run_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "a b", "../escaped", "a/b"] {
            let err = format!("{:#}", check_run_name(bad).expect_err(bad));
            assert!(err.contains("--name"), "{bad}: {err}");
        }
    }
}

#[cfg(test)]
mod eval_levels_tests {
    use super::*;

    #[test]
    fn evaluation_extends_to_the_highest_frontier_reached() {
        let f = |l: u32| BTreeMap::from([("hops".to_string(), l)]);
        let none = BTreeMap::new();
        assert_eq!(
            eval_levels("1..3", "hops", &[&f(2), &none]).unwrap(),
            (1, 3)
        );
        assert_eq!(
            eval_levels("1..3", "hops", &[&f(3), &f(5)]).unwrap(),
            (1, 5)
        );
        assert_eq!(eval_levels("2..3", "hops", &[&f(4)]).unwrap(), (2, 4));
        assert_eq!(eval_levels("1..3", "search", &[&f(6)]).unwrap(), (1, 3));
        let err = eval_levels("3..1", "hops", &[]).unwrap_err().to_string();
        assert!(err.contains("eval_levels"), "{err}");
    }

    #[test]
    fn the_rl_learner_resumes_only_a_run_with_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("learner.toml");
        let args = rl_learner_args(&cfg, dir.path());
        assert!(!args.contains(&"--resume".to_string()), "{args:?}");
        std::fs::create_dir_all(dir.path().join("ckpt").join("00000003")).unwrap();
        let args = rl_learner_args(&cfg, dir.path());
        assert_eq!(
            args.last().map(String::as_str),
            Some("--resume"),
            "{args:?}"
        );
    }

    #[test]
    fn evaluation_jobs_run_the_random_policy_and_the_long_levels_first() {
        let stages = vec![
            ("sft".to_string(), PathBuf::from("ref")),
            ("rl".to_string(), PathBuf::from("ckpt")),
            ("random".to_string(), PathBuf::from("eval/random-init")),
        ];
        let order: Vec<(String, u32)> = eval_jobs(&stages, (1, 3))
            .into_iter()
            .map(|j| (j.stage, j.level))
            .collect();
        let want = [
            ("random", 3),
            ("random", 2),
            ("random", 1),
            ("sft", 3),
            ("rl", 3),
            ("sft", 2),
            ("rl", 2),
            ("sft", 1),
            ("rl", 1),
        ];
        assert_eq!(
            order,
            want.map(|(s, l)| (s.to_string(), l)).to_vec(),
            "every (stage, level) once, longest first"
        );
    }

    #[test]
    fn a_stage_evaluated_level_by_level_is_reported_as_one_result() {
        use crate::cmd::eval::{FamilyResult, LevelResult};
        let part = |level: u32, wall_s: f64, tok_s: f64| EvalResult {
            stage: "sft".into(),
            checkpoint: "runs/x/ref".into(),
            policy_version: 0,
            episodes_per_level: 200,
            k: 1,
            temperature: 0.0,
            seed: 1 << 62,
            store: "runs/x/eval/store".into(),
            label: "sft".into(),
            families: vec![FamilyResult {
                family: "hops".into(),
                levels: vec![LevelResult {
                    level,
                    episodes: 200,
                    success_rate: Some(level as f64 / 10.0),
                    tool_call_parse_rate: None,
                    tool_call_success_rate: None,
                    multi_step_completion: None,
                    failure_recovery_rate: None,
                    pass_at_k: None,
                    pass_hat_k: None,
                    mean_turns: 2.0,
                    mean_tokens: 100.0 * level as f64,
                    excluded: 0,
                    terminations: BTreeMap::new(),
                }],
            }],
            wall_s,
            generated_tokens_per_s: tok_s,
        };
        // Finished out of order, as two workers return them.
        let m = merge_stage(vec![
            part(3, 30.0, 1000.0),
            part(1, 10.0, 2000.0),
            part(2, 20.0, 1500.0),
        ])
        .unwrap();
        let levels: Vec<(u32, Option<f64>)> = m.families[0]
            .levels
            .iter()
            .map(|l| (l.level, l.success_rate))
            .collect();
        assert_eq!(levels, vec![(1, Some(0.1)), (2, Some(0.2)), (3, Some(0.3))]);
        assert_eq!(m.families.len(), 1);
        assert!((m.wall_s - 60.0).abs() < 1e-9);
        // (30·1000 + 10·2000 + 20·1500) tokens over 60 s.
        assert!((m.generated_tokens_per_s - 80_000.0 / 60.0).abs() < 1e-9);
        assert!(merge_stage(Vec::new()).is_err());
    }

    #[test]
    fn an_ablation_with_other_task_levels_is_refused_before_anything_runs() {
        let dir = tempfile::tempdir().unwrap();
        let config =
            |max: u32| format!("[tasks]\nfamilies = [\"hops\"]\nmax_levels = {{ hops = {max} }}\n");
        let main = LearnerConfig::from_toml(&config(3)).unwrap();
        let (same, other) = (dir.path().join("same.toml"), dir.path().join("other.toml"));
        std::fs::write(&same, config(3)).unwrap();
        std::fs::write(&other, config(5)).unwrap();
        let main_path = Path::new("demo.toml");
        read_ablation_config(&main, main_path, &same).unwrap();
        let err = read_ablation_config(&main, main_path, &other)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("other.toml") && err.contains("must share [tasks]"),
            "{err}"
        );
    }

    #[test]
    fn a_learner_that_fails_during_rl_stops_the_run_and_a_clean_exit_does_not() {
        let exit = |code: i32| {
            Command::new("sh")
                .args(["-c", &format!("exit {code}")])
                .status()
                .unwrap()
        };
        let log = Path::new("runs/x/learner-rl.log");
        let after = Duration::from_secs(42);
        learner_ended_early("rl", exit(0), after, log).unwrap();
        let err = learner_ended_early("ablation", exit(3), after, log)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ablation learner exited with exit status: 3 after 42 s")
                && err.contains("runs/x/learner-rl.log"),
            "{err}"
        );
    }
}
