//! The learner's configuration: one TOML file, every field with a documented default.
//!
//! `configs/demo.toml` is the annotated example. Sections:
//!
//! | section | what it sets |
//! |---|---|
//! | top level | run name, listen address, token file, run folder, seed, device |
//! | `[model]` | a preset (`tiny`, `small`, `k3-shape`, `gpu-1b`), a model TOML file or a Hugging Face folder (`hf`), plus field overrides |
//! | `[tasks]` | the families trained on and the highest level of each |
//! | `[curriculum]` | [`CurriculumConfig`]: promotion and demotion thresholds, context stages |
//! | `[rollout]` | open-group bound, task timeout, sampling, actors' poll interval, versions kept |
//! | `[train]` | [`TrainConfig`], shared by SFT and RL: activation checkpointing, the logits chunk, the longest trajectory trained on |
//! | `[sft]`, `[rl]` | the trainers' own configs ([`SftConfig`], [`RlConfig`]); the group size G
//! |  | (`rl.group_size`), groups per update and synchronous mode (`rl.sync`) live in `[rl]` |
//! | `[schedule]` | SFT on or off, checkpoint interval and retention, update budget |
//! | `[metrics]` | the JSONL file, the Prometheus address, the loss-spike rule |
//!
//! Relative paths are relative to the current directory, as for the command-line flags.
//! Unknown keys are errors, so a typo never silently falls back to a default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use corvid_proto::{ContextFold, Fold};
use corvid_tasks::CurriculumConfig;
use serde::{Deserialize, Serialize};

use crate::train::config::{RlConfig, SftConfig, TrainConfig};
use corvid_episode::{ChatFormat, EpisodeFormat, ToolCallSyntax};
use corvid_model::{ModelConfig, RopeScaling};

/// A configuration that does not parse or breaks a rule.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read learner config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The TOML does not parse or has unknown keys.
    #[error("learner config does not parse: {0}")]
    Parse(String),
    /// A field has a bad value.
    #[error("learner config: `{field}` = {value}: {why}")]
    Invalid {
        /// Dotted field name, e.g. `rollout.max_open_groups`.
        field: String,
        /// The offending value.
        value: String,
        /// What is allowed, as a phrase: `expected at least 1`, `must be > 0`.
        why: String,
    },
    /// A section's own check failed (`[model]`, `[curriculum]`); the message names the field.
    #[error("learner config: [{section}] {message}")]
    Section {
        /// The table, e.g. `model`.
        section: &'static str,
        /// What its check said.
        message: String,
    },
    /// An error in the config file `path`.
    #[error("{}: {source}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        #[source]
        source: Box<ConfigError>,
    },
}

/// A trainer section's error (`[sft]`, `[rl]`) as the field it names: `rl.group_size`.
fn trainer_invalid(section: &str, e: crate::train::TrainError) -> ConfigError {
    match e {
        crate::train::TrainError::Config { field, value, why } => ConfigError::Invalid {
            field: format!("{section}.{field}"),
            value,
            why: why.to_string(),
        },
        other => ConfigError::Parse(format!("[{section}]: {other}")),
    }
}

/// A family name `field` gives that neither a built-in family nor a pack in `[tasks] packs`
/// has.
fn unknown_family(field: &str, name: &str, e: corvid_tasks::TasksError) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_owned(),
        value: name.to_owned(),
        why: format!(
            "{e} (a task pack is known by its [pack] name once its file is in [tasks] packs)"
        ),
    }
}

fn invalid(field: &str, value: impl ToString, expected: &str) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_owned(),
        value: value.to_string(),
        why: format!("expected {expected}"),
    }
}

/// Checks a run name: it becomes the folder `runs/<name>`, so a non-empty name of
/// `[A-Za-z0-9_.-]` that is not only dots (`..` would be the folder above `runs/`).
pub fn check_run_name(name: &str) -> Result<(), ConfigError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || !name.chars().all(allowed) || name.chars().all(|c| c == '.') {
        return Err(invalid(
            "run_name",
            format!("{name:?}"),
            "a non-empty name of [A-Za-z0-9_.-] that is not only dots",
        ));
    }
    Ok(())
}

/// Where the policy is trained and sampled from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// Preset name (`tiny`, `small`, `k3-shape`, `gpu-1b`); ignored when `file` is set. Default `tiny`.
    pub preset: String,
    /// A model TOML file (as `configs/model/tiny.toml`); its missing fields default to `tiny`.
    pub file: Option<PathBuf>,
    /// Field overrides applied on top of the preset or file, e.g. `num_hidden_layers = 2`.
    pub overrides: toml::Table,
    /// A policy folder (`config.json` + `model.safetensors`: another run's `ref/`, a
    /// run checkpoint, `eval/random-init/`) whose weights replace the random initialisation of
    /// a fresh run. Its config must be the one this section resolves to. A resumed run takes
    /// its weights from its checkpoint and ignores this. With `[schedule] sft = false`, RL
    /// starts from these weights and they are also the KL reference. Default none.
    pub init: Option<PathBuf>,
    /// A Hugging Face folder (`config.json` naming a `model_type` Corvid loads, safetensors
    /// weights) the run starts from: its config is the model (`preset` and `file` are not
    /// read; `overrides` may set training options such as `router_noise_std`, not shapes) and
    /// its weights replace the random initialisation of a fresh run. The run keeps the
    /// folder's config and tokenizer files in `runs/<name>/hf/` and in every policy folder it
    /// writes, so each checkpoint exports back to this architecture with `corvid model export`.
    /// Default none.
    ///
    /// When the folder holds a `tokenizer.json`, episodes are in the model's own format: its
    /// tokenizer, its chat template (which must lay out a prompt with tools, a call and a tool
    /// result) and its tool-call syntax. Without one, Corvid's byte layout (the model's
    /// vocabulary must cover its 264 ids).
    pub hf: Option<PathBuf>,
    /// The tool-call syntax of a run in the model's own format: `hermes` (Qwen3),
    /// `deepseek_v3` (DeepSeek-V3, R1), `deepseek_v31`, `kimi_k2` or `corvid`. Default: the
    /// model family's (`model_type`).
    pub tool_call_format: Option<String>,
    /// Keywords passed to the chat template of a run in the model's own format, as
    /// `apply_chat_template(..., **kwargs)` passes them: `{ enable_thinking = false }` for
    /// Qwen3 without thinking. Over the folder's own `chat_template_kwargs.json`; the run
    /// writes them into the folder it keeps (`runs/<name>/hf/`), so its policy folders render
    /// as it trained. A keyword the template never reads is warned about. Default none.
    pub chat_template_kwargs: toml::Table,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            preset: "tiny".into(),
            file: None,
            overrides: toml::Table::new(),
            init: None,
            hf: None,
            tool_call_format: None,
            chat_template_kwargs: toml::Table::new(),
        }
    }
}

impl ModelSection {
    /// The run's episode format: the `hf` folder's own tokenizer, template and tool-call
    /// syntax when it holds a `tokenizer.json`, else Corvid's byte layout.
    pub fn episode_format(&self) -> Result<EpisodeFormat, ConfigError> {
        let dir = match &self.hf {
            Some(dir) if dir.join("tokenizer.json").is_file() => dir,
            _ => {
                if let Some(name) = &self.tool_call_format {
                    return Err(invalid(
                        "model.tool_call_format",
                        name,
                        "none: it applies to a model's own tokenizer ([model] hf naming a folder with tokenizer.json), and this run uses Corvid's byte layout",
                    ));
                }
                if !self.chat_template_kwargs.is_empty() {
                    return Err(invalid(
                        "model.chat_template_kwargs",
                        toml::Value::Table(self.chat_template_kwargs.clone()),
                        "none: they apply to a model's own chat template ([model] hf naming a folder with tokenizer.json), and this run uses Corvid's byte layout",
                    ));
                }
                return Ok(EpisodeFormat::default());
            }
        };
        let syntax = match &self.tool_call_format {
            Some(name) => ToolCallSyntax::from_name(name)
                .map_err(|e| invalid("model.tool_call_format", name, &e))?,
            None => {
                let family = corvid_model::arch::read_config(dir)
                    .map_err(|e| ConfigError::Section {
                        section: "model",
                        message: format!("hf = {:?}: {e}", dir.display().to_string()),
                    })?
                    .family;
                ToolCallSyntax::for_model_type(family.model_type()).ok_or_else(|| {
                    invalid(
                        "model.tool_call_format",
                        "(none)",
                        &format!(
                            "a tool-call syntax: model_type {} has no default",
                            family.model_type()
                        ),
                    )
                })?
            }
        };
        let chat =
            ChatFormat::from_folder_with(dir, syntax, &self.template_kwargs()?).map_err(|e| {
                ConfigError::Section {
                    section: "model",
                    message: format!("hf = {:?}: {e}", dir.display().to_string()),
                }
            })?;
        Ok(EpisodeFormat::chat(chat))
    }

    /// `chat_template_kwargs` as the JSON keywords a template reads.
    pub fn template_kwargs(
        &self,
    ) -> Result<serde_json::Map<String, serde_json::Value>, ConfigError> {
        match serde_json::to_value(&self.chat_template_kwargs) {
            Ok(serde_json::Value::Object(map)) => Ok(map),
            _ => Err(invalid(
                "model.chat_template_kwargs",
                toml::Value::Table(self.chat_template_kwargs.clone()),
                "a table of keywords with plain values, e.g. { enable_thinking = false }",
            )),
        }
    }

    /// The model config this section describes: preset or file, then the overrides, validated.
    pub fn resolve(&self) -> Result<ModelConfig, ConfigError> {
        let base = match (&self.hf, &self.file) {
            (Some(dir), None) if self.init.is_none() => {
                corvid_model::arch::read_config(dir)
                    .map_err(|e| ConfigError::Section {
                        section: "model",
                        message: format!("hf = {:?}: {e}", dir.display().to_string()),
                    })?
                    .model
            }
            (Some(dir), _) => {
                return Err(invalid(
                    "model.hf",
                    dir.display(),
                    "a Hugging Face folder alone (not with model.file or model.init)",
                ))
            }
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                ModelConfig::from_toml(&text).map_err(|e| {
                    ConfigError::Parse(format!("model.file {}: {e}", path.display()))
                })?
            }
            (None, None) => ModelConfig::preset(&self.preset)
                .map_err(|e| invalid("model.preset", &self.preset, &e.to_string()))?,
        };
        if self.overrides.is_empty() {
            return Ok(base);
        }
        // Merge in JSON space: the overrides replace whole fields of the base.
        let mut value =
            serde_json::to_value(&base).map_err(|e| ConfigError::Parse(format!("model: {e}")))?;
        let over = serde_json::to_value(&self.overrides)
            .map_err(|e| ConfigError::Parse(format!("model.overrides: {e}")))?;
        let base_value = value.clone();
        let over = match over {
            serde_json::Value::Object(src) => src,
            _ => serde_json::Map::new(),
        };
        if let Some(dst) = value.as_object_mut() {
            for (k, v) in &over {
                dst.insert(k.clone(), v.clone());
            }
        }
        let cfg: ModelConfig = serde_json::from_value(value).map_err(|e| {
            // Name the override that does not fit: the first that fails on its own.
            let culprit = over.iter().find(|(k, v)| {
                let mut one = base_value.clone();
                if let Some(dst) = one.as_object_mut() {
                    dst.insert((*k).clone(), (*v).clone());
                }
                serde_json::from_value::<ModelConfig>(one).is_err()
            });
            match culprit {
                Some((k, v)) => ConfigError::Parse(format!("model.overrides.{k} = {v}: {e}")),
                None => ConfigError::Parse(format!("model.overrides: {e}")),
            }
        })?;
        cfg.validate().map_err(|e| ConfigError::Section {
            section: "model",
            message: e.to_string(),
        })?;
        Ok(cfg)
    }
}

/// Which task families are trained on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TasksSection {
    /// Built-in family names (`hops`, `search`, `shell`). Default `["hops"]`.
    pub families: Vec<String>,
    /// Highest level per family; a family not listed goes up to all its levels.
    pub max_levels: BTreeMap<String, u32>,
    /// Task pack files; a pack is trained on when its name is in `families` (and can be
    /// named in `sft.levels`). Actors need the same files (`corvid actor --task-pack`).
    /// Default empty.
    pub packs: Vec<PathBuf>,
}

impl Default for TasksSection {
    fn default() -> Self {
        Self {
            families: vec!["hops".into()],
            max_levels: BTreeMap::new(),
            packs: Vec::new(),
        }
    }
}

/// How actors sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingSection {
    /// Softmax temperature; 0 is greedy. Default 1.0 (on-policy log-probs match the trainer's).
    pub temperature: f32,
    /// Nucleus mass in (0, 1]. Default 1.0 (off, so behaviour log-probs are exact).
    pub top_p: f32,
    /// Most tokens generated in one turn. Default 256.
    pub max_new_tokens: u32,
}

impl Default for SamplingSection {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens: 256,
        }
    }
}

/// Task assignment and weight refresh for actors. The group size G is `rl.group_size`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutSection {
    /// Most groups handed out and not yet completed at once. When all are out, `NextTasks`
    /// answers with no assignment and actors wait: this is the back-pressure on rollout.
    /// Default 16.
    pub max_open_groups: usize,
    /// Seconds after its last episode was handed out before an incomplete group is given up
    /// (its actor may have died); its slot is freed and the group is counted as expired.
    /// Default 600.
    pub group_timeout_s: u64,
    /// Seconds of silence after which an actor counts as gone and the episodes it holds
    /// are handed out again (same task, same sampler seed). Actors poll `PolicyInfo` every
    /// `policy_poll_interval_ms`, so this must be at least three poll intervals. Default 60.
    pub actor_timeout_s: u64,
    /// How actors sample.
    pub sampling: SamplingSection,
    /// How often actors ask for a newer policy version, milliseconds. Default 1000.
    pub policy_poll_interval_ms: u32,
    /// Policy versions kept for `FetchPolicy` (the current one and the ones before it).
    /// Default 4.
    pub keep_policy_versions: usize,
    /// Actors record every token's expert ids (an MoE policy; ignored for a dense one):
    /// the learner then measures routing agreement on every update, and `[rl]
    /// router_replay = "rollout"` needs them. Default true.
    pub record_routes: bool,
    /// The context window and what an episode does when it outgrows it.
    pub context: ContextSection,
}

/// `[rollout.context]`: each segment of an episode holds at most `window_tokens`; when the
/// next turn would not fit, `fold` says how the episode goes on (`docs/tasks.md`, folding).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContextSection {
    /// Most tokens of one segment, at most the model's positions. 0: the task's own context
    /// budget is the window and nothing folds. Default 0.
    pub window_tokens: u32,
    /// `none` (a full window ends the episode as `context_full`), `drop_tool_output`,
    /// `notes` or `summary`. Default `none`.
    pub fold: Fold,
    /// Most tokens of the carried notes or summary (a longer one is cut). Default 512.
    pub memory_tokens: u32,
    /// The workspace file a `notes` fold carries. Default `notes.md`.
    pub notes_path: String,
    /// Each task group's window is the curriculum's context stage when it opens
    /// (`[curriculum] context_stages`), at most `window_tokens`: the short-to-long schedule
    /// widens the window as the frontier moves, and levels past the last stage are reached
    /// only by folding. Default false.
    pub follow_curriculum: bool,
    /// With `follow_curriculum`, how RoPE moves with the stages: `none` (positions past the
    /// first stage's window run unscaled), `linear` (position interpolation) or `yarn`, each
    /// stage scaled by its window over the first stage's. Default `none`.
    pub stage_rope: StageRope,
}

/// How a run's RoPE scaling follows its context stages (`[rollout.context] stage_rope`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageRope {
    /// The model's own RoPE at every stage.
    #[default]
    None,
    /// Position interpolation (arXiv 2306.15595): every frequency divided by the factor.
    Linear,
    /// YaRN (arXiv 2309.00071) as transformers computes it (`rope_type = "yarn"`, β_fast 32,
    /// β_slow 1, the first stage's window as the original context, attention factor
    /// `0.1·ln s + 1`), so that a checkpoint exports with its scaling.
    Yarn,
}

impl StageRope {
    /// The scaling of a stage whose window is `window` tokens when the first stage's is
    /// `first`: the factor `window / first`, none at or below 1.
    pub fn scaling(self, window: u32, first: u32) -> RopeScaling {
        let factor = f64::from(window) / f64::from(first.max(1));
        match self {
            _ if factor <= 1.0 => RopeScaling::None,
            StageRope::None => RopeScaling::None,
            StageRope::Linear => RopeScaling::Linear { factor },
            StageRope::Yarn => RopeScaling::hf_yarn(factor, i64::from(first)),
        }
    }
}

impl Default for ContextSection {
    fn default() -> Self {
        Self {
            window_tokens: 0,
            fold: Fold::None,
            memory_tokens: 512,
            notes_path: "notes.md".into(),
            follow_curriculum: false,
            stage_rope: StageRope::None,
        }
    }
}

impl ContextSection {
    /// The settings each assignment carries (`None` without a window).
    pub fn assignment(&self) -> Option<ContextFold> {
        (self.window_tokens > 0).then(|| ContextFold {
            window_tokens: self.window_tokens,
            fold: self.fold,
            memory_tokens: self.memory_tokens,
            notes_path: self.notes_path.clone(),
        })
    }
}

impl Default for RolloutSection {
    fn default() -> Self {
        Self {
            max_open_groups: 16,
            group_timeout_s: 600,
            actor_timeout_s: 60,
            sampling: SamplingSection::default(),
            policy_poll_interval_ms: 1000,
            keep_policy_versions: 4,
            record_routes: true,
            context: ContextSection::default(),
        }
    }
}

/// The training schedule. Asynchronous or synchronous is `rl.sync`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScheduleSection {
    /// Run the SFT stage (on oracle demonstrations) before RL when no SFT checkpoint exists.
    /// Default true.
    pub sft: bool,
    /// Write a run checkpoint every this many RL updates (also at the end of SFT, when RL
    /// starts without one, and on SIGTERM / ctrl-c). Default 10.
    pub checkpoint_every: u64,
    /// Write a run checkpoint every this many SFT steps (0 = only at the end of SFT and on
    /// stop). Default 100.
    pub sft_checkpoint_every: u64,
    /// Run checkpoints kept; older ones are deleted. Default 3.
    pub keep_checkpoints: usize,
    /// Stop after this many RL updates (0 = run until stopped). Default 0.
    pub max_updates: u64,
    /// How often the trainer looks for newly finished trajectories while it waits, ms.
    /// Default 200.
    pub poll_ms: u64,
}

impl Default for ScheduleSection {
    fn default() -> Self {
        Self {
            sft: true,
            checkpoint_every: 10,
            sft_checkpoint_every: 100,
            keep_checkpoints: 3,
            max_updates: 0,
            poll_ms: 200,
        }
    }
}

/// Where figures go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// The JSONL file, one line per update; relative paths are inside the run folder.
    /// Default `metrics/metrics.jsonl`.
    pub jsonl: PathBuf,
    /// Address of the Prometheus text endpoint (`GET /metrics`); empty = off.
    /// Default `127.0.0.1:9464`.
    pub prometheus: String,
    /// A loss spike is a policy loss above the running mean + k·std. Default k = 4.
    pub spike_k: f64,
    /// Updates in the running window of the spike rule. Default 50.
    pub spike_window: usize,
    /// Updates seen before spikes are counted at all. Default 10.
    pub spike_min_samples: usize,
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self {
            jsonl: PathBuf::from("metrics/metrics.jsonl"),
            prometheus: "127.0.0.1:9464".into(),
            spike_k: 4.0,
            spike_window: 50,
            spike_min_samples: 10,
        }
    }
}

/// The whole learner configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LearnerConfig {
    /// Run name, shown to actors and in logs. Default `demo`.
    pub run_name: String,
    /// gRPC listen address. Default `127.0.0.1:50051`.
    pub listen: String,
    /// The run folder (`store/`, `ckpt/`, `metrics/`). Default `runs/<run_name>`.
    pub run_dir: Option<PathBuf>,
    /// File holding the shared token (first line). Default `<run_dir>/token`; if that default
    /// file does not exist the learner creates it with a random token (mode 0600).
    pub token_file: Option<PathBuf>,
    /// Seed of every random choice of the learner (tasks, curriculum, init). Default 0.
    pub seed: u64,
    /// `cpu`, `cuda`, `cuda:N` or `auto` (CUDA when present). Default `cpu`.
    pub device: String,
    /// libtorch intra-op threads for training (0 = libtorch's default). Default 0.
    pub threads: usize,
    /// The policy.
    pub model: ModelSection,
    /// Task families and levels.
    pub tasks: TasksSection,
    /// The curriculum.
    pub curriculum: CurriculumConfig,
    /// Assignments, groups and sampling.
    pub rollout: RolloutSection,
    /// How rows become losses in SFT and RL: activation checkpointing, the logits chunk,
    /// the longest trajectory trained on.
    pub train: TrainConfig,
    /// Supervised fine-tuning.
    pub sft: SftConfig,
    /// Policy optimisation.
    pub rl: RlConfig,
    /// Schedule and checkpoints.
    pub schedule: ScheduleSection,
    /// Metrics outputs.
    pub metrics: MetricsSection,
    /// Settings of `corvid run` (actors, RL wall-clock budget, evaluation; see
    /// `corvid run --help`), kept in the same file so one config describes a whole run.
    /// The learner itself ignores them. Default empty.
    #[serde(skip_serializing_if = "toml::Table::is_empty")]
    pub run: toml::Table,
}

impl Default for LearnerConfig {
    fn default() -> Self {
        Self {
            run_name: "demo".into(),
            listen: "127.0.0.1:50051".into(),
            run_dir: None,
            token_file: None,
            seed: 0,
            device: "cpu".into(),
            threads: 0,
            model: ModelSection::default(),
            tasks: TasksSection::default(),
            curriculum: CurriculumConfig::default(),
            rollout: RolloutSection::default(),
            train: TrainConfig::default(),
            sft: SftConfig::default(),
            rl: RlConfig::default(),
            schedule: ScheduleSection::default(),
            metrics: MetricsSection::default(),
            run: toml::Table::new(),
        }
    }
}

impl LearnerConfig {
    /// Parses and validates a TOML document.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let cfg: Self = toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads, parses and validates a TOML file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text).map_err(|e| ConfigError::InFile {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    /// The resolved configuration as TOML (written into the run folder and logged at start).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_default()
    }

    /// The run folder.
    pub fn run_dir(&self) -> PathBuf {
        self.run_dir
            .clone()
            .unwrap_or_else(|| Path::new("runs").join(&self.run_name))
    }

    /// The token file, and whether it is the default one (which may be created).
    pub fn token_path(&self) -> (PathBuf, bool) {
        match &self.token_file {
            Some(p) => (p.clone(), false),
            None => (self.run_dir().join("token"), true),
        }
    }

    /// The metrics JSONL file.
    pub fn metrics_path(&self) -> PathBuf {
        let p = &self.metrics.jsonl;
        if p.is_absolute() {
            p.clone()
        } else {
            self.run_dir().join(p)
        }
    }

    /// The listen address, parsed.
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.listen
            .parse()
            .map_err(|_| invalid("listen", &self.listen, "an address like 127.0.0.1:50051"))
    }

    /// The libtorch device.
    pub fn torch_device(&self) -> Result<tch::Device, ConfigError> {
        let d = self.device.trim();
        Ok(match d {
            "cpu" => tch::Device::Cpu,
            "cuda" => tch::Device::Cuda(0),
            "auto" => tch::Device::cuda_if_available(),
            _ => match d.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
                Some(n) => tch::Device::Cuda(n),
                None => return Err(invalid("device", d, "cpu, cuda, cuda:N or auto")),
            },
        })
    }

    /// The built-in families and the packs of `tasks.packs`.
    pub fn families(&self) -> Result<corvid_tasks::Families, ConfigError> {
        corvid_tasks::Families::new(&self.tasks.packs).map_err(|e| {
            invalid(
                "tasks.packs",
                format!("{:?}", self.tasks.packs),
                &e.to_string(),
            )
        })
    }

    /// Families with their highest level, in configuration order.
    pub fn family_levels(&self) -> Result<Vec<(String, u32)>, ConfigError> {
        let families = self.families()?;
        let mut out = Vec::new();
        for name in &self.tasks.families {
            let family = families
                .get(name)
                .map_err(|e| unknown_family("tasks.families", name, e))?;
            let top = family.levels();
            let max = self.tasks.max_levels.get(name).copied().unwrap_or(top);
            if max == 0 || max > top {
                return Err(invalid(
                    &format!("tasks.max_levels.{name}"),
                    max,
                    &format!("a level in 1..={top}"),
                ));
            }
            out.push((name.clone(), max));
        }
        Ok(out)
    }

    /// The episode format of the run: how its episodes become token ids, for the
    /// demonstrations, the trainers' packing and what actors generate.
    pub fn episode_format(&self) -> Result<EpisodeFormat, ConfigError> {
        self.model.episode_format()
    }

    /// The window and fold SFT demonstrations are laid out in (and the PTX term's): the
    /// run's `[rollout.context]`, at the first context stage's window when the windows follow
    /// the curriculum, so that SFT is the short stage the later ones extend (and, with
    /// `stage_rope`, trains only positions the first stage runs unscaled).
    pub fn sft_context(&self) -> Option<ContextFold> {
        let c = &self.rollout.context;
        let first = self.curriculum.context_stages.first();
        c.assignment().map(|fold| match first {
            Some(first) if c.follow_curriculum => ContextFold {
                window_tokens: fold.window_tokens.min(first.context_tokens),
                ..fold
            },
            _ => fold,
        })
    }

    /// The RoPE scaling of the context stage whose window is `stage_tokens`
    /// (`Curriculum::context_tokens`), `[rollout.context] stage_rope` scaling it by its window
    /// over the first stage's; `None` unless the run's windows follow the curriculum.
    pub fn stage_rope_scaling(&self, stage_tokens: u32) -> RopeScaling {
        let c = &self.rollout.context;
        let first = self.curriculum.context_stages.first();
        match first {
            Some(first) if c.follow_curriculum && c.window_tokens > 0 => c.stage_rope.scaling(
                stage_tokens.min(c.window_tokens),
                first.context_tokens.min(c.window_tokens),
            ),
            _ => RopeScaling::None,
        }
    }

    /// Checks every field, naming the offending one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_run_name(&self.run_name)?;
        self.listen_addr()?;
        self.torch_device()?;
        let model = self.model.resolve()?;
        let c = &self.rollout.context;
        if c.stage_rope != StageRope::None {
            let why = if !c.follow_curriculum || c.window_tokens == 0 {
                Some("none unless the windows follow the curriculum's stages ([rollout.context] window_tokens > 0 and follow_curriculum = true)".to_string())
            } else if model.rope_scaling != RopeScaling::None {
                Some(format!(
                    "none for a model with its own rope_scaling ({:?}): a stage's scaling would replace it",
                    model.rope_scaling
                ))
            } else {
                None
            };
            if let Some(why) = why {
                return Err(invalid(
                    "rollout.context.stage_rope",
                    format!("{:?}", c.stage_rope).to_lowercase(),
                    &why,
                ));
            }
        }
        let vocab = i64::from(self.episode_format()?.vocab_size());
        if model.vocab_size < vocab {
            return Err(invalid(
                "model vocab_size",
                model.vocab_size,
                &format!("at least {vocab}, the episode format's vocabulary"),
            ));
        }
        if self.schedule.sft && model.max_position_embeddings < self.sft.seq_len as i64 {
            return Err(invalid(
                "model max_position_embeddings",
                model.max_position_embeddings,
                &format!(
                    "at least [sft] seq_len = {}, the positions of an SFT row",
                    self.sft.seq_len
                ),
            ));
        }
        if self.rl.router_replay == crate::train::RouterReplay::Rollout {
            if !self.rollout.record_routes {
                return Err(invalid(
                    "rl.router_replay",
                    "\"rollout\"",
                    "\"off\" or \"old\" when [rollout] record_routes = false: replaying the actors' routes needs them recorded",
                ));
            }
            if model.n_moe_layers() == 0 {
                return Err(invalid(
                    "rl.router_replay",
                    "\"rollout\"",
                    "\"off\" for a dense model: it has no routes to replay",
                ));
            }
        }
        if self.tasks.families.is_empty() {
            return Err(invalid("tasks.families", "[]", "at least one family"));
        }
        for name in self.tasks.max_levels.keys() {
            if !self.tasks.families.contains(name) {
                return Err(invalid(
                    &format!("tasks.max_levels.{name}"),
                    name,
                    "a family listed in tasks.families",
                ));
            }
        }
        self.family_levels()?;
        // SFT demonstrations (and PPO-ptx's) are drawn by family name too: a typo there would
        // only fail once the learner had started and made its run folder.
        let families = self.families()?;
        for (field, levels) in [
            ("sft.levels", &self.sft.levels),
            ("sft.late_levels", &self.sft.late_levels),
        ] {
            for name in levels.keys() {
                families
                    .get(name)
                    .map_err(|e| unknown_family(&format!("{field}.{name}"), name, e))?;
            }
        }
        self.curriculum
            .validate()
            .map_err(|e| ConfigError::Section {
                section: "curriculum",
                message: e.to_string(),
            })?;
        self.train
            .validate()
            .map_err(|e| trainer_invalid("train", e))?;
        self.sft.validate().map_err(|e| trainer_invalid("sft", e))?;
        self.rl.validate().map_err(|e| trainer_invalid("rl", e))?;
        if self.rl.group_size > 1024 {
            return Err(invalid("rl.group_size", self.rl.group_size, "1..=1024"));
        }
        let r = &self.rollout;
        if r.max_open_groups == 0 {
            return Err(invalid("rollout.max_open_groups", 0, "at least 1"));
        }
        if r.group_timeout_s == 0 {
            return Err(invalid("rollout.group_timeout_s", 0, "at least 1 second"));
        }
        if r.actor_timeout_s.saturating_mul(1000) < 3 * u64::from(r.policy_poll_interval_ms.max(1))
        {
            return Err(invalid(
                "rollout.actor_timeout_s",
                r.actor_timeout_s,
                &format!(
                    "at least 3 policy polls ({} ms each, rollout.policy_poll_interval_ms): \
                     a live actor must not be taken for gone between two polls",
                    r.policy_poll_interval_ms
                ),
            ));
        }
        let s = &r.sampling;
        if !(s.temperature.is_finite() && s.temperature >= 0.0) {
            return Err(invalid(
                "rollout.sampling.temperature",
                s.temperature,
                "a finite value >= 0",
            ));
        }
        if !(s.top_p > 0.0 && s.top_p <= 1.0) {
            return Err(invalid(
                "rollout.sampling.top_p",
                s.top_p,
                "a value in (0, 1]",
            ));
        }
        if s.max_new_tokens == 0 {
            return Err(invalid("rollout.sampling.max_new_tokens", 0, "at least 1"));
        }
        if r.keep_policy_versions == 0 {
            return Err(invalid("rollout.keep_policy_versions", 0, "at least 1"));
        }
        match r.context.assignment() {
            None if r.context.fold != Fold::None => {
                return Err(invalid(
                    "rollout.context.window_tokens",
                    0,
                    &format!(
                        "a window of at least 1 token: fold = \"{}\" folds what outgrows it",
                        r.context.fold.as_str()
                    ),
                ))
            }
            Some(c) => {
                if let Some((field, value, why)) = c.unfit(s.max_new_tokens) {
                    return Err(invalid(&format!("rollout.context.{field}"), value, &why));
                }
                // Every stage's window must fold too.
                let stages = self.curriculum.context_stages.iter();
                for stage in stages.filter(|_| r.context.follow_curriculum) {
                    let staged = ContextFold {
                        window_tokens: stage.context_tokens.min(c.window_tokens),
                        ..c.clone()
                    };
                    if let Some((_, value, why)) = staged.unfit(s.max_new_tokens) {
                        return Err(invalid(
                            "curriculum.context_stages",
                            format!("{value} (from level {})", stage.min_level),
                            &format!(
                                "with [rollout.context] follow_curriculum, a window with {why}"
                            ),
                        ));
                    }
                }
            }
            None => {}
        }
        if self.schedule.checkpoint_every == 0 {
            return Err(invalid("schedule.checkpoint_every", 0, "at least 1"));
        }
        if self.schedule.keep_checkpoints == 0 {
            return Err(invalid("schedule.keep_checkpoints", 0, "at least 1"));
        }
        let m = &self.metrics;
        if !self.metrics.prometheus.is_empty() && m.prometheus.parse::<SocketAddr>().is_err() {
            return Err(invalid(
                "metrics.prometheus",
                &m.prometheus,
                "an address like 127.0.0.1:9464, or \"\" for off",
            ));
        }
        if !(m.spike_k.is_finite() && m.spike_k > 0.0) {
            return Err(invalid("metrics.spike_k", m.spike_k, "a finite k > 0"));
        }
        if m.spike_window < 2 || m.spike_min_samples < 2 || m.spike_min_samples > m.spike_window {
            return Err(invalid(
                "metrics.spike_min_samples",
                m.spike_min_samples,
                "2 <= spike_min_samples <= spike_window",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_file_the_field_and_the_line_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "seed = 1\n[rl]\ngroup_size = 0\n").unwrap();
        let e = LearnerConfig::load(&path).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}: learner config: `rl.group_size` = 0: must be > 0",
                path.display()
            )
        );
        std::fs::write(&path, "seed = 1\n\n[rl]\ngroup_siz = 3\n").unwrap();
        let e = LearnerConfig::load(&path).unwrap_err().to_string();
        assert!(e.contains("line 4") && e.contains("group_siz"), "{e}");
        assert_eq!(e.matches("does not parse").count(), 1, "{e}");
        let e = LearnerConfig::from_toml("[rl.optim]\nlr = -1.0\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`rl.optim.lr` = -1"), "{e}");
        let e = LearnerConfig::from_toml("[rollout]\nmax_open_groups = 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("`rollout.max_open_groups` = 0: expected at least 1"),
            "{e}"
        );
    }

    #[test]
    fn a_hugging_face_folder_is_the_model_and_overrides_set_training_options() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../model/tests/fixtures/hf/qwen3_moe_byte_vocab")
            .display()
            .to_string();
        let cfg = LearnerConfig::from_toml(&format!(
            "[model]\nhf = {fixture:?}\n[model.overrides]\nrouter_noise_std = 0.5\n"
        ))
        .unwrap();
        let model = cfg.model.resolve().unwrap();
        assert!(matches!(
            model.attention,
            corvid_model::Attention::Gqa {
                num_key_value_heads: 2,
                ..
            }
        ));
        assert_eq!((model.vocab_size, model.router_noise_std), (264, 0.5));
        // Not with a model file or an init policy; a folder that is not one is named.
        for extra in ["file = \"m.toml\"", "init = \"runs/x/ref\""] {
            let e = LearnerConfig::from_toml(&format!("[model]\nhf = {fixture:?}\n{extra}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("model.hf"), "{e}");
        }
        let e = LearnerConfig::from_toml("[model]\nhf = \"no/such/folder\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no/such/folder") && e.contains("config.json"),
            "{e}"
        );
    }

    #[test]
    fn empty_file_gives_the_documented_defaults() {
        let cfg = LearnerConfig::from_toml("").unwrap();
        assert_eq!(cfg, LearnerConfig::default());
        assert_eq!(cfg.run_dir(), PathBuf::from("runs/demo"));
        assert_eq!(cfg.token_path(), (PathBuf::from("runs/demo/token"), true));
        assert_eq!(cfg.rl.group_size, 8);
        assert_eq!(cfg.model.resolve().unwrap(), ModelConfig::tiny());
    }

    #[test]
    fn resolved_config_round_trips_through_toml() {
        let mut cfg = LearnerConfig::default();
        cfg.model
            .overrides
            .insert("num_hidden_layers".into(), toml::Value::Integer(2));
        cfg.tasks.max_levels.insert("hops".into(), 3);
        let again = LearnerConfig::from_toml(&cfg.to_toml()).unwrap();
        assert_eq!(again, cfg);
        assert_eq!(again.model.resolve().unwrap().num_hidden_layers, 2);
        assert_eq!(again.family_levels().unwrap(), vec![("hops".into(), 3)]);
    }

    #[test]
    fn the_shipped_demo_configs_parse_and_differ_only_in_advantages() {
        let demo = LearnerConfig::from_toml(include_str!("../../configs/demo.toml")).unwrap();
        let grpo = LearnerConfig::from_toml(include_str!("../../configs/demo-grpo.toml")).unwrap();
        assert_eq!(demo.rl.advantage, crate::train::AdvantageMode::Step);
        assert_eq!(grpo.rl.advantage, crate::train::AdvantageMode::Grpo);
        let same = LearnerConfig {
            run_name: demo.run_name.clone(),
            // The [run] tables differ: only the main run names an ablation.
            run: demo.run.clone(),
            rl: RlConfig {
                advantage: demo.rl.advantage,
                ..grpo.rl.clone()
            },
            ..grpo
        };
        assert_eq!(same, demo);
        // One demonstration per row: the causal forward without a document mask.
        assert_eq!(demo.sft.layout, crate::train::SftLayout::Bucket);
        // The demo's model: `tiny` cut to two layers with a wide latent, no gate, no
        // cross-layer residual and a two-token shift into the latent.
        assert_eq!(
            demo.model.resolve().unwrap(),
            ModelConfig {
                num_hidden_layers: 2,
                kv_lora_rank: 128,
                qk_rope_head_dim: 32,
                attn_gate: corvid_model::AttnGate::None,
                cross_layer_residual: false,
                latent_token_shift: true,
                latent_shift_taps: 2,
                ..ModelConfig::tiny()
            }
        );
    }

    #[test]
    fn bad_fields_are_named() {
        for (text, field) in [
            ("unknown_key = 1", "unknown"),
            ("[rl]\ngroup_size = 0", "group_size"),
            (
                "[sft]\nlayout = \"concat\"\nconcat_from_step = 5",
                "concat_from_step",
            ),
            ("[rl]\ngroup_size = 5000", "rl.group_size"),
            ("[rollout]\nmax_open_groups = 0", "rollout.max_open_groups"),
            // A fold whose memory and turn cannot fit the window: refused before the run.
            (
                "[rollout.context]\nwindow_tokens = 1024\nfold = \"notes\"\nmemory_tokens = 400",
                "`rollout.context.window_tokens` = 1024: expected room for the notes (400 tokens) and a whole turn (max_new_tokens = 256) in half the window (512)",
            ),
            (
                "[rollout.context]\nwindow_tokens = 2048\nfold = \"summary\"\nmemory_tokens = 300",
                "expected room for two turns (max_new_tokens = 256 each), the summary request (256 bytes) and the summary (300 tokens) in half the window (1024)",
            ),
            (
                "[rollout.context]\nfold = \"notes\"",
                "`rollout.context.window_tokens` = 0: expected a window of at least 1 token",
            ),
            (
                "[rollout.context]\nwindow_tokens = 4096\nfold = \"notes\"\nnotes_path = \"../x\"",
                "`rollout.context.notes_path` = \"../x\"",
            ),
            (
                "[rollout.context]\nwindow_tokens = 4096\nfold = \"notes\"\nfollow_curriculum = true\nmemory_tokens = 300",
                "`curriculum.context_stages` = 1024 (from level 1): expected with [rollout.context] follow_curriculum, a window with room for the notes (300 tokens) and a whole turn (max_new_tokens = 256) in half the window (512)",
            ),
            (
                "[rollout.context]\nwindow_tokens = 4096\nfold = \"fold_it\"",
                "unknown variant `fold_it`, expected one of `none`, `drop_tool_output`, `notes`, `summary`",
            ),
            (
                "[rollout]\nactor_timeout_s = 2\npolicy_poll_interval_ms = 1000",
                "`rollout.actor_timeout_s` = 2: expected at least 3 policy polls (1000 ms each",
            ),
            (
                "[tasks]\nfamilies = [\"my-pack\"]",
                "`tasks.families` = my-pack: unknown task family `my-pack`; known: hops, search, shell, keychain, ledger, needles, recall, pyfix, pydata (a task pack is known by its [pack] name once its file is in [tasks] packs)",
            ),
            (
                "[sft]\nlevels = { mypack = [1] }",
                "`sft.levels.mypack` = mypack: unknown task family `mypack`",
            ),
            (
                "[sft]\nlate_levels = { hopz = [3] }",
                "`sft.late_levels.hopz` = hopz: unknown task family",
            ),
            (
                "[tasks]\nmax_levels = { hops = 99 }",
                "tasks.max_levels.hops",
            ),
            ("listen = \"nowhere\"", "listen"),
            ("device = \"tpu\"", "device"),
            ("[model]\noverrides = { hidden_size = -1 }", "hidden_size"),
            ("[metrics]\nprometheus = \"x\"", "metrics.prometheus"),
            (
                "[model]\noverrides = { hidden_size = 1.5 }",
                "model.overrides.hidden_size",
            ),
            ("[model]\noverrides = { vocab_size = 100 }", "vocab_size"),
            (
                "[model]\noverrides = { max_position_embeddings = 64 }",
                "max_position_embeddings",
            ),
            ("run_name = \"..\"", "run_name"),
            // Sizes past what libtorch can hold: refused with the field, never a panic.
            (
                "[model]\noverrides = { vocab_size = 4611686018427387904 }",
                "vocab_size = 4611686018427387904",
            ),
            (
                "[model]\noverrides = { hidden_size = 4611686018427387904 }",
                "hidden_size = 4611686018427387904",
            ),
            (
                "[model]\noverrides = { n_routed_experts = 9223372036854775807 }",
                "n_routed_experts = 9223372036854775807",
            ),
            (
                "[model]\noverrides = { first_k_dense_replace = 1, intermediate_size = 4611686018427387904 }",
                "intermediate_size = 4611686018427387904",
            ),
            (
                "[model]\noverrides = { num_hidden_layers = 9223372036854775807 }",
                "num_hidden_layers = 9223372036854775807",
            ),
        ] {
            let err = LearnerConfig::from_toml(text).unwrap_err().to_string();
            assert!(
                err.contains(field),
                "{text:?} gave {err:?}, not naming {field}"
            );
        }
    }
}
