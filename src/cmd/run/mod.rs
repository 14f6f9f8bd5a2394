//! `corvid run`: the one-command local job. A learner and K actor *processes* on loopback,
//! SFT then RL, evaluation on held-out seeds, and a report.
//!
//! The phases, each a real child process of this binary:
//!
//! 1. **SFT**: `corvid learner` on the run folder with no actors; once the SFT reference
//!    (`ref/`) and its checkpoint exist, it is stopped with SIGTERM (it checkpoints and exits).
//! 2. **Ablation copies**: for each ablation arm the config names, the stopped run folder is
//!    copied to `runs/<name>-ablation-<arm>/`, so every RL arm starts from the same SFT weights.
//! 3. **RL**: `corvid learner --resume` and K `corvid actor`s, for `rl_minutes` of wall time
//!    (or until the learner reaches `schedule.max_updates`); one progress line per update.
//!    With `run_minutes` set, each arm instead gets what is left of that budget after SFT,
//!    less `eval_reserve_minutes`, shared between the arms and capped at `rl_minutes`
//!    ([`config::rl_minutes_within`]): a slower machine's longer SFT leaves RL less, a faster one's more.
//!    Then the actors get SIGTERM (they finish or abandon their episodes, nothing is lost),
//!    then the learner (it checkpoints). Each ablation arm runs the same way on its copy.
//! 4. **Evaluation** in this process on held-out seeds: the random initial policy, the SFT
//!    reference, the RL result (and each ablation arm's, in its own window and fold),
//!    `eval/<stage>.json`, episodes stored
//!    in `eval/store`. The random policy is one initialisation drawn with the config's
//!    `seed` and saved to `eval/random-init/`, so every level evaluates the same weights.
//!    `eval_workers` threads take one job per stage and level from a queue (the random
//!    policy's and the longest levels first), each decoding on one core.
//! 5. **Report**: `run.json`, then `report.json`, `report.html` and the plots.
//!
//! Children run in their own process groups, so Ctrl-C reaches only this process, which then
//! stops the children in order (actors, then learner) and goes on to evaluate and report
//! what exists. A second Ctrl-C skips evaluation.
//!
//! | file | holds |
//! |---|---|
//! | `config.rs` | the `[run]` table, the learner configs written into the run folders, `RunPlan`: everything checked before phase 1 |
//! | `children.rs` | interrupts, `ChildProcess`, `MetricsTail` (a learner's metrics file as typed records) |
//! | `phases.rs` | phases 1–3 |
//! | `evaluate.rs` | phase 4 and the headline figures of `run.json` |

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;

mod children;
mod config;
mod evaluate;
mod phases;
#[cfg(test)]
mod tests;

/// Train an agent end to end: a learner and K actor processes, SFT then RL, evaluation and
/// a report.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid run --config configs/demo.toml
  corvid run --config configs/demo.toml --name demo2 --rl-minutes 5
  corvid report --run-dir runs/demo          rebuild the report of a finished or interrupted run

The config is a learner config (see configs/demo.toml) plus a [run] table:
  actors, actor_concurrency, rl_minutes, run_minutes, eval_reserve_minutes, goal_minutes,
  sft_timeout_minutes,
  eval_family, eval_levels, eval_episodes, eval_concurrency, eval_max_new_tokens, eval_workers, eval_random,
  ablation (another learner config, e.g. configs/demo-grpo.toml, trained on a copy of the SFT
  result for the same budget; or a table of named arms, as configs/long.toml).
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
    /// Success at the main arm's frontier of every evaluated stage (`sft`, `rl`,
    /// `ablation-<arm>`), each in its own window and fold.
    arms: BTreeMap<String, Option<f64>>,
    /// Each ablation arm's final frontier (label → family → level).
    arm_frontier_level: BTreeMap<String, BTreeMap<String, u32>>,
    /// Goal targets the report checks instead of its defaults.
    goals: Goals,
    /// `[sft] heldout_loss_target`, so the report can say whether SFT reached it.
    sft_heldout_loss_target: Option<f64>,
}

/// `run.json`'s `goals`: the whole run's minutes, when `[run] goal_minutes` sets them.
#[derive(Debug, Clone, Serialize)]
struct Goals {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_minutes: Option<f64>,
}

impl RunRecord {
    fn write(&self, run_dir: &Path) -> Result<()> {
        let path = run_dir.join("run.json");
        std::fs::write(&path, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("writing {}", path.display()))
    }
}

/// Runs the command.
pub fn run(args: RunArgs) -> Result<ExitCode> {
    let started_unix_ms = corvid_store::now_unix_ms();
    let started = Instant::now();
    let stop = children::interrupts();
    let mut plan = config::RunPlan::prepare(&args)?;
    // Seconds per phase, for run.json.
    let mut stages = BTreeMap::new();

    // 1. SFT
    let sft_s = phases::sft(&plan, &stop)?;
    stages.insert("sft_s".to_string(), sft_s);

    // 2. Ablation copies
    let ablation = phases::copy_for_ablation(&plan)?;

    // 3. RL, the main arm then the ablation arms
    let arms = 1 + ablation.len() as u32;
    plan.run
        .fit_rl_budget(started.elapsed().as_secs_f64() / 60.0, arms);
    let rl = phases::rl(&plan, &ablation, &stop)?;
    stages.insert("rl_s".to_string(), rl.main.seconds);
    for (label, a) in &rl.ablation {
        stages.insert(format!("{label}_rl_s"), a.seconds);
    }
    let arm_frontiers: BTreeMap<String, BTreeMap<String, u32>> = rl
        .ablation
        .iter()
        .map(|(label, a)| (label.clone(), a.frontier.clone()))
        .collect();

    // 4. Evaluation, skipped after a second interrupt
    let t_eval = Instant::now();
    let family = &plan.run.eval_family;
    let mut frontiers = vec![&rl.main.frontier];
    frontiers.extend(arm_frontiers.values());
    let levels = evaluate::eval_levels(&plan.run.eval_levels, family, &frontiers)?;
    // Only the arms that trained: an arm an interrupt skipped holds just the SFT checkpoint.
    let trained: Vec<config::Arm> = ablation
        .into_iter()
        .filter(|a| arm_frontiers.contains_key(&a.label))
        .collect();
    let evals = if stop.load(Ordering::SeqCst) < 2 {
        evaluate::evaluate(&plan, &trained, levels, started_unix_ms)?
    } else {
        BTreeMap::new()
    };
    stages.insert("eval_s".to_string(), t_eval.elapsed().as_secs_f64());

    // 5. Report; its headline numbers are at the main run's frontier of the evaluated family
    let level_tokens = evaluate::level_tokens(&plan, family)?;
    let frontier = rl.main.frontier.get(family).copied();
    let arms = evaluate::arm_figures(&evals, frontier);
    let record = RunRecord {
        name: plan.name.clone(),
        main_family: family.clone(),
        config: args.config.display().to_string(),
        started_unix_ms,
        finished_unix_ms: corvid_store::now_unix_ms(),
        stages,
        interrupted: stop.load(Ordering::SeqCst) > 0,
        level_tokens,
        ablation: evaluate::ablation_figures(&arms),
        frontier_level: rl.main.frontier,
        ablation_frontier_level: arm_frontiers
            .get(&format!("ablation-{}", config::GRPO_ARM))
            .cloned()
            .unwrap_or_default(),
        arms,
        arm_frontier_level: arm_frontiers,
        goals: Goals {
            max_minutes: (plan.run.goal_minutes > 0.0).then_some(plan.run.goal_minutes),
        },
        sft_heldout_loss_target: plan.cfg.sft.heldout_loss_target,
    };
    record.write(plan.run_dir())?;
    let summary = crate::report::write(plan.run_dir()).context("writing the report")?;
    eprintln!("[run] report: {}", summary.html.display());
    println!("{}", summary.html.display());
    Ok(ExitCode::SUCCESS)
}
