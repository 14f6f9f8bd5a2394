//! Phase 4 of `corvid run`: every stage's policy (the random initialisation, the SFT
//! reference, the RL result and each ablation arm's) on held-out seeds, in this process, and the
//! headline figures `run.json` takes from the results.
//!
//! The work is one job per stage and level, taken from a queue by `eval_workers` threads,
//! each decoding on one core; the random policy's and the longest levels go first so the
//! workers finish close together. A stage's jobs are merged back into one result,
//! `eval/<stage>.json`; all episodes are stored in `eval/store`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use corvid_learner::config::ContextSection;
use corvid_learner::trainer::build_model;
use corvid_model::{checkpoint, ModelConfig};
use corvid_store::TrajectoryStore;

use super::config::{latest_checkpoint, Arm, RunPlan, RunSection};
use crate::cmd::eval::{evaluate_into, open_store, EvalArgs, EvalResult};
use corvid_eval::FamilyResult;

/// The stage name of the random initial policy.
pub(super) const RANDOM_STAGE: &str = "random";

/// The levels to evaluate: `[run] eval_levels`, extended up to the highest final frontier level
/// of `family` among the arms, so the headline figures at the frontier are always measured.
pub(super) fn eval_levels(
    configured: &str,
    family: &str,
    frontiers: &[&BTreeMap<String, u32>],
) -> Result<(u32, u32)> {
    let (first, last) = crate::cmd::eval::parse_levels(configured)
        .map_err(|e| anyhow::anyhow!("[run] eval_levels: {e}"))?;
    let reached = frontiers
        .iter()
        .filter_map(|f| f.get(family).copied())
        .max()
        .unwrap_or(0);
    Ok((first, last.max(reached)))
}

/// Evaluates every stage that exists on levels `first..=last`, writes `eval/<stage>.json`
/// for each, and returns the results by stage. `started_unix_ms` names the folder an
/// earlier evaluation's store is moved to.
pub(super) fn evaluate(
    plan: &RunPlan,
    ablation: &[Arm],
    (first, last): (u32, u32),
    started_unix_ms: u64,
) -> Result<BTreeMap<String, EvalResult>> {
    let (run_dir, run) = (plan.run_dir(), &plan.run);
    // The evaluated family may be a pack of the run's.
    let eval_pack = plan.cfg.tasks.packs.iter().find(|p| {
        corvid_tasks::load_pack(p).is_ok_and(|pk| {
            use corvid_tasks::TaskFamily;
            pk.name() == run.eval_family
        })
    });
    let stages = stages(plan, ablation)?;
    for (stage, _, _) in &stages {
        eprintln!(
            "[eval] {stage}: {} held-out episodes per level of {} {first}..{last}",
            run.eval_episodes, run.eval_family
        );
    }
    let store_dir = run_dir.join("eval").join("store");
    move_earlier_store_aside(&store_dir, started_unix_ms)?;
    let store = open_store(&store_dir)?;
    let plain: Vec<(String, PathBuf)> = stages
        .iter()
        .map(|(stage, ck, _)| (stage.clone(), ck.clone()))
        .collect();
    let contexts: BTreeMap<&str, &ContextSection> = stages
        .iter()
        .map(|(stage, _, context)| (stage.as_str(), *context))
        .collect();
    let queue = Mutex::new(eval_jobs(&plain, (first, last)).into_iter());
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..run.eval_workers.max(1) {
            scope.spawn(|| loop {
                let Some(job) = queue.lock().expect("eval queue").next() else {
                    break;
                };
                let r = eval_job(
                    &job,
                    (run_dir, run),
                    eval_pack.cloned(),
                    plan.cfg.model.tool_call_format.clone(),
                    contexts[job.stage.as_str()],
                    store.clone(),
                );
                results.lock().expect("eval results").push((job.stage, r));
            });
        }
    });
    let mut parts: BTreeMap<String, Vec<EvalResult>> = BTreeMap::new();
    for (stage, r) in results.into_inner().expect("eval results") {
        parts.entry(stage).or_default().push(r?);
    }
    let mut evals = BTreeMap::new();
    for (stage, p) in parts {
        let r = merge_stage(p)?;
        let out = run_dir.join("eval").join(format!("{stage}.json"));
        std::fs::write(&out, serde_json::to_string_pretty(&r)?)
            .with_context(|| format!("writing {}", out.display()))?;
        evals.insert(stage, r);
    }
    store.flush_sync().context("flushing the eval store")?;
    Ok(evals)
}

/// The stages to evaluate, (name, checkpoint, window and fold): the random initialisation
/// (saved now to `eval/random-init/`, unless `[run] eval_random` is false), the SFT reference, and each arm's newest checkpoint if
/// it has one. An ablation arm is evaluated in its own `[rollout.context]`, the others in the
/// main config's.
fn stages<'a>(
    plan: &'a RunPlan,
    ablation: &'a [Arm],
) -> Result<Vec<(String, PathBuf, &'a ContextSection)>> {
    let run_dir = plan.run_dir();
    let random_dir = run_dir.join("eval").join("random-init");
    match &plan.cfg.model.hf {
        _ if !plan.run.eval_random => {}
        // A run from a Hugging Face model starts from its weights: they are the baseline.
        Some(hf) => save_starting_weights(hf, &random_dir)?,
        None => save_random_init(&plan.model, plan.cfg.seed, &random_dir)?,
    }
    let main = &plan.main.context;
    let mut stages = Vec::new();
    if plan.run.eval_random {
        stages.push((RANDOM_STAGE.to_string(), random_dir, main));
    }
    stages.push(("sft".to_string(), run_dir.join("ref"), main));
    if let Some(ck) = latest_checkpoint(run_dir) {
        stages.push(("rl".into(), ck, main));
    }
    for arm in ablation {
        if let Some(ck) = latest_checkpoint(&arm.dir) {
            stages.push((arm.label.clone(), ck, &arm.context));
        }
    }
    Ok(stages)
}

/// An earlier, unfinished `corvid run` here may have evaluated into the store; this run
/// evaluates every stage again (RL may have moved on), and eval refuses a stage label whose
/// stored episodes came from other weights. The old episodes are kept aside, in
/// `store.before-<started unix s>`.
fn move_earlier_store_aside(store_dir: &Path, started_unix_ms: u64) -> Result<()> {
    if !store_dir.exists() {
        return Ok(());
    }
    let old = store_dir.with_file_name(format!("store.before-{}", started_unix_ms / 1000));
    std::fs::rename(store_dir, &old).with_context(|| {
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
    Ok(())
}

/// One job of the evaluation queue: a stage's policy on one level.
#[derive(Clone, Debug)]
pub(super) struct EvalJob {
    pub stage: String,
    /// The policy's checkpoint folder (weights and `config.json`).
    pub checkpoint: PathBuf,
    pub level: u32,
}

/// The jobs for `stages` (name, checkpoint) on levels `first..=last`, longest first, so that
/// workers taking them in order finish close together: the random policy's episodes run to the
/// turn and context limits (several times an episode of a trained policy), and higher levels
/// are longer.
pub(super) fn eval_jobs(stages: &[(String, PathBuf)], (first, last): (u32, u32)) -> Vec<EvalJob> {
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

/// Evaluates one stage's policy on one level (one job of the evaluation queue), its episodes
/// in the run's window and fold (`context`), as its actors ran them.
fn eval_job(
    job: &EvalJob,
    (run_dir, run): (&Path, &RunSection),
    pack: Option<PathBuf>,
    run_tool_call_format: Option<String>,
    context: &ContextSection,
    store: Arc<TrajectoryStore>,
) -> Result<EvalResult> {
    let args = EvalArgs {
        random_init: false,
        checkpoint: Some(job.checkpoint.clone()),
        model_preset: "tiny".into(),
        model_config: None,
        tool_call_format: run_tool_call_format,
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
        window_tokens: context.window_tokens,
        fold: context.fold,
        memory_tokens: context.memory_tokens,
        notes_path: context.notes_path.clone(),
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

/// Saves a fresh initialisation of `model`, drawn with `seed` as the learner draws its own,
/// as a checkpoint in `dir`: the random baseline, so that every level evaluates the same
/// weights and its episodes can be replayed against them.
fn save_random_init(model: &ModelConfig, seed: u64, dir: &Path) -> Result<()> {
    let (vs, _) = build_model(model, tch::Device::Cpu, tch::Kind::Float, seed)
        .context("initialising the random baseline")?;
    checkpoint::save(&vs, model, dir)
        .with_context(|| format!("saving the random baseline to {}", dir.display()))
}

/// Saves the Hugging Face model `hf` a run started from as a policy folder in `dir` (its
/// Hugging Face files in `hf/`, so it is evaluated in the model's own format).
fn save_starting_weights(hf: &Path, dir: &Path) -> Result<()> {
    let opened = corvid_model::arch::open(hf, tch::Device::Cpu)
        .with_context(|| format!("loading the starting model {}", hf.display()))?;
    checkpoint::save(&opened.vs, opened.model.config(), dir)
        .with_context(|| format!("saving the starting weights to {}", dir.display()))?;
    corvid_model::arch::copy_origin(hf, &dir.join(corvid_model::arch::ORIGIN_DIR))
        .with_context(|| format!("copying {}'s files into {}", hf.display(), dir.display()))
}

/// One stage's result from its per-level parts: levels in order; `wall_s` is the sum of the
/// parts' (the time this stage's evaluation took, whichever worker ran it) and the token
/// rate is over that sum.
pub(super) fn merge_stage(mut parts: Vec<EvalResult>) -> Result<EvalResult> {
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
        let levels = parts
            .iter()
            .flat_map(|p| p.families.iter().filter(|f| f.family == fam.family))
            .flat_map(|f| f.levels.iter().cloned())
            .collect();
        *fam = FamilyResult::new(fam.family.clone(), levels);
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

/// The ablation's headline figures, from [`arm_figures`]: success at the frontier of the
/// step-level (main) arm and the trajectory-GRPO arm; empty without a frontier.
pub(super) fn ablation_figures(
    arms: &BTreeMap<String, Option<f64>>,
) -> BTreeMap<String, Option<f64>> {
    if arms.is_empty() {
        return BTreeMap::new();
    }
    let at = |stage: &str| arms.get(stage).copied().flatten();
    BTreeMap::from([
        ("step_level".to_string(), at("rl")),
        ("trajectory_grpo".to_string(), at("ablation-grpo")),
    ])
}

/// Success at the main run's final `frontier` level of every evaluated stage but the random
/// policy's (`sft`, `rl`, `ablation-<arm>`); empty without a frontier.
pub(super) fn arm_figures(
    evals: &BTreeMap<String, EvalResult>,
    frontier: Option<u32>,
) -> BTreeMap<String, Option<f64>> {
    let Some(level) = frontier else {
        return BTreeMap::new();
    };
    evals
        .iter()
        .filter(|(stage, _)| stage.as_str() != RANDOM_STAGE)
        .map(|(stage, r)| (stage.clone(), success_at(r, level)))
        .collect()
}

/// The oracle's tokens per level of `family` (the instance of seed 0), for the report.
pub(super) fn level_tokens(
    plan: &RunPlan,
    family: &str,
) -> Result<BTreeMap<String, BTreeMap<String, usize>>> {
    let family_impl = plan.cfg.families()?.get(family)?;
    let mut per_level = BTreeMap::new();
    for level in 1..=family_impl.levels() {
        let t = family_impl.instance(level, 0)?.oracle_tokens();
        per_level.insert(level.to_string(), t);
    }
    Ok(BTreeMap::from([(family.to_string(), per_level)]))
}
