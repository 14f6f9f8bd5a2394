//! Corvid multi-process end-to-end tests: real processes over loopback (`tests/e2e.rs`,
//! `tests/actor_learner.rs`) and across network hosts made of namespaces (`tests/fleet.rs`,
//! with [`hosts`] and, where the kernel has no netem, [`wire`]).

pub mod hosts;
pub mod netns;
pub mod wire;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The `corvid` binary of this build, rebuilt first if any source changed.
///
/// Tests of another package do not get `CARGO_BIN_EXE_corvid`, and cargo does not rebuild a
/// sibling package's binary for them: without this, `cargo test` after an edit would run the
/// previous build's binary. Cargo releases its build lock before running tests, so the nested
/// build does not wait on the outer one; when nothing changed it is a no-op of about a second.
pub fn corvid() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/<test>-<hash> -> target/<profile>/corvid
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target profile dir");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "corvid", "--bin", "corvid"]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        let status = cmd
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("running cargo build");
        assert!(status.success(), "cargo build --bin corvid failed");
        let bin = dir.join("corvid");
        assert!(bin.exists(), "cargo built no binary at {}", bin.display());
        bin
    })
    .clone()
}

/// Polls `ok` every 200 ms; panics naming `what` after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(
            t.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Trajectory ids an actor's log (`RUST_LOG=corvid_actor::submit=debug`) shows the learner
/// acknowledged, new or duplicate.
pub fn acked_ids(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("acked"))
        .filter_map(|l| {
            let rest = &l[l.find("trajectory=")? + "trajectory=".len()..];
            let id: String = rest
                .trim_start_matches('"')
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
                .collect();
            (!id.is_empty()).then_some(id)
        })
        .collect()
}
