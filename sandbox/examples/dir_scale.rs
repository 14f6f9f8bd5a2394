//! Times directory listing and recursive deletion against directory size
//! (`cargo run --release -p corvid-sandbox --example dir_scale -- 2000 4000 8000 12000`).
//!
//! For each size N the host creates `many/f0 .. many/f{N-1}` in a fresh
//! workspace, then times `ls many | wc -l` and `rm -r many` through the
//! `shell` tool with a generous wall-clock limit (60 s) and fuel, so the
//! cost shows as time instead of a `timeout` status. Prints one line per
//! size: milliseconds, fuel and the status of each call.
//!
//! `--toolbox PATH` runs the commands with another build of the toolbox
//! module (registered as a custom tool), e.g. one built from an older commit,
//! to compare the two on the same machine.

use std::time::Instant;

use corvid_sandbox::{CustomTool, Limits, Quota, Sandbox, Workspace, WorkspaceSpec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    let alt = match argv.iter().position(|a| a == "--toolbox") {
        Some(i) if i + 1 < argv.len() => {
            let path = argv.remove(i + 1);
            argv.remove(i);
            Some(std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?)
        }
        Some(_) => return Err("--toolbox needs a path".into()),
        None => None,
    };
    let sizes: Vec<usize> = argv.iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
    let sizes = if sizes.is_empty() {
        vec![2000, 4000, 8000, 12000]
    } else {
        sizes
    };
    let limits = Limits {
        fuel: 1 << 40,
        deadline_ticks: 6000,
        ..Limits::default()
    };
    let mut builder = Sandbox::builder().shell_limits(limits);
    if let Some(wasm) = &alt {
        builder = builder.custom_tool(CustomTool {
            name: "toolbox_alt".into(),
            description: "the toolbox module given with --toolbox".into(),
            wasm: wasm.clone(),
            limits,
            workspace_writable: true,
        });
    }
    let sb = builder.build()?;
    let call = |ws: &mut Workspace, cmd: &str| {
        let (tool, args) = if alt.is_some() {
            (
                "toolbox_alt",
                corvid_sandbox::serde_json::json!({ "args": ["sh", "-c", cmd] }),
            )
        } else {
            (
                "shell",
                corvid_sandbox::serde_json::json!({ "command": cmd }),
            )
        };
        let t = Instant::now();
        let o = sb.call(ws, tool, &args.to_string());
        (t.elapsed().as_secs_f64() * 1e3, o)
    };
    println!("entries  ls_ms  ls_fuel  ls_count  rm_ms  rm_fuel  rm_status");
    for n in sizes {
        let mut spec =
            WorkspaceSpec::with_files((0..n).map(|i| (format!("many/f{i}"), Vec::new())));
        spec.quota = Quota {
            max_bytes: 1 << 30,
            max_inodes: 1 << 20,
        };
        let mut ws = Workspace::create(spec)?;
        let (ls_ms, ls) = call(&mut ws, "ls many | wc -l");
        let (rm_ms, rm) = call(&mut ws, "rm -r many");
        println!(
            "{n:>7}  {ls_ms:>5.0}  {:>7}  {:>8}  {rm_ms:>5.0}  {:>7}  {:?}",
            ls.result.fuel_used,
            ls.stdout.trim(),
            rm.result.fuel_used,
            rm.result.status,
        );
    }
    Ok(())
}
