//! Phases 1 to 3 of `corvid run`: SFT, the ablation copy and the RL arms. Each runs `corvid
//! learner` (and for RL, K `corvid actor`s) as child processes, prints one progress line per
//! metrics record the learner writes, and stops the children in order: actors first, so no
//! episode is lost, then the learner, which checkpoints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use corvid_learner::metrics::UpdateRecord;
use corvid_learner::trainer::SftRecord;

use super::children::{free_port, ChildProcess, MetricsTail};
use super::config::{has_checkpoint, write_learner_config, Arm, RunPlan, RunSection};

/// Phase 1: SFT when the config's `[schedule] sft` asks for it. Returns its seconds (0 when
/// skipped).
pub(super) fn sft(plan: &RunPlan, stop: &AtomicU32) -> Result<f64> {
    if plan.cfg.schedule.sft {
        return sft_phase(&plan.main, &plan.run, stop);
    }
    let from = match &plan.cfg.model.init {
        Some(dir) => dir.display().to_string(),
        None => "a random initialisation".into(),
    };
    eprintln!("[run] [schedule] sft = false: RL starts from {from} (also its KL reference)");
    Ok(0.0)
}

/// Whether SFT has finished in `run_dir`: the reference policy and a checkpoint exist.
fn sft_done(run_dir: &Path) -> bool {
    run_dir.join("ref").join("config.json").exists() && has_checkpoint(run_dir)
}

/// SFT with no actors, stopped once the reference and its checkpoint exist.
fn sft_phase(arm: &Arm, run: &RunSection, stop: &AtomicU32) -> Result<f64> {
    let t = Instant::now();
    let run_dir = &arm.dir;
    if sft_done(run_dir) {
        eprintln!("[run] SFT already done in {}; skipping", run_dir.display());
        return Ok(0.0);
    }
    eprintln!(
        "[sft] training on oracle demonstrations (log: {}/learner.log)",
        run_dir.display()
    );
    let mut learner = ChildProcess::spawn(
        "learner (sft)",
        &[
            "learner".into(),
            "--config".into(),
            arm.learner_cfg.display().to_string(),
        ],
        &run_dir.join("learner.log"),
        false,
    )?;
    let mut tail = MetricsTail::<SftRecord>::new(
        run_dir
            .join("metrics")
            .join(corvid_learner::trainer::SFT_METRICS_FILE),
    );
    let deadline = Duration::from_secs_f64(run.sft_timeout_minutes * 60.0);
    // (unix_ms, tokens_seen) of the previous line, for the trained tokens per second.
    let mut last: Option<(f64, f64)> = None;
    loop {
        for r in tail.records() {
            eprintln!("{}", sft_progress_line(&r, &mut last, t));
        }
        if sft_done(run_dir) {
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

/// One SFT progress line; `last` is the previous line's (unix_ms, tokens_seen), replaced by
/// this one's, for the trained-token rate between the two.
pub(super) fn sft_progress_line(
    r: &SftRecord,
    last: &mut Option<(f64, f64)>,
    sft_start: Instant,
) -> String {
    let (now_ms, seen) = (r.unix_ms as f64, r.tokens_seen as f64);
    let rate = match *last {
        Some((ms, tok)) if now_ms > ms => {
            format!("{:>6.0}", (seen - tok) / ((now_ms - ms) / 1e3))
        }
        _ => "     -".into(),
    };
    *last = Some((now_ms, seen));
    format!(
        "[sft {:>5.0}s] step {:>5} loss {:.4}{} lr {:.2e} {rate} trained tok/s",
        sft_start.elapsed().as_secs_f64(),
        r.step,
        r.loss,
        r.heldout_loss
            .map(|h| format!(" held-out {h:.4}"))
            .unwrap_or_default(),
        r.lr,
    )
}

/// Phase 2: copies the stopped SFT run into each ablation arm's folder, so every RL arm
/// starts from the same SFT weights, and writes the arm's learner config there. Returns the
/// arms, in name order.
pub(super) fn copy_for_ablation(plan: &RunPlan) -> Result<Vec<Arm>> {
    let mut arms = Vec::with_capacity(plan.ablation.len());
    for planned in &plan.ablation {
        copy_dir(plan.run_dir(), &planned.dir)?;
        let port = free_port()?;
        let label = format!("ablation-{}", planned.name);
        let (learner_cfg, _) = write_learner_config(
            planned.table.clone(),
            &planned.dir,
            port,
            &format!("{}-{label}", plan.name),
        )?;
        arms.push(Arm {
            label,
            learner_cfg,
            port,
            dir: planned.dir.clone(),
            tokenizer: plan.main.tokenizer.clone(),
            context: planned.context.clone(),
        });
    }
    Ok(arms)
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

/// What one RL arm left behind.
pub(super) struct RlOutcome {
    pub seconds: f64,
    /// The curriculum frontier (family → level) of its last metrics record.
    pub frontier: BTreeMap<String, u32>,
}

/// What phase 3 left behind: the main arm's outcome, and each ablation arm's that ran, by
/// label.
pub(super) struct RlOutcomes {
    pub main: RlOutcome,
    pub ablation: Vec<(String, RlOutcome)>,
}

/// Phase 3: the main RL arm, then each ablation arm (until interrupted), for the RL budget
/// each.
pub(super) fn rl(plan: &RunPlan, ablation: &[Arm], stop: &AtomicU32) -> Result<RlOutcomes> {
    let packs = &plan.cfg.tasks.packs;
    let main = rl_phase(&plan.main, &plan.run, packs, stop)?;
    let mut outcomes = Vec::with_capacity(ablation.len());
    for arm in ablation {
        if stop.load(Ordering::SeqCst) != 0 {
            break;
        }
        outcomes.push((arm.label.clone(), rl_phase(arm, &plan.run, packs, stop)?));
    }
    Ok(RlOutcomes {
        main,
        ablation: outcomes,
    })
}

/// One RL arm: the learner resumes after SFT, K actors roll out, for the RL budget.
fn rl_phase(arm: &Arm, run: &RunSection, packs: &[PathBuf], stop: &AtomicU32) -> Result<RlOutcome> {
    let t = Instant::now();
    let (label, run_dir) = (arm.label.as_str(), &arm.dir);
    eprintln!(
        "[{label}] learner + {} actors x {} episodes, {} minutes (logs in {})",
        run.actors,
        run.actor_concurrency,
        run.rl_minutes,
        run_dir.display()
    );
    let learner_log = run_dir.join(format!("learner-{label}.log"));
    let mut learner = ChildProcess::spawn(
        &format!("learner ({label})"),
        &rl_learner_args(&arm.learner_cfg, run_dir),
        &learner_log,
        true,
    )?;
    let token = wait_for_token(arm, &mut learner, &learner_log)?;
    let mut actors = spawn_actors(arm, run, packs, &token)?;
    let budget = Duration::from_secs_f64(run.rl_minutes * 60.0);
    let mut tail = MetricsTail::<UpdateRecord>::new(run_dir.join("metrics").join("metrics.jsonl"));
    let mut frontier = BTreeMap::new();
    let mut follow = |tail: &mut MetricsTail<UpdateRecord>| {
        for r in tail.records() {
            eprintln!("{}", progress_line(label, &r, t));
            frontier = r.curriculum.frontier;
        }
    };
    let mut learner_exited = false;
    while t.elapsed() < budget && stop.load(Ordering::SeqCst) == 0 {
        follow(&mut tail);
        if let Some(status) = learner.exit_status() {
            learner_ended_early(label, status, t.elapsed(), &learner_log)?;
            learner_exited = true;
            break;
        }
        for a in actors.iter_mut() {
            if !a.alive() {
                eprintln!("[{label}] {} exited; see its log", a.name());
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
    follow(&mut tail);
    Ok(RlOutcome {
        seconds: t.elapsed().as_secs_f64(),
        frontier,
    })
}

/// Waits for the token file the learner writes as it starts (a run without SFT meets its
/// learner for the first time in RL); the actors need it.
fn wait_for_token(arm: &Arm, learner: &mut ChildProcess, learner_log: &Path) -> Result<PathBuf> {
    let token = arm.dir.join("token");
    let label = &arm.label;
    let waiting = Instant::now();
    while !token.exists() {
        if let Some(status) = learner.exit_status() {
            bail!(
                "the {label} learner exited ({status}) before writing its token file; see {}",
                learner_log.display()
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
    Ok(token)
}

/// Starts the arm's `run.actors` actors against its learner, each with its own spool and log.
fn spawn_actors(
    arm: &Arm,
    run: &RunSection,
    packs: &[PathBuf],
    token: &Path,
) -> Result<Vec<ChildProcess>> {
    let (label, run_dir) = (arm.label.as_str(), &arm.dir);
    let url = format!("http://127.0.0.1:{}", arm.port);
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
        if let Some(dir) = &arm.tokenizer {
            args.extend(["--tokenizer".into(), dir.display().to_string()]);
        }
        if !run.actor_dtype.is_empty() {
            args.extend(["--dtype".into(), run.actor_dtype.clone()]);
        }
        args.rotate_left(2 * packs.len());
        actors.push(ChildProcess::spawn(
            &format!("actor {i}"),
            &args,
            &run_dir.join(format!("actor-{label}-{i}.log")),
            true,
        )?);
    }
    Ok(actors)
}

/// A learner that exits before the RL budget is spent: a clean exit (`[schedule] max_updates`
/// reached) ends the phase early and says so; a failure stops the run, naming the learner's
/// log, rather than evaluating a policy that did not get its budget as if it had.
pub(super) fn learner_ended_early(
    label: &str,
    status: ExitStatus,
    after: Duration,
    log: &Path,
) -> Result<()> {
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

/// The RL learner's arguments: after SFT it resumes from the run's checkpoint; a run without
/// SFT (`[schedule] sft = false`) starts fresh.
pub(super) fn rl_learner_args(learner_cfg: &Path, run_dir: &Path) -> Vec<String> {
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

/// One RL progress line: the update, the rollout figures, the frontier and the loss terms.
pub(super) fn progress_line(label: &str, r: &UpdateRecord, rl_start: Instant) -> String {
    let frontier = r
        .curriculum
        .frontier
        .iter()
        .map(|(k, l)| format!("{k} L{l}"))
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "[{label} {:>5.0}s] update {:>4} v{:<4} reward {:>6.3} success {:>5.1}% | frontier {} | {:>6.0} tok/s {:>5.2} ep/s | staleness {:.2} | loss {:+.4} kl {:.4} ent {:.3}",
        rl_start.elapsed().as_secs_f64(),
        r.step,
        r.policy_version,
        r.rollout.reward_mean,
        100.0 * r.rollout.success_rate,
        frontier,
        r.rollout.tokens_per_s,
        r.rollout.episodes_per_s,
        r.rollout.staleness_mean,
        r.loss.policy,
        r.loss.kl,
        r.loss.entropy,
    )
}
