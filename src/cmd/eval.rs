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
use corvid_learner::store::{Begin, Filter, TrajectoryRecord, TrajectoryStore, TrajectoryWriter};
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
Every argument and the checkpoint are checked before --store is opened or created.
Episodes are stored in --store (default runs/eval/store) under ids
<label>.<family>.L<level>.s<seed>.k<i>, with actor eval@<fingerprint of the weights>.
A --label whose episodes the store already holds at a level is reused when those episodes are
exactly this evaluation's (same weights, policy version, sampling, instances: a re-run, or the
rest of an interrupted one) and refused otherwise: choose another --label or --store.
--k above 1 needs --temperature above 0: greedy samples of one instance are identical.")]
pub struct EvalArgs {
    /// Checkpoint folder (model.safetensors + config.json).
    #[arg(long, value_name = "DIR", required_unless_present = "random_init")]
    pub checkpoint: Option<PathBuf>,
    /// Evaluate a freshly initialised policy instead (the "random" baseline).
    #[arg(long, conflicts_with = "checkpoint")]
    pub random_init: bool,
    /// Model preset for --random-init (a checkpoint brings its own config).
    #[arg(long, default_value = "tiny", conflicts_with = "checkpoint")]
    pub model_preset: String,
    /// Model config JSON for --random-init (overrides --model-preset).
    #[arg(long, value_name = "FILE", conflicts_with = "checkpoint")]
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
    /// Samples per instance, for pass@k and pass^k. Above 1 it needs --temperature above 0
    /// (greedy samples of one instance are identical, and refused).
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
    /// Prefix of the stored trajectory ids (default: `eval-<unix seconds>`). Episodes the
    /// store already holds under this label are reused if they are exactly this evaluation's
    /// (same weights, policy version, sampling and instances); any other is refused.
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
    /// The label they are stored under (`<label>.<family>.L<level>.s<seed>.k<i>`): a rerun
    /// with `--label` reuses them, or finishes an interrupted evaluation.
    pub label: String,
    /// Per family.
    pub families: Vec<FamilyResult>,
    /// Wall time, seconds.
    pub wall_s: f64,
    /// Generated tokens per second over the run (episodes reused from the store were not
    /// generated again and count for neither).
    pub generated_tokens_per_s: f64,
}

/// Writes every trajectory into the store as it grows (evaluation episodes are replayable).
struct StoreSink {
    store: Arc<TrajectoryStore>,
    open: HashMap<String, (TrajectoryWriter, u64)>,
    error: Option<anyhow::Error>,
    /// Episodes already stored (under an id checked to be free before the run: another
    /// evaluation in this process stored them meanwhile).
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

/// The policy an evaluation runs.
struct Policy {
    loaded: LoadedPolicy,
    /// The checkpoint folder, or `random-init`.
    source: String,
    /// [`weights_fingerprint`] of its model config and weights.
    fingerprint: u64,
}

/// The `actor_id` recorded in the header of every episode evaluated with the weights whose
/// [`weights_fingerprint`] is `fingerprint`: `eval@<16 hex digits>`. It tells which weights
/// wrote an episode (policy version 0 is both a random initialisation and an SFT reference).
fn eval_actor_id(fingerprint: u64) -> String {
    format!("eval@{fingerprint:016x}")
}

/// A 64-bit FNV-1a hash of `cfg` (as JSON) and `weights`: it identifies a policy's weights,
/// stably across builds (unlike `std`'s hasher), so episodes stored by one evaluation can be
/// recognised by the next.
fn weights_fingerprint(cfg: &ModelConfig, weights: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let config = serde_json::to_vec(cfg).unwrap_or_default();
    let len = (config.len() as u64).to_le_bytes();
    let mut h = OFFSET;
    for &b in len.iter().chain(&config).chain(weights) {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    h
}

fn load_policy(args: &EvalArgs) -> Result<Policy> {
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
        let loaded = LoadedPolicy::random(&cfg, device)?;
        let bytes = loaded
            .to_bytes()
            .context("reading back the random initialisation")?;
        return Ok(Policy {
            fingerprint: weights_fingerprint(&cfg, &bytes),
            loaded,
            source: "random-init".into(),
        });
    }
    let dir = args
        .checkpoint
        .as_deref()
        .context("--checkpoint or --random-init is required")?;
    let missing: Vec<&str> = [checkpoint::CONFIG_FILE, checkpoint::WEIGHTS_FILE]
        .into_iter()
        .filter(|f| !dir.join(f).is_file())
        .collect();
    if !missing.is_empty() {
        bail!(
            "--checkpoint {} is not a checkpoint folder: it has no {} (a checkpoint holds {} and {}: \
             a run's ref/ or ckpt/<n>, or `corvid model` output)",
            dir.display(),
            missing.join(" and no "),
            checkpoint::CONFIG_FILE,
            checkpoint::WEIGHTS_FILE
        );
    }
    let cfg = checkpoint::load_config(dir)
        .with_context(|| format!("reading the model config of checkpoint {}", dir.display()))?;
    let path = dir.join(checkpoint::WEIGHTS_FILE);
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    // A run checkpoint knows which policy version its weights are; a policy folder (`ref/`,
    // an export) does not, and is recorded as version 0.
    let version = corvid_learner::checkpoint::read_state(dir)
        .with_context(|| format!("reading the state of checkpoint {}", dir.display()))?
        .map_or(0, |s| s.policy_version);
    let loaded = LoadedPolicy::from_bytes(&cfg, device, &bytes, version)
        .with_context(|| format!("loading the weights of {}", dir.display()))?;
    Ok(Policy {
        fingerprint: weights_fingerprint(&cfg, &bytes),
        loaded,
        source: dir.display().to_string(),
    })
}

/// An evaluation whose arguments, task family and policy have all been checked; nothing has
/// touched a store yet.
struct Plan {
    family: Box<dyn TaskFamily>,
    policy: Policy,
    env: corvid_tasks::TaskEnv,
    label: String,
    sampling: SamplingParams,
}

/// Checks every argument, loads the task family and the policy: whatever can be refused is
/// refused here, before a store is opened or created.
fn plan(args: &EvalArgs) -> Result<Plan> {
    if args.episodes == 0 || args.k == 0 {
        bail!("--episodes and --k must be at least 1");
    }
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    if args.threads < 0 {
        bail!(
            "--threads must be >= 0 (0: libtorch's default), got {}",
            args.threads
        );
    }
    if args.max_new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        max_new_tokens: args.max_new_tokens,
        seed: 0,
    };
    sampling
        .validate()
        .context("--temperature must be finite and >= 0, --top-p in (0, 1]")?;
    // Temperature 0 decodes greedily (the sampler takes the most likely token): the k samples
    // of an instance would be one episode k times, and pass@k = pass^k = the success rate.
    if args.k > 1 && args.temperature == 0.0 {
        let k = args.k;
        bail!(
            "--k {k} draws {k} samples of each instance, but --temperature 0 (the default) decodes \
             greedily, so the {k} samples would be identical and pass@{k} and pass^{k} would only \
             repeat the success rate; pass --temperature above 0 (for example --temperature 1) \
             with --k above 1, or use --k 1"
        );
    }
    if let Some(out) = &args.out {
        if out.is_dir() {
            bail!("--out {} is a folder; give a file path", out.display());
        }
    }
    let family: Box<dyn TaskFamily> = match &args.pack {
        Some(p) => Box::new(
            corvid_tasks::load_pack(p).with_context(|| format!("loading {}", p.display()))?,
        ),
        None => corvid_tasks::builtin_family(&args.family).with_context(|| {
            format!(
                "--family {} (a task pack's family needs its file: --pack FILE)",
                args.family
            )
        })?,
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
    let (_, hi) = args.levels;
    if hi > family.levels() {
        bail!(
            "family {} has levels 1..={}, not up to {hi}",
            family.name(),
            family.levels()
        );
    }
    let label = args
        .label
        .clone()
        .unwrap_or_else(|| format!("eval-{}", corvid_learner::store::now_unix_ms() / 1000));
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
    if args.threads > 0 {
        tch::set_num_threads(args.threads);
    }
    let policy = load_policy(args)?;
    let env = super::task_env()?;
    Ok(Plan {
        family,
        policy,
        env,
        label,
        sampling,
    })
}

/// Runs the evaluation described by `args` and returns its result, storing every episode in
/// `args.store`. Every argument and the policy are checked before the store is opened (or
/// created).
pub fn evaluate(args: &EvalArgs) -> Result<EvalResult> {
    let plan = plan(args)?;
    let store = open_store(&args.store)?;
    run_plan(args, plan, &store)
}

/// Opens (creating it and its parent folder if need be) the store evaluation episodes go to.
/// A plain file, or a folder that holds other files but no store, is refused rather than
/// turned into one.
pub fn open_store(path: &Path) -> Result<Arc<TrajectoryStore>> {
    if path.exists() && !path.is_dir() {
        bail!(
            "the eval store {} is a file; a trajectory store is a folder (give a new or \
             existing store folder)",
            path.display()
        );
    }
    // sled keeps its configuration in `conf` and its log in `db`.
    let is_store = path.join("conf").is_file() && path.join("db").is_file();
    let empty = std::fs::read_dir(path).map_or(true, |mut d| d.next().is_none());
    if !is_store && !empty {
        let hint = if path.join("store").join("db").is_file() {
            format!("; did you mean {}?", path.join("store").display())
        } else {
            String::new()
        };
        bail!(
            "the eval store {} is a folder that holds other files but no trajectory store (no sled \
             `conf` and `db`); give a new or existing store folder{hint}",
            path.display()
        );
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let store = TrajectoryStore::open(path).map_err(|e| {
        let why = if e.is_locked() {
            " (another process has it open; sled allows one)"
        } else {
            ""
        };
        anyhow::Error::new(e).context(format!("opening the eval store {}{why}", path.display()))
    })?;
    Ok(Arc::new(store))
}

/// [`evaluate`] into a store that is already open, so several evaluations can run at once
/// in one process (`corvid run` evaluates its stages two at a time) and share it. Every
/// argument and the policy are checked before the store is read or written.
pub fn evaluate_into(args: &EvalArgs, store: Arc<TrajectoryStore>) -> Result<EvalResult> {
    let plan = plan(args)?;
    run_plan(args, plan, &store)
}

/// The finished episodes `store` holds under `label` for `family` at `level`: ids
/// `<label>.<family>.L<level>.s<seed>.k<i>`, whatever the seed and sample.
fn stored_under(
    store: &TrajectoryStore,
    label: &str,
    family: &str,
    level: u32,
) -> Result<Vec<TrajectoryRecord>> {
    let prefix = format!("{label}.{family}.L{level}.");
    let filter = Filter {
        family: Some(family.to_string()),
        level: Some(level),
        ..Filter::default()
    };
    let mut out = Vec::new();
    for r in store.list(&filter) {
        let r = r.with_context(|| format!("reading the eval store {}", store.path().display()))?;
        if r.header
            .trajectory_id
            .strip_prefix(&prefix)
            .is_some_and(is_sample_suffix)
        {
            out.push(r);
        }
    }
    Ok(out)
}

/// Whether `rest` is `s<seed>.k<i>`, the end of an evaluation episode's id.
fn is_sample_suffix(rest: &str) -> bool {
    let Some((seed, k)) = rest.split_once(".k") else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    seed.strip_prefix('s').is_some_and(digits) && digits(k)
}

/// Why the stored episode `got` is not the one this evaluation would record as `want` (same
/// id): other weights, another policy version, other sampling or another task instance.
fn mismatch(want: &TrajectoryHeader, got: &TrajectoryHeader) -> Option<String> {
    if got.actor_id != want.actor_id {
        return Some(match got.actor_id.strip_prefix("eval@") {
            Some(theirs) => format!(
                "written by other weights (fingerprint {theirs}, this evaluation's is {})",
                want.actor_id.trim_start_matches("eval@")
            ),
            None => format!(
                "written by actor {:?}, which records no weights fingerprint to compare",
                got.actor_id
            ),
        });
    }
    if got.policy_version != want.policy_version {
        return Some(format!(
            "policy version {}, this evaluation's is {}",
            got.policy_version, want.policy_version
        ));
    }
    if got.sampling != want.sampling {
        let s = |p: &SamplingParams| {
            format!(
                "temperature {} top-p {} max-new-tokens {} seed {}",
                p.temperature, p.top_p, p.max_new_tokens, p.seed
            )
        };
        return Some(format!(
            "sampled with {}, this evaluation with {}",
            s(&got.sampling),
            s(&want.sampling)
        ));
    }
    if got.task != want.task || got.group_id != want.group_id {
        return Some("its task instance differs (the family's generator or pack changed)".into());
    }
    None
}

/// A stored finished episode read back whole.
fn stored_trajectory(store: &TrajectoryStore, rec: TrajectoryRecord) -> Result<Trajectory> {
    let id = rec.header.trajectory_id.clone();
    let footer = rec
        .footer
        .with_context(|| format!("stored episode {id} has no footer"))?;
    let steps = store
        .steps(&id)?
        .with_context(|| format!("stored episode {id} is not finished"))?
        .collect::<Result<Vec<Step>, _>>()
        .with_context(|| format!("reading the steps of stored episode {id}"))?;
    Ok(Trajectory {
        header: rec.header,
        steps,
        footer,
    })
}

/// Runs a checked evaluation into `store`, level by level.
///
/// Episodes are stored under ids `<label>.<family>.L<level>.s<seed>.k<i>`. Those the store
/// already holds under this label and level must be the ones this evaluation would record
/// (same weights, policy version, sampling and task instances): they are then reused, not run
/// again, so that the figures are always computed from the stored episodes. Any other episode
/// under the label and level is refused before anything runs at that level.
fn run_plan(args: &EvalArgs, plan: Plan, store: &Arc<TrajectoryStore>) -> Result<EvalResult> {
    let Plan {
        family,
        policy,
        env,
        label,
        sampling,
    } = plan;
    let Policy {
        loaded: mut policy,
        source: checkpoint,
        fingerprint,
    } = policy;
    let actor_id = eval_actor_id(fingerprint);
    let (lo, hi) = args.levels;
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
                spec.actor_id = actor_id.clone();
                spec.group_id = format!("{label}.{}.L{level}.s{seed}", family.name());
                specs.push(spec);
            }
        }
        // What the store already holds under this label and level.
        let stored = stored_under(store, &label, family.name(), level)?;
        let planned: HashMap<&str, &EpisodeSpec> = specs
            .iter()
            .map(|s| (s.trajectory_id.as_str(), s))
            .collect();
        let mut conflicts = Vec::new();
        for r in &stored {
            let id = r.header.trajectory_id.as_str();
            let why = match planned.get(id) {
                None => Some(
                    "not one of this evaluation's instances and samples (another --seed, \
                     --episodes or --k)"
                        .to_string(),
                ),
                Some(spec) => mismatch(&spec.header(policy.version()), &r.header),
            };
            if let Some(why) = why {
                conflicts.push((id.to_string(), why));
            }
        }
        if let Some((id, why)) = conflicts.first() {
            bail!(
                "the store {} already holds {} episode(s) of {} level {level} under --label {label:?}, \
                 {} of them not from this evaluation (for example {id}: {why}); evaluating into it \
                 would leave replay, rescore and export serving episodes these figures were not \
                 computed from. Choose another --label, or another --store",
                store.path().display(),
                stored.len(),
                family.name(),
                conflicts.len()
            );
        }
        let reuse: Vec<TrajectoryRecord> = stored;
        if !reuse.is_empty() {
            let reused: std::collections::HashSet<&str> = reuse
                .iter()
                .map(|r| r.header.trajectory_id.as_str())
                .collect();
            specs.retain(|s| !reused.contains(s.trajectory_id.as_str()));
            eprintln!(
                "note: {} of the {} episodes of {} level {level} are already stored under label \
                 {label:?} by these weights ({actor_id}) with the same policy version, sampling and \
                 tasks; reusing them{}",
                reuse.len(),
                reuse.len() + specs.len(),
                family.name(),
                if specs.is_empty() {
                    String::new()
                } else {
                    format!(" and running the other {}", specs.len())
                }
            );
        }
        let mut trajectories = Vec::new();
        if !specs.is_empty() {
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
            let stats =
                corvid_actor::run_episodes_into(&mut policy, &env, specs, cfg, None, &mut sink)
                    .with_context(|| format!("evaluating level {level}"))?;
            generated += stats.generated_tokens;
            if let Some(e) = sink.store.error.take() {
                return Err(e);
            }
            if sink.store.duplicates > 0 {
                bail!(
                    "{} episodes of level {level} were stored under label {label:?} by another \
                     evaluation while this one ran; choose another --label",
                    sink.store.duplicates
                );
            }
            trajectories = sink.collect.finished;
        }
        for r in reuse {
            trajectories.push(stored_trajectory(store, r)?);
        }
        trajectories.sort_by(|a, b| a.header.trajectory_id.cmp(&b.header.trajectory_id));
        let r = level_result(level, &trajectories, &oracle_calls, args.k)?;
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
        label,
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
            "episodes stored in {} under label {} (corvid replay list --store {}; \
             --label {} reuses them, or finishes an interrupted evaluation)",
            result.store, result.label, result.store, result.label
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The per-level figures as a text table, one row per family and level (`-`: no denominator).
fn table(result: &EvalResult) -> String {
    let label = |family: &str, level: u32| format!("{family}/{level}");
    // The first column is as wide as its longest label (a pack's name can be long).
    let w = result
        .families
        .iter()
        .flat_map(|f| f.levels.iter().map(|l| label(&f.family, l.level).len()))
        .max()
        .unwrap_or(0)
        .max("level".len());
    let mut out = format!(
        "{:<w$} {:>8} {:>8} {:>7} {:>8} {:>9} {:>9} {:>8} {:>8} {:>6} {:>7}\n",
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
                "{:<w$} {:>8} {:>8} {:>7} {:>8} {:>9} {:>9} {:>8} {:>8} {:>6.1} {:>7.0}\n",
                label(&f.family, l.level),
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

    /// One hops level-1 episode of the random policy into `store`, plus `extra` flags.
    fn random_l1(store: &str, extra: &[&str]) -> EvalArgs {
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
        args(&argv)
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
            let err = evaluate(&random_l1(store, extra)).expect_err("refused");
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
        // Nothing was opened: the store was not even created.
        assert!(!Path::new(store).exists(), "{store} was created");
    }

    /// Saves a fresh random initialisation of the tiny preset as a checkpoint folder.
    fn random_checkpoint(dir: &Path) -> PathBuf {
        let cfg = ModelConfig::preset("tiny").expect("tiny");
        let p = LoadedPolicy::random(&cfg, tch::Device::Cpu).expect("random policy");
        checkpoint::save(p.var_store(), &cfg, dir).expect("saves");
        dir.to_path_buf()
    }

    #[test]
    fn every_argument_and_the_checkpoint_are_checked_before_the_store_is_opened() {
        let dir = tempfile::tempdir().expect("tmp");
        let ck = random_checkpoint(&dir.path().join("ck"));
        let ck = ck.to_str().expect("utf8");
        // A folder that is not a store (a run folder, say), with a file in it.
        let folder = dir.path().join("run");
        std::fs::create_dir_all(&folder).expect("mkdir");
        std::fs::write(folder.join("notes.txt"), "mine").expect("write");
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "not a store").expect("write");
        let fresh = dir.path().join("new").join("store");
        let eval = |store: &Path, extra: &[&str]| {
            let mut argv = vec![
                "--max-new-tokens",
                "4",
                "--store",
                store.to_str().expect("utf8"),
            ];
            // Defaults for the flags a case does not set itself.
            for (flag, value) in [("--family", "hops"), ("--levels", "1"), ("--episodes", "1")] {
                if !extra.contains(&flag) {
                    argv.extend([flag, value]);
                }
            }
            argv.extend_from_slice(extra);
            format!("{:#}", evaluate(&args(&argv)).expect_err("refused"))
        };
        let untouched = |what: &str| {
            let mut names: Vec<String> = std::fs::read_dir(&folder)
                .expect("ls")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            assert_eq!(names, vec!["notes.txt"], "{what}");
            assert!(!fresh.exists(), "{what}: {} was created", fresh.display());
        };
        for (extra, names) in [
            (&["--checkpoint", ck, "--episodes", "0"][..], "--episodes"),
            (&["--checkpoint", ck, "--k", "0"][..], "--k"),
            (
                &["--checkpoint", ck, "--concurrency", "0"][..],
                "--concurrency",
            ),
            (
                &["--checkpoint", ck, "--family", "my-pack"][..],
                "unknown task family `my-pack`; known: hops, search, shell",
            ),
            (
                &["--checkpoint", ck, "--family", "my-pack"][..],
                "--pack FILE",
            ),
            (&["--checkpoint", ck, "--levels", "1..99"][..], "levels"),
            (
                &["--checkpoint", "/nonexistent/ck"][..],
                "not a checkpoint folder",
            ),
            (&["--checkpoint", ck, "--out", "/"][..], "--out"),
        ] {
            for store in [&folder, &fresh] {
                let err = eval(store, extra);
                assert!(err.contains(names), "{extra:?}: {err}");
                untouched(&format!("{extra:?}"));
            }
        }
        // A plain file or a folder of other files is refused as a store, and left as it was.
        let err = eval(&plain, &["--checkpoint", ck]);
        assert!(
            err.contains("is a file") && !err.contains("another process"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(&plain).expect("read"),
            "not a store"
        );
        let err = eval(&folder, &["--checkpoint", ck]);
        assert!(err.contains("no trajectory store"), "{err}");
        untouched("a folder that holds no store");
        // A checkpoint brings its own model config: a preset beside it is refused by clap.
        let mut cli = vec!["eval", "--checkpoint", ck, "--family", "hops"];
        cli.extend(["--model-preset", "huge"]);
        assert!(Cli::try_parse_from(cli).is_err());
    }

    #[test]
    fn several_greedy_samples_per_instance_are_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = dir.path().join("store");
        let argv = |extra: &[&str]| {
            let mut v = vec!["--max-new-tokens", "4"];
            v.extend_from_slice(extra);
            random_l1(store.to_str().expect("utf8"), &v)
        };
        for extra in [&["--k", "4"][..], &["--k", "2", "--temperature", "0"][..]] {
            let err = format!("{:#}", evaluate(&argv(extra)).expect_err("refused"));
            assert!(
                err.contains("--temperature") && err.contains("identical"),
                "{extra:?}: {err}"
            );
        }
        assert!(!store.exists());
        // k = 1 stays greedy by default, and k > 1 runs with a temperature.
        evaluate(&argv(&["--k", "2", "--temperature", "1"])).expect("evaluates");
    }

    #[test]
    fn a_label_is_reused_only_for_the_same_evaluation() {
        let dir = tempfile::tempdir().expect("tmp");
        let a = random_checkpoint(&dir.path().join("a"));
        let b = random_checkpoint(&dir.path().join("b"));
        let store = dir.path().join("store");
        let eval = |ck: &Path, label: &str, episodes: &str| {
            evaluate(&args(&[
                "--checkpoint",
                ck.to_str().expect("utf8"),
                "--family",
                "hops",
                "--levels",
                "1",
                "--episodes",
                episodes,
                "--max-new-tokens",
                "6",
                "--label",
                label,
                "--store",
                store.to_str().expect("utf8"),
            ]))
        };
        let stored = || {
            let s = TrajectoryStore::open(&store).expect("opens");
            let mut ids: Vec<(String, String)> = s
                .list(&Filter::default())
                .map(|r| {
                    let h = r.expect("record").header;
                    (h.trajectory_id, h.actor_id)
                })
                .collect();
            ids.sort();
            ids
        };
        let first = eval(&a, "t", "2").expect("evaluates");
        assert_eq!(first.label, "t", "the result names its label");
        let after_first = stored();
        assert_eq!(after_first.len(), 2);
        assert!(after_first
            .iter()
            .all(|(_, actor)| actor.starts_with("eval@")));
        // The same evaluation again: the stored episodes are the result, nothing is added.
        let again = eval(&a, "t", "2").expect("reuses");
        assert_eq!(stored(), after_first);
        assert_eq!(
            serde_json::to_value(&again.families).expect("json"),
            serde_json::to_value(&first.families).expect("json")
        );
        // More instances: the two stored ones are reused, the third is run.
        let more = eval(&a, "t", "3").expect("extends");
        assert_eq!(more.families[0].levels[0].episodes, 3);
        assert_eq!(stored().len(), 3);
        // Other weights under the same label: refused, naming the label, the count and the way out.
        let err = format!("{:#}", eval(&b, "t", "3").expect_err("refused"));
        for want in [
            "\"t\"",
            "3 episode(s)",
            "other weights",
            "--label",
            "--store",
        ] {
            assert!(err.contains(want), "{want}: {err}");
        }
        // Fewer instances than stored: the store would hold episodes the figures left out.
        let err = format!("{:#}", eval(&a, "t", "2").expect_err("refused"));
        assert!(err.contains("not one of this evaluation's"), "{err}");
        assert_eq!(
            stored().len(),
            3,
            "nothing was stored by a refused evaluation"
        );
        // Another label for the other weights is fine.
        eval(&b, "u", "1").expect("evaluates");
        assert_eq!(stored().len(), 4);
    }

    #[test]
    fn stored_ids_under_a_label_are_recognised_exactly() {
        assert!(is_sample_suffix("s4611686018427387904.k0"));
        assert!(is_sample_suffix("s1.k12"));
        for bad in ["s.k0", "s1.k", "1.k0", "s1.kx", "s1", "hops.L1.s1.k0"] {
            assert!(!is_sample_suffix(bad), "{bad}");
        }
    }
}
