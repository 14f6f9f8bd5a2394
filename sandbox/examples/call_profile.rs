//! Times one shell command in a loop, for profiling the per-call path
//! (`perf record -g target/release/examples/call_profile 'cat file.txt' 20000`).
//!
//! Prints p50 / p99 / mean in µs, calls per second of wall time and on-CPU
//! time per call. `call_profile --native N` times spawning `/bin/cat` on the
//! same file instead (the baseline of `corvid bench sandbox`).

use std::time::Instant;

use corvid_sandbox::{Sandbox, ToolStatus, Workspace, WorkspaceSpec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut argv = std::env::args().skip(1);
    let cmd = argv.next().unwrap_or_else(|| "cat file.txt".into());
    let n: usize = argv.next().map(|s| s.parse()).transpose()?.unwrap_or(5000);
    let line = "the quick brown fox jumps over the lazy dog 0123456789\n";
    let mut files: Vec<(String, Vec<u8>)> = vec![("file.txt".into(), line.repeat(22).into_bytes())];
    for i in 0..20 {
        let body = format!("{}needle {i}\n{}", line.repeat(10), line.repeat(10));
        files.push((format!("docs/doc{i:02}.txt"), body.into_bytes()));
    }
    let mut ws = Workspace::create(WorkspaceSpec::with_files(files))?;
    if cmd == "--native" {
        let file = ws.host_path().join("file.txt");
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            let out = std::process::Command::new("/bin/cat").arg(&file).output()?;
            v.push(t.elapsed().as_secs_f64() * 1e6);
            if !out.status.success() {
                return Err("/bin/cat failed".into());
            }
        }
        v.sort_by(|a, b| a.total_cmp(b));
        println!("native /bin/cat spawn: p50 {:.1} µs", v[v.len() / 2]);
        return Ok(());
    }
    let sb = Sandbox::new()?;
    let args = corvid_sandbox::serde_json::json!({ "command": cmd }).to_string();
    for _ in 0..200 {
        sb.call(&mut ws, "shell", &args);
    }
    let mut v = Vec::with_capacity(n);
    let cpu0 = thread_cpu_ns();
    let t0 = Instant::now();
    let mut fuel = 0;
    for _ in 0..n {
        let t = Instant::now();
        let o = sb.call(&mut ws, "shell", &args);
        v.push(t.elapsed().as_secs_f64() * 1e6);
        if o.result.status != ToolStatus::Ok {
            return Err(format!("call failed: {}", o.text).into());
        }
        fuel = o.result.fuel_used;
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu_us = (thread_cpu_ns() - cpu0) as f64 / 1e3 / n as f64;
    v.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{cmd:?}: p50 {:.1} µs, p99 {:.1} µs, mean {:.1} µs, {:.0} calls/s, on-CPU {cpu_us:.1} µs/call, fuel {fuel}",
        pick(0.5),
        pick(0.99),
        v.iter().sum::<f64>() / n as f64,
        n as f64 / wall
    );
    Ok(())
}

/// On-CPU time of this thread in ns (Linux `/proc/thread-self/schedstat`; 0 elsewhere).
/// Unlike wall time it does not grow when other processes share the cores.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
