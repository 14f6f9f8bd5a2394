//! What `corvid run` reads and checks before the first phase: the `[run]` table a run config
//! adds to a learner config, the learner config written into the run folder, the ablation
//! config, and [`RunPlan`], which holds all of it. Every check here runs before SFT, so a bad
//! value is refused before anything trains.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use corvid_learner::config::LearnerConfig;
use corvid_model::{checkpoint, ModelConfig};
use serde::{Deserialize, Serialize};

use super::children::free_port;
use super::RunArgs;

/// The `[run]` table: what `corvid run` adds to a learner config.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunSection {
    /// Actor processes. Default 2.
    pub actors: usize,
    /// Episodes each actor runs at once. Default 16.
    pub actor_concurrency: usize,
    /// The actors' weight dtype, `fp32` or `bf16` (`corvid actor --dtype`); empty: the
    /// device's default (fp32 on the CPU). Default empty.
    pub actor_dtype: String,
    /// Wall-clock minutes of RL per run (the learner's `schedule.max_updates` may stop it
    /// sooner); with `run_minutes` set, the most each arm gets. Default 8.
    pub rl_minutes: f64,
    /// Wall-clock minutes the whole run should take (0 = off). When set, each RL arm gets
    /// what is left after SFT, less `eval_reserve_minutes`, shared between the arms, at most
    /// `rl_minutes` and at least half a minute. Default 0.
    pub run_minutes: f64,
    /// Minutes kept for evaluation and the report when `run_minutes` is set. Default 2.5.
    pub eval_reserve_minutes: f64,
    /// The report's goal for the whole run's minutes (0: the report's default, 20, the
    /// demo's). Default 0.
    pub goal_minutes: f64,
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
    /// Evaluate the random initial policy too (false: the report lists it as not
    /// evaluated; its episodes run to the turn limit, the costliest stage). Default true.
    pub eval_random: bool,
    /// The ablation arms: other learner configs, each trained on a copy of the SFT result for
    /// the same budget and evaluated as stage `ablation-<arm>`. One path is the arm `grpo`
    /// (trajectory GRPO against the main arm's step-level credit); a table names each arm,
    /// e.g. `{ grpo = "configs/long-grpo.toml", drop = "configs/long-drop.toml" }`. Default
    /// none.
    pub ablation: Ablations,
    /// Most minutes to wait for SFT before giving up. Default 30.
    pub sft_timeout_minutes: f64,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            actors: 2,
            actor_concurrency: 16,
            actor_dtype: String::new(),
            rl_minutes: 8.0,
            run_minutes: 0.0,
            eval_reserve_minutes: 2.5,
            goal_minutes: 0.0,
            eval_family: "hops".into(),
            eval_levels: "1..4".into(),
            eval_episodes: 200,
            eval_concurrency: 64,
            eval_max_new_tokens: 160,
            eval_workers: 2,
            eval_random: true,
            ablation: Ablations::default(),
            sft_timeout_minutes: 30.0,
        }
    }
}

/// `[run] ablation`: one learner config (the arm `grpo`) or a table of named arms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Ablations {
    /// One config: the trajectory-GRPO arm; empty means no ablation.
    One(String),
    /// Arm name → what the arm trains with.
    Named(std::collections::BTreeMap<String, ArmSpec>),
}

/// What an ablation arm trains with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ArmSpec {
    /// Another learner config file.
    Config(String),
    /// The main config with these fields changed, e.g. `{ rl = { advantage = "grpo" } }`:
    /// tables merge field by field, anything else replaces.
    Overrides(toml::Table),
}

impl Default for Ablations {
    fn default() -> Self {
        Self::One(String::new())
    }
}

/// The arm name a single `[run] ablation` path gets.
pub const GRPO_ARM: &str = "grpo";

impl Ablations {
    /// The arms, (name, spec), in name order.
    pub fn arms(&self) -> Vec<(String, ArmSpec)> {
        match self {
            Self::One(p) if p.is_empty() => Vec::new(),
            Self::One(p) => vec![(GRPO_ARM.to_string(), ArmSpec::Config(p.clone()))],
            Self::Named(m) => m.iter().map(|(n, a)| (n.clone(), a.clone())).collect(),
        }
    }

    /// Refuses an arm whose name cannot name a stage and a run folder, or with no config.
    fn validate(&self) -> Result<()> {
        for (name, spec) in self.arms() {
            let ok = !name.is_empty()
                && name.len() <= 32
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !ok {
                bail!(
                    "[run] ablation: arm name {name:?} must be 1-32 lowercase letters, digits or '-'"
                );
            }
            if matches!(&spec, ArmSpec::Config(p) if p.is_empty()) {
                bail!("[run] ablation: arm {name:?} names no config file");
            }
        }
        Ok(())
    }
}

/// Merges `over` into `base`: a table merges field by field, any other value replaces.
pub(super) fn merge_toml(base: &mut toml::Table, over: &toml::Table) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge_toml(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
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
            ("goal_minutes", self.goal_minutes),
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
        crate::cmd::eval::parse_levels(&self.eval_levels)
            .map_err(|e| anyhow::anyhow!("[run] eval_levels: {e}"))?;
        self.ablation.validate()?;
        if !["", "fp32", "bf16"].contains(&self.actor_dtype.as_str()) {
            bail!(
                "[run] actor_dtype = {:?}: must be \"fp32\", \"bf16\" or left out",
                self.actor_dtype
            );
        }
        Ok(())
    }

    /// Checks that `eval_family` is one of `families` and has the levels `eval_levels` names.
    pub fn validate_family(&self, families: &corvid_tasks::Families) -> Result<()> {
        let family = families
            .get(&self.eval_family)
            .with_context(|| format!("[run] eval_family = {:?}", self.eval_family))?;
        let (_, last) = crate::cmd::eval::parse_levels(&self.eval_levels)
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

    /// With `run_minutes` set, makes `rl_minutes` each of `arms` arms' share of what is left
    /// after `elapsed_minutes` ([`rl_minutes_within`]), and says so; otherwise changes nothing.
    pub(super) fn fit_rl_budget(&mut self, elapsed_minutes: f64, arms: u32) {
        if self.run_minutes <= 0.0 {
            return;
        }
        let cap = self.rl_minutes;
        self.rl_minutes = rl_minutes_within(
            self.run_minutes,
            elapsed_minutes,
            self.eval_reserve_minutes,
            arms,
            cap,
        );
        eprintln!(
            "[run] {elapsed_minutes:.1} of run_minutes = {} used; RL gets {:.2} minutes per arm \
             ({arms} arm(s), {} kept for evaluation, at most rl_minutes = {cap})",
            self.run_minutes, self.rl_minutes, self.eval_reserve_minutes
        );
    }
}

/// The least RL an arm gets when `run_minutes` is set, however long SFT took.
pub(super) const MIN_RL_MINUTES: f64 = 0.5;

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
pub(super) fn check_run_name(name: &str) -> Result<()> {
    corvid_learner::config::check_run_name(name)
        .context("the run name (--name, else the config's run_name)")
}

/// Splits a run config into its learner part and the `[run]` table.
pub(super) fn split_config(path: &Path) -> Result<(toml::Table, RunSection)> {
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
pub(super) fn write_learner_config(
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

/// The learner part of an ablation arm, read once before anything runs and checked: another
/// config file, or the main config's table (`main`) with the arm's fields changed. The arm
/// resumes a copy of the SFT run, whose curriculum has the main config's task levels; its
/// learner would refuse other levels, and an arm that never trains would be evaluated as the
/// SFT policy under the arm's name.
pub(super) fn read_ablation_config(
    main: &LearnerConfig,
    (main_path, main_table): (&Path, &toml::Table),
    spec: &ArmSpec,
) -> Result<(toml::Table, corvid_learner::config::ContextSection)> {
    let (table, source) = match spec {
        ArmSpec::Config(path) => {
            let (table, _) = split_config(Path::new(path))?;
            (table, path.clone())
        }
        ArmSpec::Overrides(over) => {
            let mut table = main_table.clone();
            merge_toml(&mut table, over);
            (
                table,
                format!("{} with the arm's fields", main_path.display()),
            )
        }
    };
    let text = toml::to_string_pretty(&table).context("reading the ablation config")?;
    let other =
        LearnerConfig::from_toml(&text).with_context(|| format!("{source}: the learner part"))?;
    let (a, b) = (main.family_levels()?, other.family_levels()?);
    if a != b {
        bail!(
            "the ablation config {source} trains task levels {b:?} but {} trains {a:?}; the \
             arms must share [tasks]",
            main_path.display()
        );
    }
    Ok((table, other.rollout.context))
}

/// Whether the run folder holds a run checkpoint (`ckpt/<update>/`).
pub(super) fn has_checkpoint(run_dir: &Path) -> bool {
    std::fs::read_dir(run_dir.join("ckpt"))
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().parse::<u64>().is_ok())
        })
        .unwrap_or(false)
}

/// Newest run checkpoint folder.
pub(super) fn latest_checkpoint(run_dir: &Path) -> Option<PathBuf> {
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

/// One RL arm: a learner on its own run folder and loopback port, with its actors.
#[derive(Debug, Clone)]
pub(super) struct Arm {
    /// `rl`, or `ablation-<arm>`: the prefix of its progress lines and log files, and the
    /// stage its policy is evaluated as.
    pub label: String,
    /// The learner config written into `dir`.
    pub learner_cfg: PathBuf,
    pub port: u16,
    /// The arm's run folder.
    pub dir: PathBuf,
    /// The tokenizer folder its actors read (`--tokenizer`): the `[model] hf` folder of a
    /// run in the model's own format; none for the byte layout.
    pub tokenizer: Option<PathBuf>,
    /// Its `[rollout.context]`: the window and fold its policy is evaluated in, as its actors
    /// ran.
    pub context: corvid_learner::config::ContextSection,
}

/// An ablation arm before it runs: its name, its learner table, and its folder
/// `runs/<name>-ablation-<arm>` (not yet made).
pub(super) struct PlannedArm {
    pub name: String,
    pub table: toml::Table,
    pub dir: PathBuf,
    pub context: corvid_learner::config::ContextSection,
}

/// Everything read and checked before the first phase; the main arm's run folder exists and
/// holds `learner.toml` and `model.json`.
pub(super) struct RunPlan {
    pub name: String,
    /// The main arm, whose folder `runs/<name>` also holds SFT, evaluation and the report.
    pub main: Arm,
    /// The learner part of the main config, as written into the run folder.
    pub cfg: LearnerConfig,
    pub run: RunSection,
    pub model: ModelConfig,
    /// The ablation arms that run, in name order.
    pub ablation: Vec<PlannedArm>,
}

impl RunPlan {
    /// Reads the config, applies the command-line overrides, refuses what cannot run, and
    /// makes the run folder with its learner config.
    pub(super) fn prepare(args: &RunArgs) -> Result<Self> {
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
        // Each ablation arm copies the SFT run into its own folder; an existing one is refused
        // now, not after SFT has run.
        let arms = if args.no_ablation {
            Vec::new()
        } else {
            run.ablation.arms()
        };
        for (arm, _) in &arms {
            let dir = ablation_dir(&name, arm);
            if dir.exists() {
                bail!(
                    "{} exists; remove it or run with --no-ablation",
                    dir.display()
                );
            }
        }
        check_model_init(&table, &run_dir, &args.config)?;
        std::fs::create_dir_all(&run_dir)
            .with_context(|| format!("creating {}", run_dir.display()))?;
        let port = free_port()?;
        let main_table = table.clone();
        let (learner_cfg, cfg) = write_learner_config(table, &run_dir, port, &name)?;
        run.validate_family(&cfg.families()?)
            .with_context(|| format!("{}", args.config.display()))?;
        // The evaluation folds as the actors do, with its own turn limit.
        if let Some((field, value, why)) = cfg
            .rollout
            .context
            .assignment()
            .and_then(|c| c.unfit(run.eval_max_new_tokens))
        {
            bail!(
                "{}: [rollout.context] {field} = {value}: with [run] eval_max_new_tokens = {}, expected {why}",
                args.config.display(),
                run.eval_max_new_tokens
            );
        }
        let mut ablation = Vec::with_capacity(arms.len());
        for (arm, spec) in arms {
            let (table, context) = read_ablation_config(&cfg, (&args.config, &main_table), &spec)
                .with_context(|| format!("[run] ablation arm {arm:?}"))?;
            let path = match &spec {
                ArmSpec::Config(p) => PathBuf::from(p),
                ArmSpec::Overrides(_) => args.config.clone(),
            };
            if let Some((field, value, why)) = context
                .assignment()
                .and_then(|c| c.unfit(run.eval_max_new_tokens))
            {
                bail!(
                    "{}: [rollout.context] {field} = {value}: with [run] eval_max_new_tokens = {}, expected {why}",
                    path.display(),
                    run.eval_max_new_tokens
                );
            }
            ablation.push(PlannedArm {
                dir: ablation_dir(&name, &arm),
                name: arm,
                table,
                context,
            });
        }
        let model = cfg.model.resolve()?;
        let model_json = run_dir.join("model.json");
        std::fs::write(&model_json, serde_json::to_string_pretty(&model)?)
            .with_context(|| format!("writing {}", model_json.display()))?;
        eprintln!("[run] {name}: run folder {}", run_dir.display());
        let format = cfg.episode_format()?;
        for note in format.chat_format().map(|c| c.notes()).unwrap_or_default() {
            eprintln!("[run] {name}: note: {note}");
        }
        let tokenizer = format.chat_format().and(cfg.model.hf.clone());
        let main = Arm {
            label: "rl".into(),
            learner_cfg,
            port,
            dir: run_dir,
            tokenizer,
            context: cfg.rollout.context.clone(),
        };
        Ok(Self {
            name,
            main,
            cfg,
            run,
            model,
            ablation,
        })
    }

    /// The main run folder, `runs/<name>`.
    pub(super) fn run_dir(&self) -> &Path {
        &self.main.dir
    }
}

/// The folder of ablation arm `arm` of run `name`: `runs/<name>-ablation-<arm>`.
pub(super) fn ablation_dir(name: &str, arm: &str) -> PathBuf {
    PathBuf::from("runs").join(format!("{name}-ablation-{arm}"))
}

/// Refuses a `[model] init` that is not a policy folder. A fresh run starts from it; one that
/// resumes a checkpoint in `run_dir` ignores it, so it is not checked then.
fn check_model_init(table: &toml::Table, run_dir: &Path, config: &Path) -> Result<()> {
    let Some(init) = table
        .get("model")
        .and_then(|m| m.get("init"))
        .and_then(|v| v.as_str())
        .filter(|_| !has_checkpoint(run_dir))
    else {
        return Ok(());
    };
    for file in [checkpoint::CONFIG_FILE, checkpoint::WEIGHTS_FILE] {
        if !Path::new(init).join(file).is_file() {
            bail!(
                "{}: [model] init = {init:?} is not a policy folder (no {file} there; e.g. runs/demo/ref)",
                config.display()
            );
        }
    }
    Ok(())
}
