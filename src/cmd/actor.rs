//! `corvid actor`: roll out episodes against sandboxed tools and stream them to a learner.

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use corvid_actor::{run_actor, ActorConfig, ActorReport, EngineConfig};
use corvid_proto::Termination;

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
    /// The learner's gRPC URL, http://HOST:PORT (no TLS).
    #[arg(long, value_name = "URL")]
    learner: String,
    /// File holding the run's shared token (first line; visible ASCII, no spaces).
    #[arg(long, value_name = "FILE")]
    token_file: PathBuf,
    /// Episodes run at once (and decoded together).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Stop after this many episodes (default: until stopped).
    #[arg(long, value_name = "M")]
    max_episodes: Option<u64>,
    /// Spool folder for journals and unsent trajectories (default `.corvid/spool/<name>`).
    #[arg(long, value_name = "DIR")]
    spool: Option<PathBuf>,
    /// Name shown in the learner's logs.
    #[arg(long, default_value = "actor")]
    name: String,
    /// Device for the policy: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// The policy's weight dtype, fp32 or bf16 (routers stay fp32); default bf16 on CUDA,
    /// fp32 on the CPU. A bf16 CPU actor against an fp32 learner is the train–rollout
    /// mismatch that `[rl] router_replay` addresses.
    #[arg(long, value_name = "DTYPE")]
    dtype: Option<String>,
    /// libtorch intra-op threads (0: libtorch's default, one per core). 1 suits CPU actors
    /// sharing a machine: contending OpenMP threads slow small-batch decoding badly.
    #[arg(long, default_value_t = 1)]
    threads: i32,
    /// Seconds in-flight episodes may finish after SIGTERM before they are abandoned,
    /// 0 to 86400 (one day).
    #[arg(long, default_value_t = 30.0)]
    grace_s: f64,
    /// Seconds the actor keeps trying to submit its spool once the episodes have ended,
    /// 0 (one pass) to 86400: what it still holds then stays in the spool for its next
    /// start.
    #[arg(long, default_value_t = 10.0)]
    drain_s: f64,
    /// Seconds a tool call or checker may take before its episode ends as infra_error,
    /// 1 to 3600 (one hour; the sandbox's own limits are far shorter).
    #[arg(long, default_value_t = 120.0)]
    tool_timeout_s: f64,
    /// Task pack TOML files the learner may assign from (repeatable).
    #[arg(long = "task-pack", value_name = "FILE")]
    task_packs: Vec<PathBuf>,
    /// Parent folder for episode workspaces (default: the system temp folder).
    #[arg(long, value_name = "DIR")]
    workspace_dir: Option<PathBuf>,
    /// The model's tokenizer folder (tokenizer.json, tokenizer_config.json, chat template)
    /// for a run in a Hugging Face model's own format: `corvid run` passes the run's
    /// `[model] hf`. Its files must be the learner's (same SHA-256) or the actor refuses to
    /// start; without it the actor writes Corvid's byte layout.
    #[arg(long, value_name = "DIR")]
    tokenizer: Option<PathBuf>,
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

fn parse_dtype(s: &str) -> Result<tch::Kind> {
    match s {
        "fp32" => Ok(tch::Kind::Float),
        "bf16" => Ok(tch::Kind::BFloat16),
        _ => anyhow::bail!("--dtype {s:?}: expected fp32 or bf16"),
    }
}

/// Bounds of `--grace-s` and `--drain-s`, seconds: at once, up to a day.
const GRACE_S: RangeInclusive<f64> = 0.0..=86_400.0;
/// Bounds of `--tool-timeout-s`, seconds: under a second every workspace creation would
/// time out; over an hour the host is stuck, not slow.
const TOOL_TIMEOUT_S: RangeInclusive<f64> = 1.0..=3_600.0;

/// `s` seconds as a duration, refused (naming `flag` and the range) unless within `range`.
fn secs(flag: &str, s: f64, range: RangeInclusive<f64>) -> Result<Duration> {
    anyhow::ensure!(
        range.contains(&s),
        "{flag} {s:?}: give a number of seconds from {} to {}",
        range.start(),
        range.end()
    );
    Duration::try_from_secs_f64(s).with_context(|| format!("{flag} {s:?}"))
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
    // Checked here with the client's own rules, so a typo fails now instead of being
    // retried against a learner that cannot be reached.
    corvid_proto::client::learner_endpoint(&a.learner).context("--learner")?;
    let token = corvid_actor::read_token_file(&a.token_file)?;
    let mut cfg = ActorConfig::new(&a.learner, token);
    cfg.name = a.name.clone();
    cfg.concurrency = a.concurrency;
    cfg.max_episodes = a.max_episodes;
    cfg.spool_dir = a
        .spool
        .clone()
        .unwrap_or_else(|| PathBuf::from(".corvid/spool").join(&a.name));
    cfg.device = parse_device(&a.device)?;
    cfg.dtype = a.dtype.as_deref().map(parse_dtype).transpose()?;
    cfg.threads = a.threads;
    cfg.shutdown_grace = secs("--grace-s", a.grace_s, GRACE_S)?;
    cfg.final_drain = secs("--drain-s", a.drain_s, GRACE_S)?;
    cfg.engine = EngineConfig {
        tool_timeout: secs("--tool-timeout-s", a.tool_timeout_s, TOOL_TIMEOUT_S)?,
        ..EngineConfig::default()
    };
    cfg.task_packs = a.task_packs.clone();
    cfg.workspace_dir = a.workspace_dir.clone();
    cfg.tokenizer_dir = a.tokenizer.clone();
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
    eprintln!("{}", summary(&report));
    if report.refused > 0 {
        eprintln!(
            "error: {} of {} assignments were refused (this actor cannot run the learner's tasks; \
             see the errors above: a task pack's run needs --task-pack FILE, the same file as the learner's)",
            report.refused, report.assigned
        );
    }
    Ok(
        if report.lost > 0 || report.rejected > 0 || report.refused > 0 {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        },
    )
}

/// The one-line account an actor prints when it stops: how its episodes ended (abandoned
/// ones were cut off by the stop and are stored unscored; refused ones never ran) and where
/// their trajectories went.
fn summary(report: &ActorReport) -> String {
    let abandoned = report
        .engine
        .terminations
        .get(Termination::Abandoned.as_str())
        .copied()
        .unwrap_or(0);
    format!(
        "actor {} stopped: {} episodes finished ({} of them abandoned at the stop, {} refused; \
         {} acked, {} duplicates, {} spooled, {} rejected, {} lost), {} still spooled",
        if report.actor_id.is_empty() {
            "(unregistered)"
        } else {
            &report.actor_id
        },
        report.finished,
        abandoned,
        report.refused,
        report.acked,
        report.duplicates,
        report.spooled,
        report.rejected,
        report.lost,
        report.spool_left,
    )
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
    fn the_summary_tells_abandoned_and_refused_episodes_apart() {
        let mut report = ActorReport {
            actor_id: "actor-2".into(),
            finished: 18,
            refused: 2,
            acked: 18,
            ..ActorReport::default()
        };
        report.engine.terminations.insert("abandoned".into(), 16);
        let line = summary(&report);
        assert!(
            line.starts_with(
                "actor actor-2 stopped: 18 episodes finished (16 of them abandoned at the stop, 2 refused; 18 acked,"
            ),
            "{line}"
        );
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
            "--drain-s",
            "0",
        ]);
        let cfg = config(&cli.args).unwrap();
        assert_eq!(cfg.token, "s3cret");
        assert_eq!((cfg.concurrency, cfg.max_episodes), (4, Some(9)));
        assert_eq!(cfg.spool_dir, PathBuf::from(".corvid/spool/a1"));
        assert_eq!(cfg.device, tch::Device::Cuda(1));
        assert_eq!(cfg.shutdown_grace, Duration::from_millis(2500));
        assert_eq!(cfg.final_drain, Duration::ZERO);
        let bad = Cli::parse_from([
            "x",
            "--learner",
            "http://127.0.0.1:1",
            "--token-file",
            token.to_str().unwrap(),
            "--device",
            "tpu",
        ]);
        let e = config(&bad.args).unwrap_err().to_string();
        assert!(e.contains("--device \"tpu\""), "{e}");
    }

    /// The error `config` gives for these flags (with a token file holding `token`).
    fn config_error(learner: &str, token: &[u8], extra: &[&str]) -> String {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, token).unwrap();
        let mut argv = vec![
            "x",
            "--learner",
            learner,
            "--token-file",
            file.to_str().unwrap(),
        ];
        argv.extend_from_slice(extra);
        let cli = Cli::parse_from(argv);
        let e = format!("{:#}", config(&cli.args).unwrap_err());
        e.replace(file.to_str().unwrap(), "TOKEN_FILE")
    }

    #[test]
    fn an_unusable_learner_url_or_token_fails_at_once_naming_the_flag_or_file() {
        for url in ["not a url", "127.0.0.1:50051", "https://learner:50051"] {
            let e = config_error(url, b"s3cret\n", &[]);
            assert!(e.starts_with("--learner: ") && e.contains(url), "{e}");
        }
        let e = config_error("http://127.0.0.1:1", b"s3c\x01ret\n", &[]);
        assert!(
            e.matches("TOKEN_FILE").count() == 1 && e.contains("byte 0x01 at offset 3"),
            "the token file named once: {e}"
        );
    }

    #[test]
    fn timeouts_outside_their_range_are_refused_naming_the_flag() {
        assert_eq!(secs("--x", 0.0, GRACE_S).unwrap(), Duration::ZERO);
        assert_eq!(
            secs("--x", 86_400.0, GRACE_S).unwrap(),
            Duration::from_secs(86_400)
        );
        assert_eq!(
            secs("--x", 1.5, TOOL_TIMEOUT_S).unwrap(),
            Duration::from_millis(1500)
        );
        for (flag, v) in [
            ("--grace-s", "1e20"),
            ("--grace-s", "86400.5"),
            ("--grace-s", "-1"),
            ("--grace-s", "NaN"),
            ("--grace-s", "inf"),
            ("--drain-s", "-0.5"),
            ("--drain-s", "1e9"),
            ("--tool-timeout-s", "1e19"),
            ("--tool-timeout-s", "3601"),
            ("--tool-timeout-s", "0"),
        ] {
            let arg = format!("{flag}={v}");
            let e = config_error("http://127.0.0.1:1", b"s3cret\n", &[&arg]);
            assert!(
                e.starts_with(&format!("{flag} ")) && e.contains("give a number of seconds from"),
                "{arg}: {e}"
            );
        }
    }
}
