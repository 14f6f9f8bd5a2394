//! `corvid actor`: roll out episodes against sandboxed tools and stream them to a learner.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use corvid_actor::{run_actor, ActorConfig, EngineConfig};

/// roll out episodes against sandboxed tools and stream them to a learner.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid actor --learner http://127.0.0.1:50051 --token-file runs/demo/token --concurrency 8
  corvid actor --learner http://10.0.0.5:50051 --token-file token --concurrency 32 --max-episodes 1000 --spool /var/corvid/spool-a

Every trajectory is journaled under the spool folder while it runs and deleted once the
learner acknowledges it; while the learner is unreachable finished trajectories wait there
and are submitted when it is back (also after an actor restart). Give each actor process
its own --spool. SIGTERM or ctrl-c lets in-flight episodes finish for --grace-s seconds,
then records the rest as abandoned.")]
pub struct ActorArgs {
    /// The learner's gRPC URL.
    #[arg(long, value_name = "URL")]
    learner: String,
    /// File holding the run's shared token (first line).
    #[arg(long, value_name = "FILE")]
    token_file: PathBuf,
    /// Episodes run at once (and decoded together).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Stop after this many episodes (default: until stopped).
    #[arg(long, value_name = "M")]
    max_episodes: Option<u64>,
    /// Spool folder for journals and unsent trajectories (default .corvid/spool/<name>).
    #[arg(long, value_name = "DIR")]
    spool: Option<PathBuf>,
    /// Name shown in the learner's logs.
    #[arg(long, default_value = "actor")]
    name: String,
    /// Device for the policy: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// libtorch intra-op threads (0: libtorch's default, one per core). 1 suits CPU actors
    /// sharing a machine: contending OpenMP threads slow small-batch decoding badly.
    #[arg(long, default_value_t = 1)]
    threads: i32,
    /// Seconds in-flight episodes may finish after SIGTERM before they are abandoned.
    #[arg(long, default_value_t = 30.0)]
    grace_s: f64,
    /// Seconds a tool call or checker may take before its episode ends as infra_error.
    #[arg(long, default_value_t = 120.0)]
    tool_timeout_s: f64,
    /// Task pack TOML files the learner may assign from (repeatable).
    #[arg(long = "task-pack", value_name = "FILE")]
    task_packs: Vec<PathBuf>,
    /// Parent folder for episode workspaces (default: the system temp folder).
    #[arg(long, value_name = "DIR")]
    workspace_dir: Option<PathBuf>,
    /// Print the final report as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

fn parse_device(s: &str) -> Result<tch::Device> {
    match s {
        "cpu" => Ok(tch::Device::Cpu),
        "cuda" => Ok(tch::Device::Cuda(0)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(tch::Device::Cuda)
            .with_context(|| format!("--device {s:?}: expected cpu, cuda or cuda:N")),
    }
}

fn secs(what: &str, s: f64) -> Result<Duration> {
    anyhow::ensure!(
        s.is_finite() && s >= 0.0,
        "{what} must be a number of seconds >= 0"
    );
    Ok(Duration::from_secs_f64(s))
}

/// Resolves when SIGTERM or ctrl-c arrives.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The actor's configuration from the flags.
fn config(a: &ActorArgs) -> Result<ActorConfig> {
    anyhow::ensure!(a.concurrency >= 1, "--concurrency must be at least 1");
    let token = corvid_proto::auth::read_token_file(&a.token_file)
        .with_context(|| format!("reading the token file {}", a.token_file.display()))?;
    let mut cfg = ActorConfig::new(&a.learner, token);
    cfg.name = a.name.clone();
    cfg.concurrency = a.concurrency;
    cfg.max_episodes = a.max_episodes;
    cfg.spool_dir = a
        .spool
        .clone()
        .unwrap_or_else(|| PathBuf::from(".corvid/spool").join(&a.name));
    cfg.device = parse_device(&a.device)?;
    cfg.threads = a.threads;
    cfg.shutdown_grace = secs("--grace-s", a.grace_s)?;
    cfg.engine = EngineConfig {
        tool_timeout: secs("--tool-timeout-s", a.tool_timeout_s)?,
        ..EngineConfig::default()
    };
    cfg.task_packs = a.task_packs.clone();
    cfg.workspace_dir = a.workspace_dir.clone();
    Ok(cfg)
}

/// Runs the command.
pub fn run(args: ActorArgs) -> Result<ExitCode> {
    let cfg = config(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("corvid-actor-io")
        .build()
        .context("starting the async runtime")?;
    let learner = cfg.learner_url.clone();
    let report = runtime
        .block_on(run_actor(cfg, shutdown_signal()))
        .with_context(|| format!("actor against {learner}"))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    eprintln!(
        "actor {} stopped: {} episodes finished ({} acked, {} duplicates, {} spooled, {} rejected, {} lost), {} still spooled",
        if report.actor_id.is_empty() { "(unregistered)" } else { &report.actor_id },
        report.finished,
        report.acked,
        report.duplicates,
        report.spooled,
        report.rejected,
        report.lost,
        report.spool_left,
    );
    Ok(if report.lost > 0 || report.rejected > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ActorArgs,
    }

    #[test]
    fn flags_become_the_actor_config() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret\n").unwrap();
        let cli = Cli::parse_from([
            "x",
            "--learner",
            "http://127.0.0.1:1",
            "--token-file",
            token.to_str().unwrap(),
            "--concurrency",
            "4",
            "--max-episodes",
            "9",
            "--name",
            "a1",
            "--device",
            "cuda:1",
            "--grace-s",
            "2.5",
        ]);
        let cfg = config(&cli.args).unwrap();
        assert_eq!(cfg.token, "s3cret");
        assert_eq!((cfg.concurrency, cfg.max_episodes), (4, Some(9)));
        assert_eq!(cfg.spool_dir, PathBuf::from(".corvid/spool/a1"));
        assert_eq!(cfg.device, tch::Device::Cuda(1));
        assert_eq!(cfg.shutdown_grace, Duration::from_millis(2500));
        let bad = Cli::parse_from([
            "x",
            "--learner",
            "u",
            "--token-file",
            token.to_str().unwrap(),
            "--device",
            "tpu",
        ]);
        assert!(config(&bad.args).is_err());
    }
}
