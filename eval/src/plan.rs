//! What to evaluate ([`EvalOptions`]) and the checked evaluation ([`Plan`]): every option is
//! validated, the task family and the policy are loaded, and nothing has touched a store yet.
//!
//! Whatever can be refused is refused by [`Plan::new`], so a caller that builds its sandbox
//! and opens its store only after it cannot create a store for an evaluation that was never
//! going to run. Messages name the `corvid eval` flags that set each option.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use corvid_episode::EpisodeFormat;
use corvid_proto::{ContextFold, SamplingParams};
use corvid_tasks::TaskFamily;

use crate::policy::{EvalPolicy, PolicySource};

/// Everything an evaluation is run with.
///
/// Held-out seeds: the learner draws training seeds at random from the whole `u64` range;
/// evaluation uses the consecutive seeds `seed, seed+1, …` (`corvid eval` defaults to 2^62),
/// so the two coincide with negligible probability and every evaluation of a given `seed`
/// sees the same instances (stages of one run are compared on identical tasks).
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// The weights to evaluate.
    pub policy: PolicySource,
    /// The tool-call syntax of a policy in a model's own format (`hermes`, ...); default the
    /// model family's. A policy folder without a tokenizer is in the byte layout.
    pub tool_call_format: Option<String>,
    /// Task family (built-in) or the name of the family `pack` defines.
    pub family: String,
    /// A task pack file providing the family.
    pub pack: Option<PathBuf>,
    /// Levels `(first, last)`, inclusive.
    pub levels: (u32, u32),
    /// Task instances per level.
    pub episodes: usize,
    /// Samples per instance, for pass@k and pass^k (above 1 it needs a temperature above 0).
    pub k: u32,
    /// Sampling temperature (0 = greedy).
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Most tokens per turn.
    pub max_new_tokens: u32,
    /// First held-out seed.
    pub seed: u64,
    /// Episodes decoded at once.
    pub concurrency: usize,
    /// libtorch intra-op threads (0: libtorch's default).
    pub threads: i32,
    /// Prefix of the stored trajectory ids (`None`: `eval-<unix seconds>`).
    pub label: Option<String>,
    /// Stage name recorded in the result (`random`, `sft`, `rl`, …).
    pub stage: String,
    /// Print one line per level to stderr as it finishes.
    pub progress: bool,
    /// The window each episode runs in and its fold (`None`: each task's own budget, no
    /// fold), as `[rollout.context]` gives actors.
    pub context: Option<ContextFold>,
}

/// An evaluation whose options, task family and policy have all been checked; nothing has
/// touched a store yet. [`Plan::run`](crate::Plan::run) runs it.
pub struct Plan {
    pub(crate) opts: EvalOptions,
    pub(crate) family: Box<dyn TaskFamily>,
    pub(crate) policy: EvalPolicy,
    /// The label episodes are stored under (the option, or its default).
    pub(crate) label: String,
    /// Sampling of every episode; each episode's seed is set from its instance and sample.
    pub(crate) sampling: SamplingParams,
    /// How the policy's episodes become ids: its folder's own tokenizer, or the byte layout.
    pub(crate) format: EpisodeFormat,
}

impl Plan {
    /// Checks every option, loads the task family and the policy (setting libtorch's thread
    /// count first when `threads > 0`).
    pub fn new(opts: EvalOptions) -> Result<Self> {
        let sampling = check_sampling(&opts)?;
        let family = load_family(&opts)?;
        let label = check_label(&opts, family.as_ref())?;
        if opts.threads > 0 {
            tch::set_num_threads(opts.threads);
        }
        let format = match &opts.policy {
            PolicySource::Checkpoint { dir, .. } => {
                EpisodeFormat::for_model_folder(dir, opts.tool_call_format.as_deref())
                    .with_context(|| format!("the episode format of {}", dir.display()))?
            }
            PolicySource::RandomInit { .. } => EpisodeFormat::default(),
        };
        let policy = EvalPolicy::load(&opts.policy)?;
        let vocab = policy.loaded.model().config().vocab_size;
        if vocab < i64::from(format.vocab_size()) {
            bail!(
                "the policy's vocabulary ({vocab} ids) is smaller than its episode format's ({} ids)",
                format.vocab_size()
            );
        }
        Ok(Self {
            opts,
            family,
            policy,
            label,
            sampling,
            format,
        })
    }

    /// The label this evaluation stores its episodes under.
    pub fn label(&self) -> &str {
        &self.label
    }
}

/// Checks the counts and the sampling options; the sampling every episode starts from.
fn check_sampling(opts: &EvalOptions) -> Result<SamplingParams> {
    if opts.episodes == 0 || opts.k == 0 {
        bail!("--episodes and --k must be at least 1");
    }
    if opts.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    if opts.threads < 0 {
        bail!(
            "--threads must be >= 0 (0: libtorch's default), got {}",
            opts.threads
        );
    }
    if opts.max_new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    if let Some((field, value, why)) = opts
        .context
        .as_ref()
        .and_then(|c| c.unfit(opts.max_new_tokens))
    {
        bail!("--{} {value}: expected {why}", field.replace('_', "-"));
    }
    let sampling = SamplingParams {
        temperature: opts.temperature,
        top_p: opts.top_p,
        max_new_tokens: opts.max_new_tokens,
        seed: 0,
    };
    sampling
        .validate()
        .context("--temperature must be finite and >= 0, --top-p in (0, 1]")?;
    // Temperature 0 decodes greedily (the sampler takes the most likely token): the k samples
    // of an instance would be one episode k times, and pass@k = pass^k = the success rate.
    if opts.k > 1 && opts.temperature == 0.0 {
        let k = opts.k;
        bail!(
            "--k {k} draws {k} samples of each instance, but --temperature 0 (the default) decodes \
             greedily, so the {k} samples would be identical and pass@{k} and pass^{k} would only \
             repeat the success rate; pass --temperature above 0 (for example --temperature 1) \
             with --k above 1, or use --k 1"
        );
    }
    Ok(sampling)
}

/// The task family (from the pack when one is given), checked to have the levels asked for.
fn load_family(opts: &EvalOptions) -> Result<Box<dyn TaskFamily>> {
    let family: Box<dyn TaskFamily> = match &opts.pack {
        Some(p) => Box::new(
            corvid_tasks::load_pack(p).with_context(|| format!("loading {}", p.display()))?,
        ),
        None => corvid_tasks::builtin_family(&opts.family).with_context(|| {
            format!(
                "--family {} (a task pack's family needs its file: --pack FILE)",
                opts.family
            )
        })?,
    };
    if family.name() != opts.family {
        bail!(
            "the pack {} defines family {:?}, not {:?}",
            opts.pack
                .as_deref()
                .map(Path::display)
                .map(|d| d.to_string())
                .unwrap_or_default(),
            family.name(),
            opts.family
        );
    }
    let (_, hi) = opts.levels;
    if hi > family.levels() {
        bail!(
            "family {} has levels 1..={}, not up to {hi}",
            family.name(),
            family.levels()
        );
    }
    Ok(family)
}

/// The label (the option, or `eval-<unix seconds>`), checked to make valid trajectory ids.
fn check_label(opts: &EvalOptions, family: &dyn TaskFamily) -> Result<String> {
    let label = opts
        .label
        .clone()
        .unwrap_or_else(|| format!("eval-{}", corvid_store::now_unix_ms() / 1000));
    // The longest id this evaluation stores must be a valid trajectory id.
    let (_, hi) = opts.levels;
    let last_id = format!(
        "{label}.{}.L{hi}.s{}.k{}",
        family.name(),
        opts.seed.wrapping_add(opts.episodes as u64 - 1),
        opts.k - 1
    );
    corvid_proto::validate_trajectory_id(&last_id).with_context(|| {
        format!("--label {label:?} makes trajectory ids like {last_id:?}, which are invalid")
    })?;
    Ok(label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{checkpoint_at, evaluate, options, random_checkpoint, random_l1};

    /// What a refusal names, and the change to the options that causes it.
    type Case = (&'static str, fn(&mut EvalOptions));

    fn refusal(opts: EvalOptions) -> String {
        match Plan::new(opts) {
            Ok(_) => panic!("planned"),
            Err(e) => format!("{e:#}"),
        }
    }

    /// Each case's change to `base` is refused by a message that names what the case says.
    fn assert_refused(base: EvalOptions, cases: &[Case]) {
        for (names, set) in cases {
            let mut opts = base.clone();
            set(&mut opts);
            let err = refusal(opts.clone());
            assert!(err.contains(names), "{opts:?}: {err}");
        }
    }

    #[test]
    fn sampling_options_and_labels_that_cannot_be_stored_are_refused() {
        let cases: [Case; 7] = [
            ("--top-p", |o| o.top_p = f32::NAN),
            ("--top-p", |o| o.top_p = 0.0),
            ("--temperature", |o| o.temperature = -1.0),
            ("--temperature", |o| o.temperature = f32::INFINITY),
            ("--max-new-tokens", |o| o.max_new_tokens = 0),
            ("--label", |o| o.label = Some("bad label".into())),
            ("--label", |o| o.label = Some("x/y".into())),
        ];
        assert_refused(random_l1(), &cases);
    }

    #[test]
    fn counts_families_levels_and_checkpoints_that_cannot_run_are_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let ck = random_checkpoint(&dir.path().join("ck"));
        let cases: [Case; 7] = [
            ("--episodes", |o| o.episodes = 0),
            ("--k", |o| o.k = 0),
            ("--concurrency", |o| o.concurrency = 0),
            (
                "unknown task family `my-pack`; known: hops, search, shell, keychain, ledger, needles, recall, pyfix, pydata",
                |o| o.family = "my-pack".into(),
            ),
            ("--pack FILE", |o| o.family = "my-pack".into()),
            ("levels", |o| o.levels = (1, 99)),
            ("not a checkpoint folder", |o| {
                o.policy = checkpoint_at(Path::new("/nonexistent/ck"))
            }),
        ];
        assert_refused(options(checkpoint_at(&ck)), &cases);
    }

    #[test]
    fn several_greedy_samples_per_instance_are_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = dir.path().join("store");
        let opts = |k: u32, temperature: f32| EvalOptions {
            k,
            temperature,
            max_new_tokens: 4,
            ..random_l1()
        };
        for (k, temperature) in [(4, 0.0), (2, 0.0)] {
            let err = refusal(opts(k, temperature));
            assert!(
                err.contains("--temperature") && err.contains("identical"),
                "k {k}: {err}"
            );
        }
        // k = 1 stays greedy, and k > 1 runs with a temperature.
        evaluate(opts(2, 1.0), &store).expect("evaluates");
    }
}
