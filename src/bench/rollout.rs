//! `corvid bench rollout`: actor rollout throughput at several concurrencies.
//!
//! One process, the tiny model with random weights, real task instances in the real
//! sandbox. For each concurrency N the engine runs N·`--rounds` episodes with N at once and
//! reports episodes/s, generated tokens/s and the sandbox's share of episode time. The
//! baseline is the same 32 episodes (same seeds) decoded one at a time: the ratio of
//! generated tokens/s is the batched-decoding speed-up.
//!
//! A random policy rarely writes a well-formed call, so its tools barely run. The
//! `oracle_forced` runs force the oracle's calls token by token through the same engine
//! (each forced token still goes through the model's forward), so the sandbox does real
//! work and `sandbox_time_fraction` means something.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use corvid_actor::{run_episodes, EngineConfig, EpisodeSpec, LoadedPolicy, ScriptedTokens};
use corvid_episode::EpisodeFormat;
use corvid_model::ModelConfig;
use corvid_proto::{ContextFold, Fold, SamplingParams};
use corvid_sandbox::Sandbox;
use corvid_tasks::{TaskEnv, TaskInstance};
use serde::Serialize;

/// actor rollout throughput at several concurrencies.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid bench rollout --json
  corvid bench rollout --concurrency 1,8,32 --max-new-tokens 64 --max-turns 4 --threads 1 --json")]
pub struct RolloutBenchArgs {
    /// Concurrencies to measure; the batched-decoding speed-up uses the largest.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 8, 32])]
    concurrency: Vec<usize>,
    /// Episodes per run = concurrency × rounds.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Tokens per turn for the random policy.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: u32,
    /// Turns per episode.
    #[arg(long, default_value_t = 4)]
    max_turns: u32,
    /// Task family and level.
    #[arg(long, default_value = "hops")]
    family: String,
    /// Task level.
    #[arg(long, default_value_t = 2)]
    level: u32,
    /// libtorch intra-op threads. 1 by default: on a shared CPU, OpenMP threads that
    /// spin-wait for each other made decoding ~20x slower in our measurements.
    #[arg(long, default_value_t = 1)]
    threads: i32,
    /// Family of the oracle-forced runs (shell: its calls run wasm commands).
    #[arg(long, default_value = "shell")]
    oracle_family: String,
    /// Skip the oracle-forced runs.
    #[arg(long)]
    no_oracle: bool,
    /// Also measure the cost of recording routes (`[rollout] record_routes`): the largest
    /// concurrency three times with and three times without, alternating;
    /// `record_routes_ratio` is the median episodes/s with over without.
    #[arg(long)]
    record_routes: bool,
    /// Also measure the cost of context folding: the largest concurrency three times folding
    /// (`drop_tool_output` in a window of this many tokens) and three times in one window the
    /// episodes never fill, alternating; `fold_tokens_ratio` is the median generated tokens/s
    /// folding over not. 0: not measured.
    #[arg(long, default_value_t = 0)]
    fold_window: u32,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// One measured run.
#[derive(Debug, Clone, Serialize)]
struct Run {
    concurrency: usize,
    episodes: usize,
    wall_s: f64,
    episodes_per_s: f64,
    generated_tokens: u64,
    generated_tokens_per_s: f64,
    prefill_tokens: u64,
    /// Σ tool and checker time / Σ episode time.
    sandbox_time_fraction: f64,
    /// Mean rows per decode step.
    mean_decode_batch: f64,
    /// Share of wall time in model forwards.
    forward_fraction: f64,
    terminations: std::collections::BTreeMap<String, u64>,
    /// Context folds over the episodes (new segments opened).
    folds: usize,
}

fn specs(
    tasks: &[Arc<TaskInstance>],
    n: usize,
    sampling: SamplingParams,
    turns: u32,
) -> Vec<EpisodeSpec> {
    (0..n)
        .map(|i| {
            let mut s = EpisodeSpec::new(
                format!("bench-{i}"),
                tasks[i % tasks.len()].clone(),
                SamplingParams {
                    seed: 1000 + i as u64,
                    ..sampling
                },
            );
            s.max_turns = turns;
            s.context_budget = 4096;
            s
        })
        .collect()
}

fn measure(
    policy: &mut LoadedPolicy,
    env: &TaskEnv,
    specs: Vec<EpisodeSpec>,
    concurrency: usize,
    scripted: Option<ScriptedTokens>,
    record_routes: bool,
) -> Result<Run> {
    let episodes = specs.len();
    let cfg = EngineConfig {
        max_concurrency: concurrency,
        record_routes,
        ..EngineConfig::default()
    };
    let t0 = Instant::now();
    let (trajs, stats) = run_episodes(
        policy,
        env,
        specs,
        cfg,
        scripted.map(|s| Box::new(s) as Box<dyn corvid_actor::TokenChooser>),
    )?;
    let wall = t0.elapsed().as_secs_f64();
    anyhow::ensure!(
        trajs.len() == episodes,
        "{} of {episodes} episodes finished",
        trajs.len()
    );
    Ok(Run {
        concurrency,
        episodes,
        wall_s: wall,
        episodes_per_s: episodes as f64 / wall,
        generated_tokens: stats.generated_tokens,
        generated_tokens_per_s: stats.generated_tokens as f64 / wall,
        prefill_tokens: stats.prefill_tokens,
        sandbox_time_fraction: if stats.episode_s > 0.0 {
            stats.tool_s / stats.episode_s
        } else {
            0.0
        },
        mean_decode_batch: if stats.decode_steps > 0 {
            stats.decode_rows as f64 / stats.decode_steps as f64
        } else {
            0.0
        },
        forward_fraction: stats.forward_s / wall,
        terminations: stats.terminations,
        folds: trajs
            .iter()
            .map(|t| t.segments().len().saturating_sub(1))
            .sum(),
    })
}

/// The oracle's calls for each episode, as token turns.
fn oracle_script(specs: &[EpisodeSpec]) -> (ScriptedTokens, u32) {
    let format = EpisodeFormat::default();
    let mut script = ScriptedTokens::new();
    let mut longest = 1;
    for s in specs {
        let turns: Vec<Vec<u32>> = s
            .task
            .oracle
            .steps
            .iter()
            .cloned()
            .chain(std::iter::once(s.task.oracle.answer_step()))
            .map(|c| format.call_ids(&c.name, &c.arguments))
            .collect::<Result<_, _>>()
            .expect("the byte layout lays out every call");
        longest = longest.max(turns.iter().map(Vec::len).max().unwrap_or(1) as u32);
        script = script.with_episode(s.trajectory_id.clone(), turns);
    }
    (script, longest)
}

/// Runs the benchmark.
pub fn run(a: RolloutBenchArgs) -> Result<ExitCode> {
    anyhow::ensure!(
        !a.concurrency.is_empty(),
        "--concurrency needs at least one value"
    );
    anyhow::ensure!(a.rounds >= 1, "--rounds must be at least 1");
    tch::set_num_threads(a.threads);
    tch::manual_seed(0);
    let cfg = ModelConfig::tiny();
    let mut policy = LoadedPolicy::random(&cfg, tch::Device::Cpu)?;
    policy.set_version(1);
    let env = TaskEnv::new(
        Sandbox::builder()
            .search_tool(true)
            .build()
            .context("building the sandbox")?,
    );
    let family = corvid_tasks::builtin_family(&a.family)?;
    let tasks: Vec<Arc<TaskInstance>> = (0..8)
        .map(|s| family.instance(a.level, s).map(Arc::new))
        .collect::<Result<_, _>>()?;
    let sampling = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        max_new_tokens: a.max_new_tokens,
        seed: 0,
    };
    // Warm-up (allocator, sandbox module cache).
    measure(
        &mut policy,
        &env,
        specs(&tasks, 2, sampling, 1),
        2,
        None,
        false,
    )?;

    let mut random = Vec::new();
    for &c in &a.concurrency {
        let r = measure(
            &mut policy,
            &env,
            specs(&tasks, c * a.rounds, sampling, a.max_turns),
            c,
            None,
            false,
        )?;
        eprintln!(
            "random c={c}: {:.2} episodes/s, {:.0} generated tokens/s, sandbox {:.3}",
            r.episodes_per_s, r.generated_tokens_per_s, r.sandbox_time_fraction
        );
        random.push(r);
    }
    let top = *a.concurrency.iter().max().unwrap_or(&1);
    let batched = random
        .iter()
        .find(|r| r.concurrency == top)
        .cloned()
        .context("largest concurrency run")?;
    let one_at_a_time = measure(
        &mut policy,
        &env,
        specs(&tasks, top * a.rounds, sampling, a.max_turns),
        1,
        None,
        false,
    )?;
    let speedup = batched.generated_tokens_per_s / one_at_a_time.generated_tokens_per_s;
    eprintln!(
        "one at a time ({} episodes): {:.0} generated tokens/s; batched speed-up {speedup:.2}",
        one_at_a_time.episodes, one_at_a_time.generated_tokens_per_s
    );

    // Folding against one window, alternating, at the largest concurrency.
    let fold = if a.fold_window > 0 {
        let (mut on, mut off, mut folds, mut prefill) = (Vec::new(), Vec::new(), 0, [0u64; 2]);
        for _ in 0..3 {
            for folding in [false, true] {
                let mut specs = specs(&tasks, top * a.rounds, sampling, a.max_turns);
                for s in &mut specs {
                    s.context_budget = 1 << 20;
                    s.context = Some(ContextFold {
                        window_tokens: if folding { a.fold_window } else { 1 << 20 },
                        fold: Fold::DropToolOutput,
                        memory_tokens: 1,
                        notes_path: "notes.md".into(),
                    });
                }
                let r = measure(&mut policy, &env, specs, top, None, false)?;
                prefill[usize::from(folding)] += r.prefill_tokens;
                if folding {
                    folds += r.folds;
                    on.push(r.generated_tokens_per_s);
                } else {
                    off.push(r.generated_tokens_per_s);
                }
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let ratio = median(&mut on) / median(&mut off);
        let prefill_ratio = prefill[1] as f64 / prefill[0].max(1) as f64;
        eprintln!(
            "folding in a {}-token window: {ratio:.3}x the generated tokens/s of one window ({folds} folds over 3 runs, {prefill_ratio:.2}x the prefill tokens; on {on:?}, off {off:?})",
            a.fold_window
        );
        Some(serde_json::json!({
            "window_tokens": a.fold_window,
            "tokens_ratio": ratio,
            "prefill_ratio": prefill_ratio,
            "folds": folds,
        }))
    } else {
        None
    };

    // Recording routes on against off, alternating, at the largest concurrency.
    let record_routes_ratio = if a.record_routes {
        let (mut on, mut off) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            for (record, runs) in [(false, &mut off), (true, &mut on)] {
                let r = measure(
                    &mut policy,
                    &env,
                    specs(&tasks, top * a.rounds, sampling, a.max_turns),
                    top,
                    None,
                    record,
                )?;
                runs.push(r.episodes_per_s);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let ratio = median(&mut on) / median(&mut off);
        eprintln!("recording routes: {ratio:.3}x the episodes/s without (on {on:?}, off {off:?})");
        Some(ratio)
    } else {
        None
    };

    let mut oracle = Vec::new();
    if !a.no_oracle {
        let of = corvid_tasks::builtin_family(&a.oracle_family)?;
        let otasks: Vec<Arc<TaskInstance>> = (0..8)
            .map(|s| of.instance(a.level, s).map(Arc::new))
            .collect::<Result<_, _>>()?;
        for &c in &a.concurrency {
            let probe = specs(&otasks, c * a.rounds, sampling, 64);
            let (script, longest) = oracle_script(&probe);
            let s = SamplingParams {
                max_new_tokens: longest + 8,
                ..sampling
            };
            let r = measure(
                &mut policy,
                &env,
                specs(&otasks, c * a.rounds, s, 64),
                c,
                Some(script),
                false,
            )?;
            eprintln!(
                "oracle-forced c={c}: {:.2} episodes/s, sandbox {:.3}",
                r.episodes_per_s, r.sandbox_time_fraction
            );
            oracle.push(r);
        }
    }
    let by_c = |runs: &[Run], f: fn(&Run) -> f64| -> serde_json::Value {
        runs.iter()
            .map(|r| (r.concurrency.to_string(), serde_json::json!(f(r))))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let load_average = std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| {
        s.split_whitespace()
            .next()
            .and_then(|x| x.parse::<f64>().ok())
    });
    let report = serde_json::json!({
        "model": "tiny",
        "record_routes_ratio": record_routes_ratio,
        "fold": fold,
        "load_average_1m_at_end": load_average,
        "weights": "random",
        "threads": a.threads,
        "family": a.family,
        "level": a.level,
        "max_new_tokens": a.max_new_tokens,
        "max_turns": a.max_turns,
        "episodes_per_s": by_c(&random, |r| r.episodes_per_s),
        "generated_tokens_per_s": by_c(&random, |r| r.generated_tokens_per_s),
        "sandbox_time_fraction": by_c(&random, |r| r.sandbox_time_fraction),
        "batched_decode_speedup": {
            "concurrency": top,
            "speedup": speedup,
            "batched_generated_tokens_per_s": batched.generated_tokens_per_s,
            "one_at_a_time_generated_tokens_per_s": one_at_a_time.generated_tokens_per_s,
        },
        "runs": random,
        "one_at_a_time": one_at_a_time,
        "oracle_forced": {
            "family": a.oracle_family,
            "episodes_per_s": by_c(&oracle, |r| r.episodes_per_s),
            "sandbox_time_fraction": by_c(&oracle, |r| r.sandbox_time_fraction),
            "runs": oracle,
        },
    });
    if a.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(ExitCode::SUCCESS)
}
