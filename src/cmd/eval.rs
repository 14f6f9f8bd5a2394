//! `corvid eval`: the command's arguments, the [`EvalOptions`] they stand for, and the
//! printed table. The evaluator itself (the plan, the policy and its fingerprint, store reuse,
//! the per-level figures) is the `corvid-eval` crate; `corvid run` evaluates its stages
//! through [`evaluate_into`].
//!
//! Held-out seeds: the learner draws training seeds at random from the whole `u64` range;
//! evaluation uses the consecutive seeds `--seed, --seed+1, …` (default 2^62), so the two
//! coincide with negligible probability and every evaluation of a given `--seed` sees the
//! same instances (stages of one run are compared on identical tasks).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use corvid_eval::{EvalOptions, Plan, PolicySource, Position, Tally};
use corvid_proto::{ContextFold, Fold};
use corvid_store::TrajectoryStore;

pub use corvid_eval::{open_store, EvalResult};
/// The parts of an [`EvalResult`], which `corvid run`'s tests build by hand.
#[cfg(test)]
pub use corvid_eval::{FamilyResult, LevelResult, TokenBucket};

/// Evaluate a checkpoint on held-out tasks.
#[derive(Args, Debug, Clone)]
#[command(after_help = "Examples:
  corvid eval --checkpoint runs/demo/ref --family hops --levels 1..4 --episodes 200
  corvid eval --checkpoint runs/demo/ckpt/00000012 --family hops --levels 1..6 --episodes 100 --k 4 --temperature 1 --json
  corvid eval --random-init --model-preset tiny --family hops --levels 1..2 --episodes 50

A checkpoint is any folder holding model.safetensors and config.json: a run checkpoint
(runs/<name>/ckpt/<n>), the SFT reference (runs/<name>/ref), `corvid model` output, or a
Hugging Face checkpoint (DeepSeek-V3, Qwen3-MoE, Qwen3), evaluated in its own tokenizer and
chat template when it holds a tokenizer.json.
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
    /// Tool-call syntax of a checkpoint in its model's own format (hermes, deepseek_v3,
    /// deepseek_v31, kimi_k2, corvid); default the model family's. A checkpoint whose folder (or its hf/)
    /// holds a tokenizer.json is evaluated in that tokenizer and chat template.
    #[arg(long, value_name = "NAME")]
    pub tool_call_format: Option<String>,
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
    /// Run each episode in a window of this many tokens (0: each task's own context budget,
    /// no window), as `[rollout.context] window_tokens` does for actors.
    #[arg(long, default_value_t = 0)]
    pub window_tokens: u32,
    /// What an episode does when its next turn would not fit the window: none (it ends as
    /// context_full), drop_tool_output, notes or summary (docs/tasks.md, folding).
    #[arg(long, default_value = "none", value_parser = parse_fold)]
    pub fold: Fold,
    /// Most tokens of the notes or summary a fold carries.
    #[arg(long, default_value_t = 512)]
    pub memory_tokens: u32,
    /// The workspace file a notes fold carries.
    #[arg(long, default_value = "notes.md")]
    pub notes_path: String,
}

fn parse_fold(s: &str) -> Result<Fold, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("--fold must be none, drop_tool_output, notes or summary, got {s:?}"))
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

impl EvalArgs {
    /// The evaluator's options for these arguments. A run checkpoint's policy version is read
    /// from its `state.json` here; a policy folder (`ref/`, an export) has none and is
    /// recorded as version 0.
    pub fn options(&self) -> Result<EvalOptions> {
        let policy = if self.random_init {
            PolicySource::RandomInit {
                preset: self.model_preset.clone(),
                config: self.model_config.clone(),
            }
        } else {
            let dir = self
                .checkpoint
                .clone()
                .context("--checkpoint or --random-init is required")?;
            let policy_version = corvid_learner::checkpoint::read_state(&dir)
                .with_context(|| format!("reading the state of checkpoint {}", dir.display()))?
                .map_or(0, |s| s.policy_version);
            PolicySource::Checkpoint {
                dir,
                policy_version,
            }
        };
        Ok(EvalOptions {
            policy,
            tool_call_format: self.tool_call_format.clone(),
            family: self.family.clone(),
            pack: self.pack.clone(),
            levels: self.levels,
            episodes: self.episodes,
            k: self.k,
            temperature: self.temperature,
            top_p: self.top_p,
            max_new_tokens: self.max_new_tokens,
            seed: self.seed,
            concurrency: self.concurrency,
            threads: self.threads,
            label: self.label.clone(),
            stage: self.stage.clone(),
            progress: !self.json,
            context: match (self.window_tokens, self.fold) {
                (0, Fold::None) => None,
                (0, fold) => bail!(
                    "--fold {} needs a window: give --window-tokens",
                    fold.as_str()
                ),
                (window_tokens, fold) => Some(ContextFold {
                    window_tokens,
                    fold,
                    memory_tokens: self.memory_tokens,
                    notes_path: self.notes_path.clone(),
                }),
            },
        })
    }

    /// Checks the arguments and loads the family and the policy (nothing is stored yet).
    fn plan(&self) -> Result<Plan> {
        if let Some(out) = &self.out {
            if out.is_dir() {
                bail!("--out {} is a folder; give a file path", out.display());
            }
        }
        Plan::new(self.options()?)
    }
}

/// Runs the evaluation described by `args` and returns its result, storing every episode in
/// `args.store`. Every argument and the policy are checked before the store is opened (or
/// created).
pub fn evaluate(args: &EvalArgs) -> Result<EvalResult> {
    let plan = args.plan()?;
    let env = super::task_env()?;
    let store = open_store(&args.store)?;
    plan.run(&env, &store)
}

/// [`evaluate`] into a store that is already open, so several evaluations can run at once
/// in one process (`corvid run` evaluates its stages two at a time) and share it. Every
/// argument and the policy are checked before the store is read or written.
pub fn evaluate_into(args: &EvalArgs, store: Arc<TrajectoryStore>) -> Result<EvalResult> {
    let plan = args.plan()?;
    plan.run(&super::task_env()?, &store)
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
        // Success by total episode tokens over the levels, and the effective length.
        let buckets: Vec<String> = f
            .by_tokens
            .iter()
            .map(|b| {
                let rate = b.successes as f64 / b.scored.max(1) as f64;
                format!("<{} {:.0}% ({})", b.up_to, 100.0 * rate, b.scored)
            })
            .collect();
        out += &format!(
            "{} by episode tokens: {}; effective length {}\n",
            f.family,
            buckets.join(", "),
            f.effective_length
                .map_or_else(|| "-".into(), |n| format!("{n} tokens"))
        );
        // Success by where a needed fact was first read, and by distractor density.
        let tally = |t: &Tally| {
            let rate = t.successes as f64 / t.scored.max(1) as f64;
            format!("{:.0}% ({})", 100.0 * rate, t.scored)
        };
        let positions: Vec<String> = f
            .by_position
            .iter()
            .map(|(p, t)| format!("{} {}", position_name(*p), tally(t)))
            .collect();
        if !positions.is_empty() {
            out += &format!("{} by fact position: {}\n", f.family, positions.join(", "));
        }
        let densities: Vec<String> = f
            .by_density
            .iter()
            .map(|b| match b.up_to {
                0.0 => format!("none {}", tally(&b.tally)),
                up_to => format!("<{up_to} {}", tally(&b.tally)),
            })
            .collect();
        if !densities.is_empty() {
            out += &format!(
                "{} by distractors per fact: {}\n",
                f.family,
                densities.join(", ")
            );
        }
    }
    out
}

/// How the table names a fact position (as the JSON does).
fn position_name(p: Position) -> &'static str {
    match p {
        Position::Beginning => "beginning",
        Position::Middle => "middle",
        Position::End => "end",
        Position::NeverRead => "never read",
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

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
    fn the_table_shows_every_figure_of_an_evaluation() {
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
        assert_eq!((r.label.as_str(), r.k, r.episodes_per_level), ("t", 2, 2));
        let levels = &r.families[0].levels;
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
        assert_eq!(cell("hops/1", "episodes"), "4", "2 instances x k=2");
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
    }

    #[test]
    fn every_argument_is_checked_before_the_store_is_opened() {
        let dir = tempfile::tempdir().expect("tmp");
        // A folder that is not a store (a run folder, say), with a file in it.
        let folder = dir.path().join("run");
        std::fs::create_dir_all(&folder).expect("mkdir");
        std::fs::write(folder.join("notes.txt"), "mine").expect("write");
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "not a store").expect("write");
        let fresh = dir.path().join("new").join("store");
        let eval = |store: &Path, extra: &[&str]| {
            let mut argv = vec![
                "--random-init",
                "--family",
                "hops",
                "--levels",
                "1",
                "--max-new-tokens",
                "4",
                "--store",
                store.to_str().expect("utf8"),
            ];
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
            (&["--episodes", "0"][..], "--episodes"),
            (&["--top-p", "NaN"][..], "--top-p"),
            (&["--label", "x/y"][..], "--label"),
            (&["--out", "/"][..], "--out"),
        ] {
            for store in [&folder, &fresh] {
                let err = eval(store, extra);
                assert!(err.contains(names), "{extra:?}: {err}");
                untouched(&format!("{extra:?}"));
            }
        }
        // A run checkpoint's missing files are named before any store is opened.
        let err = format!(
            "{:#}",
            evaluate(&args(&[
                "--checkpoint",
                "/nonexistent/ck",
                "--family",
                "hops",
                "--store",
                fresh.to_str().expect("utf8"),
            ]))
            .expect_err("refused")
        );
        assert!(err.contains("not a checkpoint folder"), "{err}");
        untouched("a missing checkpoint");
        // A plain file or a folder of other files is refused as a store, and left as it was.
        let err = eval(&plain, &[]);
        assert!(
            err.contains("is a file") && !err.contains("another process"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(&plain).expect("read"),
            "not a store"
        );
        let err = eval(&folder, &[]);
        assert!(err.contains("no trajectory store"), "{err}");
        untouched("a folder that holds no store");
        // A checkpoint brings its own model config: a preset beside it is refused by clap.
        let mut cli = vec!["eval", "--checkpoint", "ck", "--family", "hops"];
        cli.extend(["--model-preset", "huge"]);
        assert!(Cli::try_parse_from(cli).is_err());
    }
}
