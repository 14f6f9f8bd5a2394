//! Shared fixtures: one sandbox per test binary (compiling the modules is the
//! expensive part), with the adversarial module registered as custom tools.

#![allow(dead_code)]

use std::sync::OnceLock;

use corvid_sandbox::{
    CustomTool, Limits, Sandbox, ToolOutput, ToolStatus, Workspace, WorkspaceSpec,
};

/// The hostile WASI program from `sandbox/toolbox/src/bin/adversary.rs`.
pub const ADVERSARY: &[u8] = include_bytes!(env!("CORVID_ADVERSARY_WASM"));

/// Limits for the "slow" adversary: effectively unlimited fuel, a short
/// wall-clock deadline, so the epoch path is what stops it.
pub const SLOW_LIMITS: Limits = Limits {
    fuel: 1 << 40,
    deadline_ticks: 30,
    memory_bytes: 64 << 20,
    stdout_bytes: 1 << 20,
    stderr_bytes: 64 << 10,
};

pub fn adversary_tool(name: &str, limits: Limits, writable: bool) -> CustomTool {
    CustomTool {
        name: name.into(),
        description: "adversarial test program".into(),
        wasm: ADVERSARY.to_vec(),
        limits,
        workspace_writable: writable,
    }
}

/// The shared sandbox: built-ins plus `adversary` (RW), `adversary_slow`
/// (epoch-bounded) and `adversary_ro` (read-only workspace).
pub fn sandbox() -> &'static Sandbox {
    static S: OnceLock<Sandbox> = OnceLock::new();
    S.get_or_init(|| {
        Sandbox::builder()
            .custom_tool(adversary_tool("adversary", Limits::default(), true))
            .custom_tool(adversary_tool("adversary_slow", SLOW_LIMITS, true))
            .custom_tool(adversary_tool("adversary_ro", Limits::default(), false))
            .build()
            .expect("sandbox builds")
    })
}

pub fn ws(files: &[(&str, &str)]) -> Workspace {
    Workspace::create(WorkspaceSpec::with_files(
        files
            .iter()
            .map(|(p, c)| (p.to_string(), c.as_bytes().to_vec())),
    ))
    .expect("workspace")
}

pub fn sh(ws: &mut Workspace, cmd: &str) -> ToolOutput {
    let args = serde_json::json!({ "command": cmd }).to_string();
    sandbox().call(ws, "shell", &args)
}

pub fn tool(ws: &mut Workspace, name: &str, args: serde_json::Value) -> ToolOutput {
    sandbox().call(ws, name, &args.to_string())
}

pub fn adv(ws: &mut Workspace, tool_name: &str, args: &[&str]) -> ToolOutput {
    let args = serde_json::json!({ "args": args });
    sandbox().call(ws, tool_name, &args.to_string())
}

/// The containment epilogue every adversarial test ends with: the same
/// process, the same workspace, a plain call still works.
pub fn assert_alive(ws: &mut Workspace) {
    let o = sh(ws, "echo alive");
    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
    assert_eq!(o.text, "alive\n");
}

/// Text shown to the model must never carry host paths, Rust debug text or
/// backtraces.
pub fn assert_clean(ws: &Workspace, o: &ToolOutput) {
    let host = ws.host_path().to_string_lossy().into_owned();
    let root = ws
        .host_path()
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    for bad in [
        host.as_str(),
        root.as_str(),
        "/rustc/",
        ".cargo/registry",
        "RUST_BACKTRACE",
        "Os {",
        "kind: ",
        "stack backtrace",
    ] {
        assert!(
            !o.text.contains(bad),
            "model text contains {bad:?}: {}",
            o.text
        );
    }
}
