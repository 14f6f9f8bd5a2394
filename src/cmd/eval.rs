//! `corvid eval`: run a checkpoint on held-out task instances and report, per level, the
//! success rate, tool-call parse and success rates, multi-step completion, failure
//! recovery, pass@k and pass^k, mean turns and tokens. Every evaluation episode is stored,
//! so `corvid replay` can show, export and re-score it.
//!
//! Held-out seeds: the learner draws training seeds at random from the whole `u64` range;
//! evaluation uses the consecutive seeds `--seed, --seed+1, …` (default 2^62), so the two
//! coincide with negligible probability and every evaluation of a given `--seed` sees the
//! same instances (stages of one run are compared on identical tasks).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use corvid_actor::{EngineConfig, EpisodeSpec, LoadedPolicy, Trajectory, TrajectorySink};
use corvid_learner::model::{checkpoint, ModelConfig};
use corvid_learner::store::{Begin, TrajectoryStore, TrajectoryWriter};
use corvid_learner::tokenizer::Special;
use corvid_proto::{SamplingParams, Step, TrajectoryFooter, TrajectoryHeader};
use corvid_rewards::{mean_pass_at_k, mean_pass_hat_k, EpisodeEval, EvalMetrics};
use corvid_tasks::TaskFamily;
use serde::Serialize;

/// Evaluate a checkpoint on held-out tasks.
#[derive(Args, Debug, Clone)]
#[command(after_help = "Examples:
  corvid eval --checkpoint runs/demo/ref --family hops --levels 1..4 --episodes 200
  corvid eval --checkpoint runs/demo/ckpt/00000012 --family hops --levels 1..6 --episodes 100 --k 4 --temperature 1 --json
  corvid eval --random-init --model-preset tiny --family hops --levels 1..2 --episodes 50

A checkpoint is any folder holding model.safetensors and config.json: a run checkpoint
(runs/<name>/ckpt/<n>), the SFT reference (runs/<name>/ref), or `corvid model` output.
Episodes are stored in --store (default runs/eval/store) under ids <label>.<family>.L<level>.s<seed>.k<i>.")]
pub struct EvalArgs {
    /// Checkpoint folder (model.safetensors + config.json).
    #[arg(long, value_name = "DIR", required_unless_present = "random_init")]
    pub checkpoint: Option<PathBuf>,
    /// Evaluate a freshly initialised policy instead (the "random" baseline).
    #[arg(long, conflicts_with = "checkpoint")]
    pub random_init: bool,
    /// Model preset for --random-init.
    #[arg(long, default_value = "tiny")]
    pub model_preset: String,
    /// Model config JSON for --random-init (overrides --model-preset).
    #[arg(long, value_name = "FILE")]
    pub model_config: Option<PathBuf>,
    /// Task family (built-in) or the name of a pack given with --pack.
    #[arg(long)]
    pub family: String,
    /// A task pack file providing the family.
    #[arg(long, value_name = "FILE")]
    pub pack: Option<PathBuf>,
    /// Levels: `A..B` (inclusive) or a single level.
    #[arg(long, default_value = "1..4", value_parser = parse_levels)]
    pub levels: (u32, u32),
    /// Task instances per level.
    #[arg(long, default_value_t = 200)]
    pub episodes: usize,
    /// Samples per instance, for pass@k and pass^k (use a temperature > 0 when k > 1).
    #[arg(long, default_value_t = 1)]
    pub k: u32,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus mass.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Most tokens per turn.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: u32,
    /// First held-out seed.
    #[arg(long, default_value_t = 1 << 62)]
    pub seed: u64,
    /// Episodes decoded at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// libtorch intra-op threads (0: libtorch's default). One suits small-batch decoding on
    /// a shared CPU (see `corvid actor --threads`).
    #[arg(long, default_value_t = 1)]
    pub threads: i32,
    /// Where evaluation episodes are stored.
    #[arg(long, value_name = "DIR", default_value = "runs/eval/store")]
    pub store: PathBuf,
    /// Prefix of the stored trajectory ids (default: `eval-<unix seconds>`).
    #[arg(long)]
    pub label: Option<String>,
    /// Print the result as JSON (the format `corvid report` reads).
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON result to this file.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Stage name recorded in the JSON (`random`, `sft`, `rl`, …).
    #[arg(long, default_value = "eval")]
    pub stage: String,
}

pub fn parse_levels(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("levels must be `A..B` or `N` with 1 <= A <= B, got {s:?}");
    let (a, b) = match s.split_once("..") {
        Some((a, b)) => (a.trim(), b.trim_start_matches('=').trim()),
        None => (s.trim(), s.trim()),
    };
    let a: u32 = a.parse().map_err(|_| bad())?;
    let b: u32 = b.parse().map_err(|_| bad())?;
    if a == 0 || a > b {
        return Err(bad());
    }
    Ok((a, b))
}

/// One level's figures (rates are `null` when their denominator is 0).
#[derive(Debug, Clone, Serialize)]
pub struct LevelResult {
    /// Level.
    pub level: u32,
    /// Episodes run (instances × k).
    pub episodes: usize,
    /// Solved / scored.
    pub success_rate: Option<f64>,
    /// Parsed calls / call attempts.
    pub tool_call_parse_rate: Option<f64>,
    /// Successful calls / parsed calls.
    pub tool_call_success_rate: Option<f64>,
    /// Solved / scored, over episodes whose oracle needs ≥ 2 calls.
    pub multi_step_completion: Option<f64>,
    /// Solved after a failed call / episodes with a failed call.
    pub failure_recovery_rate: Option<f64>,
    /// Mean pass@k over instances.
    pub pass_at_k: Option<f64>,
    /// Mean pass^k over instances.
    pub pass_hat_k: Option<f64>,
    /// Mean turns per episode.
    pub mean_turns: f64,
    /// Mean tokens per episode.
    pub mean_tokens: f64,
    /// Episodes excluded (infra_error, abandoned).
    pub excluded: usize,
    /// Episodes by termination.
    pub terminations: BTreeMap<String, usize>,
}

/// One family's levels.
#[derive(Debug, Clone, Serialize)]
pub struct FamilyResult {
    /// Family name.
    pub family: String,
    /// Per level, in order.
    pub levels: Vec<LevelResult>,
}

/// The whole evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct EvalResult {
    /// Stage label.
    pub stage: String,
    /// The checkpoint folder, or `random-init`.
    pub checkpoint: String,
    /// Policy version recorded in the episodes' headers.
    pub policy_version: u64,
    /// Instances per level.
    pub episodes_per_level: usize,
    /// Samples per instance.
    pub k: u32,
    /// Sampling temperature.
    pub temperature: f32,
    /// First held-out seed.
    pub seed: u64,
    /// Where the episodes are stored.
    pub store: String,
    /// Per family.
    pub families: Vec<FamilyResult>,
    /// Wall time, seconds.
    pub wall_s: f64,
    /// Generated tokens per second over the run.
    pub generated_tokens_per_s: f64,
}

/// Writes every trajectory into the store as it grows (evaluation episodes are replayable).
struct StoreSink {
    store: Arc<TrajectoryStore>,
    open: HashMap<String, (TrajectoryWriter, u64)>,
    error: Option<anyhow::Error>,
    duplicates: usize,
}

impl StoreSink {
    fn fail(&mut self, e: anyhow::Error) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }
}

impl TrajectorySink for StoreSink {
    fn header(&mut self, header: &TrajectoryHeader) {
        match self.store.begin(header.clone()) {
            Ok(Begin::New(w)) => {
                self.open.insert(header.trajectory_id.clone(), (w, 0));
            }
            Ok(_) => self.duplicates += 1,
            Err(e) => self.fail(anyhow::Error::new(e).context("storing an eval episode")),
        }
    }
    fn step(&mut self, id: &str, step: Step) {
        if let Some((w, seq)) = self.open.get_mut(id) {
            let r = w.append(*seq, step);
            *seq += 1;
            if let Err(e) = r {
                self.fail(anyhow::Error::new(e).context("storing an eval step"));
            }
        }
    }
    fn footer(&mut self, id: &str, footer: TrajectoryFooter) {
        if let Some((w, _)) = self.open.remove(id) {
            if let Err(e) = w.finish_blocking(footer) {
                self.fail(anyhow::Error::new(e).context("finishing an eval episode"));
            }
        }
    }
}

/// A sink that stores and also keeps what the metrics need.
struct EvalSink {
    store: StoreSink,
    collect: corvid_actor::CollectSink,
}

impl TrajectorySink for EvalSink {
    fn header(&mut self, h: &TrajectoryHeader) {
        self.store.header(h);
        self.collect.header(h);
    }
    fn step(&mut self, id: &str, step: Step) {
        self.collect.step(id, step.clone());
        self.store.step(id, step);
    }
    fn footer(&mut self, id: &str, f: TrajectoryFooter) {
        self.store.footer(id, f);
        self.collect.footer(id, f);
    }
}

/// What the evaluator metrics need from one episode.
pub fn episode_eval(t: &Trajectory, oracle_calls: u32) -> EpisodeEval {
    let open = Special::ToolCallOpen.id();
    // A turn may span several steps; the last piece carries its call and result.
    let mut attempts: BTreeMap<u32, bool> = BTreeMap::new();
    let mut statuses = Vec::new();
    for s in &t.steps {
        let opened = s
            .token_ids
            .iter()
            .zip(&s.loss_mask)
            .any(|(&id, &m)| m && id == open);
        *attempts.entry(s.turn).or_default() |= opened;
        if let (Some(_), Some(r)) = (&s.tool_call, &s.tool_result) {
            statuses.push(r.status);
        }
    }
    EpisodeEval {
        call_attempts: attempts.values().filter(|a| **a).count() as u32,
        call_statuses: statuses,
        success: t.footer.success,
        termination: t.footer.termination,
        oracle_calls,
    }
}

/// Figures for one level from its trajectories (`k` samples per instance).
pub fn level_result(
    level: u32,
    trajectories: &[Trajectory],
    oracle_calls: &HashMap<u64, u32>,
    k: u32,
) -> Result<LevelResult> {
    let evals: Vec<EpisodeEval> = trajectories
        .iter()
        .map(|t| {
            episode_eval(
                t,
                oracle_calls.get(&t.header.task.seed).copied().unwrap_or(0),
            )
        })
        .collect();
    let m = EvalMetrics::from_episodes(&evals);
    let mut per_task: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut terminations: BTreeMap<String, usize> = BTreeMap::new();
    for t in trajectories {
        *terminations
            .entry(t.footer.termination.as_str().to_string())
            .or_default() += 1;
        if t.footer.termination.is_scored() {
            let e = per_task.entry(t.header.task.seed).or_default();
            e.0 += 1;
            e.1 += t.footer.success as u64;
        }
    }
    let tasks: Vec<(u64, u64)> = per_task
        .into_values()
        .filter(|(n, _)| *n >= k as u64)
        .collect();
    let n = trajectories.len().max(1) as f64;
    let turns: usize = trajectories
        .iter()
        .map(|t| {
            let mut seen: Vec<u32> = t.steps.iter().map(|s| s.turn).collect();
            seen.dedup();
            seen.len()
        })
        .sum();
    Ok(LevelResult {
        level,
        episodes: trajectories.len(),
        success_rate: m.success_rate,
        tool_call_parse_rate: m.tool_call_parse_rate,
        tool_call_success_rate: m.tool_call_success_rate,
        multi_step_completion: m.multi_step_completion,
        failure_recovery_rate: m.failure_recovery_rate,
        pass_at_k: mean_pass_at_k(&tasks, k as u64)?,
        pass_hat_k: mean_pass_hat_k(&tasks, k as u64)?,
        mean_turns: turns as f64 / n,
        mean_tokens: trajectories
            .iter()
            .map(|t| t.footer.token_count as f64)
            .sum::<f64>()
            / n,
        excluded: m.excluded,
        terminations,
    })
}

fn load_policy(args: &EvalArgs) -> Result<(LoadedPolicy, String)> {
    let device = tch::Device::Cpu;
    if args.random_init {
        let cfg = match &args.model_config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading {}", p.display()))?;
                serde_json::from_str::<ModelConfig>(&text)
                    .with_context(|| format!("{} is not a model config", p.display()))?
            }
            None => ModelConfig::preset(&args.model_preset)?,
        };
        cfg.validate()?;
        return Ok((LoadedPolicy::random(&cfg, device)?, "random-init".into()));
    }
    let dir = args
        .checkpoint
        .as_deref()
        .context("--checkpoint or --random-init is required")?;
    let cfg = checkpoint::load_config(dir)
        .with_context(|| format!("reading the model config of checkpoint {}", dir.display()))?;
    let path = dir.join(checkpoint::WEIGHTS_FILE);
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    // A run checkpoint knows which policy version its weights are; a policy folder (`ref/`,
    // an export) does not, and is recorded as version 0.
    let version = corvid_learner::checkpoint::read_state(dir)
        .with_context(|| format!("reading the state of checkpoint {}", dir.display()))?
        .map_or(0, |s| s.policy_version);
    let policy = LoadedPolicy::from_bytes(&cfg, device, &bytes, version)
        .with_context(|| format!("loading the weights of {}", dir.display()))?;
    Ok((policy, dir.display().to_string()))
}

/// Runs the evaluation described by `args` and returns its result, storing every episode in
/// `args.store`.
pub fn evaluate(args: &EvalArgs) -> Result<EvalResult> {
    evaluate_into(args, open_store(&args.store)?)
}

/// Opens (creating its parent folder) the store evaluation episodes go to.
pub fn open_store(path: &Path) -> Result<Arc<TrajectoryStore>> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let store = TrajectoryStore::open(path).with_context(|| {
        format!(
            "opening the eval store {} (is another process using it?)",
            path.display()
        )
    })?;
    Ok(Arc::new(store))
}

/// [`evaluate`] into a store that is already open, so several evaluations can run at once
/// in one process (`corvid run` evaluates its stages two at a time) and share it.
pub fn evaluate_into(args: &EvalArgs, store: Arc<TrajectoryStore>) -> Result<EvalResult> {
    if args.episodes == 0 || args.k == 0 {
        bail!("--episodes and --k must be at least 1");
    }
    let family: Box<dyn TaskFamily> = match &args.pack {
        Some(p) => Box::new(
            corvid_tasks::load_pack(p).with_context(|| format!("loading {}", p.display()))?,
        ),
        None => corvid_tasks::builtin_family(&args.family)?,
    };
    if family.name() != args.family {
        bail!(
            "the pack {} defines family {:?}, not {:?}",
            args.pack
                .as_deref()
                .map(Path::display)
                .map(|d| d.to_string())
                .unwrap_or_default(),
            family.name(),
            args.family
        );
    }
    let (lo, hi) = args.levels;
    if hi > family.levels() {
        bail!(
            "family {} has levels 1..={}, not up to {hi}",
            family.name(),
            family.levels()
        );
    }
    if args.threads > 0 {
        tch::set_num_threads(args.threads);
    }
    let (mut policy, checkpoint) = load_policy(args)?;
    let env = super::task_env()?;
    let label = args
        .label
        .clone()
        .unwrap_or_else(|| format!("eval-{}", corvid_learner::store::now_unix_ms() / 1000));
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        max_new_tokens: args.max_new_tokens,
        seed: 0,
    };
    sampling
        .validate()
        .context("--temperature must be finite and >= 0, --top-p in (0, 1]")?;
    if args.max_new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    // The longest id this evaluation stores must be a valid trajectory id.
    let last_id = format!(
        "{label}.{}.L{hi}.s{}.k{}",
        family.name(),
        args.seed.wrapping_add(args.episodes as u64 - 1),
        args.k - 1
    );
    corvid_proto::validate_trajectory_id(&last_id).with_context(|| {
        format!("--label {label:?} makes trajectory ids like {last_id:?}, which are invalid")
    })?;
    let started = std::time::Instant::now();
    let mut levels = Vec::new();
    let mut generated = 0u64;
    for level in lo..=hi {
        let mut specs = Vec::new();
        let mut oracle_calls = HashMap::new();
        for i in 0..args.episodes as u64 {
            let seed = args.seed.wrapping_add(i);
            let task = Arc::new(family.instance(level, seed)?);
            oracle_calls.insert(seed, task.oracle_calls() as u32);
            for j in 0..args.k {
                let id = format!("{label}.{}.L{level}.s{seed}.k{j}", family.name());
                let mut spec = EpisodeSpec::new(
                    id,
                    task.clone(),
                    SamplingParams {
                        seed: seed ^ ((j as u64) << 32),
                        ..sampling
                    },
                );
                spec.actor_id = "eval".into();
                spec.group_id = format!("{label}.{}.L{level}.s{seed}", family.name());
                specs.push(spec);
            }
        }
        let cfg = EngineConfig {
            max_concurrency: args.concurrency.max(1),
            ..EngineConfig::default()
        };
        let mut sink = EvalSink {
            store: StoreSink {
                store: store.clone(),
                open: HashMap::new(),
                error: None,
                duplicates: 0,
            },
            collect: Default::default(),
        };
        let stats = corvid_actor::run_episodes_into(&mut policy, &env, specs, cfg, None, &mut sink)
            .with_context(|| format!("evaluating level {level}"))?;
        generated += stats.generated_tokens;
        if let Some(e) = sink.store.error.take() {
            return Err(e);
        }
        if sink.store.duplicates > 0 {
            eprintln!(
                "note: {} episodes of level {level} were already stored under label {label:?} and were not stored again",
                sink.store.duplicates
            );
        }
        let r = level_result(level, &sink.collect.finished, &oracle_calls, args.k)?;
        if !args.json {
            eprintln!(
                "{} level {level}: success {} over {} episodes ({:.1} turns, {:.0} tokens on average)",
                family.name(),
                r.success_rate.map(|s| format!("{:.1}%", 100.0 * s)).unwrap_or_else(|| "n/a".into()),
                r.episodes,
                r.mean_turns,
                r.mean_tokens
            );
        }
        levels.push(r);
    }
    store.flush_sync().context("flushing the eval store")?;
    let wall_s = started.elapsed().as_secs_f64();
    Ok(EvalResult {
        stage: args.stage.clone(),
        checkpoint,
        policy_version: policy.version(),
        episodes_per_level: args.episodes,
        k: args.k,
        temperature: args.temperature,
        seed: args.seed,
        store: args.store.display().to_string(),
        families: vec![FamilyResult {
            family: family.name().to_string(),
            levels,
        }],
        wall_s,
        generated_tokens_per_s: generated as f64 / wall_s.max(1e-9),
    })
}

/// Runs the command.
pub fn run(args: EvalArgs) -> Result<ExitCode> {
    let result = evaluate(&args)?;
    let json = serde_json::to_string_pretty(&result)?;
    if let Some(out) = &args.out {
        if let Some(parent) = out.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(out, &json).with_context(|| format!("writing {}", out.display()))?;
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{}", table(&result));
        println!(
            "episodes stored in {} (corvid replay list --store {})",
            result.store, result.store
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The per-level figures as a text table, one row per family and level (`-`: no denominator).
fn table(result: &EvalResult) -> String {
    let mut out = format!(
        "{:<8} {:>8} {:>8} {:>7} {:>8} {:>9} {:>9} {:>8} {:>8} {:>6} {:>7}\n",
        "level",
        "episodes",
        "success",
        "parse",
        "tool_ok",
        "multistep",
        "recovery",
        "pass@k",
        "pass^k",
        "turns",
        "tokens"
    );
    let pct = |x: Option<f64>| {
        x.map(|v| format!("{:.1}%", 100.0 * v))
            .unwrap_or_else(|| "-".into())
    };
    for f in &result.families {
        for l in &f.levels {
            out += &format!(
                "{:<8} {:>8} {:>8} {:>7} {:>8} {:>9} {:>9} {:>8} {:>8} {:>6.1} {:>7.0}\n",
                format!("{}/{}", f.family, l.level),
                l.episodes,
                pct(l.success_rate),
                pct(l.tool_call_parse_rate),
                pct(l.tool_call_success_rate),
                pct(l.multi_step_completion),
                pct(l.failure_recovery_rate),
                pct(l.pass_at_k),
                pct(l.pass_hat_k),
                l.mean_turns,
                l.mean_tokens
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        eval: EvalArgs,
    }

    fn args(extra: &[&str]) -> EvalArgs {
        let mut argv = vec!["eval"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).expect("arguments parse").eval
    }

    #[test]
    fn levels_parse_and_bad_ones_are_named() {
        assert_eq!(parse_levels("1..4"), Ok((1, 4)));
        assert_eq!(parse_levels("1..=4"), Ok((1, 4)));
        assert_eq!(parse_levels("3"), Ok((3, 3)));
        for bad in ["0..2", "4..1", "x", "1..y"] {
            assert!(parse_levels(bad).unwrap_err().contains(bad), "{bad}");
        }
    }

    #[test]
    fn a_random_policy_is_evaluated_and_every_episode_is_stored() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = dir.path().join("store");
        let a = args(&[
            "--random-init",
            "--family",
            "hops",
            "--levels",
            "1..2",
            "--episodes",
            "2",
            "--k",
            "2",
            "--temperature",
            "1",
            "--max-new-tokens",
            "12",
            "--label",
            "t",
            "--store",
            store.to_str().expect("utf8"),
        ]);
        let r = evaluate(&a).expect("evaluates");
        assert_eq!(r.families.len(), 1);
        let levels = &r.families[0].levels;
        assert_eq!(
            levels.iter().map(|l| l.level).collect::<Vec<_>>(),
            vec![1, 2]
        );
        for l in levels {
            assert_eq!(l.episodes, 4, "2 instances x k=2");
            assert_eq!(l.terminations.values().sum::<usize>(), 4);
            // A random byte policy does not solve a multi-hop task.
            assert_eq!(l.success_rate, Some(0.0));
            assert!(l.mean_tokens > 0.0);
        }
        let json = serde_json::to_value(&r).expect("json");
        assert!(json["families"][0]["levels"][0]["pass_at_k"].is_number());
        // The text table shows every figure, multi-step completion and pass^k included.
        let text = table(&r);
        let header: Vec<&str> = text
            .lines()
            .next()
            .expect("header")
            .split_whitespace()
            .collect();
        let cell = |row: &str, name: &str| {
            let at = header.iter().position(|h| *h == name).expect(name);
            let line = text.lines().find(|l| l.starts_with(row)).expect(row);
            line.split_whitespace().nth(at).expect("cell").to_string()
        };
        let pct = |x: Option<f64>| x.map(|v| format!("{:.1}%", 100.0 * v));
        assert_eq!(cell("hops/1", "multistep"), "-", "one call: not multi-step");
        assert_eq!(
            Some(cell("hops/2", "multistep")),
            pct(levels[1].multi_step_completion)
        );
        assert_eq!(Some(cell("hops/2", "pass^k")), pct(levels[1].pass_hat_k));
        assert_eq!(
            Some(cell("hops/2", "recovery")),
            pct(levels[1].failure_recovery_rate).or(Some("-".into()))
        );
        // Every episode is in the store, replayable.
        let s = TrajectoryStore::open(&store).expect("store reopens");
        let stats = s.stats().expect("stats");
        assert_eq!(stats.finished, 8, "{stats:?}");
        assert!(s
            .get("t.hops.L1.s4611686018427387904.k1")
            .expect("get")
            .is_some());
    }
    #[test]
    fn sampling_flags_and_labels_that_cannot_be_stored_are_refused_before_anything_runs() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = dir.path().join("store");
        let store = store.to_str().expect("utf8");
        let run = |extra: &[&str]| {
            let mut argv = vec![
                "--random-init",
                "--family",
                "hops",
                "--levels",
                "1",
                "--episodes",
                "1",
                "--store",
                store,
            ];
            argv.extend_from_slice(extra);
            let err = evaluate(&args(&argv)).expect_err("refused");
            format!("{err:#}")
        };
        for (flags, names) in [
            (&["--top-p", "NaN"][..], "--top-p"),
            (&["--top-p", "0"][..], "--top-p"),
            (&["--temperature=-1"][..], "--temperature"),
            (&["--temperature", "inf"][..], "--temperature"),
            (&["--max-new-tokens", "0"][..], "--max-new-tokens"),
            (&["--label", "bad label"][..], "--label"),
            (&["--label", "x/y"][..], "--label"),
        ] {
            let err = run(flags);
            assert!(err.contains(names), "{flags:?}: {err}");
        }
        // Nothing was stored: the store, if created at all, holds no record.
        if let Ok(s) = TrajectoryStore::open(store) {
            assert_eq!(s.stats().expect("stats").finished, 0);
        }
    }
}
