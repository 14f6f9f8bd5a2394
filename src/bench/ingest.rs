//! `corvid bench ingest`: trajectory ingest over loopback gRPC against raw sled.
//!
//! Both paths write the same synthetic trajectory (the same step bytes) into a fresh store
//! and end with one flush:
//! - **gRPC path**: client stream → tonic server → the learner's one check of each step
//!   (its invariants, routes, vocabulary) → `TrajectoryStore` (record, the step bytes as
//!   received, indexes, transaction) → flush → ack;
//! - **baseline**: encode each step and `insert` it straight into a sled tree, one value per
//!   step under its (id, seq) key, routes included (the store cuts a step over 8 KiB into
//!   pieces, and puts routes of 32 bytes per token or more in a route file, fsynced before
//!   sled's flush).
//!
//! The paths alternate `--repeat` times on fresh stores and the medians are compared;
//! `*_cpu_seconds` is the process's CPU time over a run (median; every thread, sled's
//! background threads of earlier runs included), which says how much of the machine's cores
//! the client and server share.
//! `peak_rss_delta_mb` is the largest growth of this process's peak RSS (client and server
//! together) over its RSS before a gRPC run: neither side holds the trajectory whole, so it
//! is bounded by sled's memory (`--store-cache-mb`), the HTTP/2 windows and the steps
//! waiting to be written; routes in a route file pass through the kernel's page cache.
//!
//! `--routes LAYERSxKxEXPERTS` adds recorded routes of that shape to every step (both
//! paths), so the figures show what routing replay costs on the wire and in the store;
//! `route_bytes_per_token` is their measured size per token.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use corvid_learner::server::{serve, Admission, LearnerService};
use corvid_proto::client::{connect, trajectory_parts};
use corvid_proto::pb;
use corvid_proto::synthetic::{self, Shape};
use corvid_proto::RouteShape;
use corvid_store::TrajectoryStore;
use prost::Message;

/// Stream a synthetic trajectory over loopback gRPC into a fresh store, against raw sled.
#[derive(Args, Debug)]
pub struct IngestArgs {
    /// Tokens in the trajectory.
    #[arg(long, default_value_t = 1_000_000)]
    tokens: u64,
    /// Tokens per step (chunk).
    #[arg(long, default_value_t = 1000)]
    tokens_per_step: u32,
    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    json: bool,
    /// Keep the gRPC path's store here (must not exist yet) instead of a temporary directory.
    #[arg(long, value_name = "DIR")]
    keep: Option<std::path::PathBuf>,
    /// Recorded routes on every step, `LAYERSxKxEXPERTS` (MoE layers × experts per token ×
    /// routed experts), e.g. `58x8x256` for DeepSeek-V3's shape.
    #[arg(long, value_name = "LxKxE", value_parser = parse_routes)]
    routes: Option<RouteShape>,
    /// Runs of each path, alternating; the medians are reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// sled's page-cache budget for both paths, MiB (the learner's store uses 64).
    #[arg(long, default_value_t = corvid_store::DEFAULT_CACHE_BYTES >> 20)]
    store_cache_mb: u64,
}

/// `LxKxE` as a route shape.
fn parse_routes(s: &str) -> std::result::Result<RouteShape, String> {
    let parts: Vec<u32> = s
        .split('x')
        .map(|p| p.parse::<u32>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| format!("{s:?}: {e}; expected LAYERSxKxEXPERTS, e.g. 58x8x256"))?;
    let [moe_layers, experts_per_token, routed_experts] = parts[..] else {
        return Err(format!("{s:?}: expected LAYERSxKxEXPERTS, e.g. 58x8x256"));
    };
    let shape = RouteShape {
        moe_layers,
        experts_per_token,
        routed_experts,
    };
    shape.validate().map_err(|e| format!("{s:?}: {e}"))?;
    Ok(shape)
}

/// The synthetic trajectory's header and steps, with routes of `routes` when given.
fn trajectory(
    shape: Shape,
    routes: Option<RouteShape>,
) -> (
    corvid_proto::TrajectoryHeader,
    impl Iterator<Item = corvid_proto::Step> + Send + 'static,
) {
    let mut header = synthetic::header("bench", "bench", 1, 0);
    header.routes = routes;
    let pattern = routes.map(|r| synthetic::RoutePattern::new("bench", r));
    let steps = synthetic::steps("bench", shape)
        .enumerate()
        .map(move |(seq, s)| match &pattern {
            Some(p) => p.apply(seq as u64, s),
            None => s,
        });
    (header, steps)
}

/// The median of `xs` (not empty).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Runs the benchmark.
pub fn run(args: IngestArgs) -> Result<ExitCode> {
    anyhow::ensure!(
        args.tokens_per_step > 0,
        "--tokens-per-step must be positive"
    );
    anyhow::ensure!(args.repeat > 0, "--repeat must be positive");
    let shape = Shape {
        steps: args.tokens.div_ceil(u64::from(args.tokens_per_step)),
        tokens_per_step: args.tokens_per_step,
    };
    let cache_bytes = args.store_cache_mb << 20;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    if let Some(p) = &args.keep {
        anyhow::ensure!(!p.exists(), "--keep {}: already exists", p.display());
    }

    // The two paths alternate, each on a fresh store, and the medians are compared.
    let (mut grpc, mut raw) = (Vec::new(), Vec::new());
    let (mut bytes, mut route_bytes) = (0, 0);
    for i in 0..args.repeat {
        let grpc_store = match &args.keep {
            Some(p) if i == 0 => p.clone(),
            _ => dir.path().join(format!("grpc-{i}")),
        };
        grpc.push(rt.block_on(grpc_path(grpc_store, cache_bytes, shape, args.routes))?);
        let (run, b, r) = raw_sled(
            dir.path().join(format!("raw-{i}")),
            cache_bytes,
            shape,
            args.routes,
        )?;
        (bytes, route_bytes) = (b, r);
        raw.push(run);
    }
    let seconds = |runs: &[Run]| runs.iter().map(|r| r.seconds).collect::<Vec<_>>();
    let cpu = |runs: &[Run]| median(runs.iter().map(|r| r.cpu_seconds).collect());
    let (grpc_s, raw_s) = (median(seconds(&grpc)), median(seconds(&raw)));
    let peak_delta = grpc.iter().map(|r| r.peak_rss_delta).max().unwrap_or(0);

    let tokens = shape.tokens();
    let report = serde_json::json!({
        "tokens": tokens,
        "steps": shape.steps,
        "routes": args.routes.map(|r| format!("{}x{}x{}", r.moe_layers, r.experts_per_token, r.routed_experts)),
        "route_bytes_per_token": route_bytes as f64 / tokens as f64,
        "step_bytes": bytes,
        "store_cache_mb": args.store_cache_mb,
        "repeat": args.repeat,
        "grpc_seconds": grpc_s,
        "raw_sled_seconds": raw_s,
        "grpc_seconds_each": seconds(&grpc),
        "raw_sled_seconds_each": seconds(&raw),
        "grpc_cpu_seconds": cpu(&grpc),
        "raw_sled_cpu_seconds": cpu(&raw),
        "tokens_per_s": tokens as f64 / grpc_s,
        "raw_sled_tokens_per_s": tokens as f64 / raw_s,
        "ratio_vs_raw_sled": raw_s / grpc_s,
        "peak_rss_delta_mb": peak_delta as f64 / (1 << 20) as f64,
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "ingested {tokens} tokens in {grpc_s:.3} s over gRPC ({:.0} tokens/s, median of {}), {:.2}x raw sled, peak RSS +{:.1} MiB",
            tokens as f64 / grpc_s,
            args.repeat,
            raw_s / grpc_s,
            peak_delta as f64 / (1 << 20) as f64
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One run of a path.
struct Run {
    seconds: f64,
    /// CPU time of the whole process (client, server, sled's threads) over the run.
    cpu_seconds: f64,
    /// Growth of the process's peak RSS over its RSS before the run (gRPC path only).
    peak_rss_delta: u64,
}

async fn grpc_path(
    path: std::path::PathBuf,
    cache_bytes: u64,
    shape: Shape,
    routes: Option<RouteShape>,
) -> Result<Run> {
    const TOKEN: &str = "bench";
    let store = Arc::new(TrajectoryStore::open_with_cache(&path, cache_bytes)?);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // The learner's own checks at submit: synthetic token ids are below 50,000.
    let admission = Admission {
        vocab_size: 50_000,
        routes,
        require_routes: false,
    };
    let service = LearnerService::new(store).with_admission(admission);
    let server = tokio::spawn(serve(listener, service, TOKEN, async {
        let _ = stopped.await;
    }));
    let mut client = connect(&url, TOKEN).await?;

    super::reset_peak_rss();
    let before = super::rss_bytes().unwrap_or(0);
    let (header, steps) = trajectory(shape, routes);
    let (start, cpu) = (Instant::now(), super::cpu_seconds());
    let ack = client
        .submit_trajectory(trajectory_parts(
            header,
            steps,
            synthetic::footer("bench", shape),
        ))
        .await
        .context("streaming the trajectory")?
        .into_inner();
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = super::cpu_seconds() - cpu;
    let peak = super::peak_rss_bytes().unwrap_or(0);
    anyhow::ensure!(
        ack.tokens_stored == shape.tokens(),
        "ack reports {} tokens",
        ack.tokens_stored
    );
    let _ = stop.send(());
    server.await??;
    Ok(Run {
        seconds: elapsed,
        cpu_seconds: cpu,
        peak_rss_delta: peak.saturating_sub(before),
    })
}

/// The baseline; returns its run, the encoded step bytes it wrote and their route bytes.
fn raw_sled(
    path: std::path::PathBuf,
    cache_bytes: u64,
    shape: Shape,
    routes: Option<RouteShape>,
) -> Result<(Run, u64, u64)> {
    let db = sled::Config::new()
        .path(&path)
        .cache_capacity(cache_bytes)
        .open()?;
    let steps = db.open_tree("steps")?;
    let (mut bytes, mut route_bytes) = (0u64, 0u64);
    let (start, cpu) = (Instant::now(), super::cpu_seconds());
    for (seq, step) in trajectory(shape, routes).1.enumerate() {
        let mut key = b"bench\0".to_vec();
        key.extend_from_slice(&(seq as u64).to_be_bytes());
        route_bytes += step.routes.len() as u64;
        let value = pb::Step::from(step).encode_to_vec();
        bytes += value.len() as u64;
        steps.insert(key, value)?;
    }
    db.flush()?;
    let run = Run {
        seconds: start.elapsed().as_secs_f64(),
        cpu_seconds: super::cpu_seconds() - cpu,
        peak_rss_delta: 0,
    };
    Ok((run, bytes, route_bytes))
}
