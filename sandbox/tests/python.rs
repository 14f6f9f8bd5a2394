//! The `python` tool: CPython 3.12 for WASI (the runtime `make` fetches) runs programs and
//! scripts in the workspace, prints tracebacks as a user sees them, runs unittest, and stays
//! contained: every hostile case ends in a tool result, and the next call still works.

use std::sync::OnceLock;

mod common;
mod python_cases;
use common::ws;

use corvid_proto::ToolStatus;
use corvid_sandbox::{Entry, PythonFlavor, PythonRuntime, Sandbox, ToolOutput, Workspace};
use serde_json::json;

/// One sandbox with the `python` tool per test binary (compiling the interpreter is the
/// expensive part; later builds load it precompiled).
fn sandbox() -> &'static Sandbox {
    static S: OnceLock<Sandbox> = OnceLock::new();
    S.get_or_init(|| {
        let path = PythonFlavor::Cpython.bootstrap_path();
        assert!(
            path.is_file(),
            "{} is missing: run `make` (scripts/bootstrap.sh, step 6: the sandbox's runtime files \
             from PyPI) first",
            path.display()
        );
        Sandbox::builder()
            .python(PythonRuntime::open(path))
            .build()
            .expect("a sandbox with python builds")
    })
}

/// The reference path: every call runs the interpreter's whole start-up.
fn plain_sandbox() -> &'static Sandbox {
    static S: OnceLock<Sandbox> = OnceLock::new();
    S.get_or_init(|| {
        let runtime = PythonRuntime {
            preinit: false,
            ..PythonRuntime::open(PythonFlavor::Cpython.bootstrap_path())
        };
        Sandbox::builder()
            .python(runtime)
            .build()
            .expect("a sandbox with python builds")
    })
}

fn py(ws: &mut Workspace, args: serde_json::Value) -> ToolOutput {
    sandbox().call(ws, "python", &args.to_string())
}

fn code(ws: &mut Workspace, src: &str) -> ToolOutput {
    py(ws, json!({ "code": src }))
}

/// Every hostile case ends here: the same workspace runs a program again.
fn assert_alive(ws: &mut Workspace) {
    let o = code(ws, "print('alive')");
    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
    assert_eq!(o.text, "alive\n");
}

#[test]
fn a_program_runs_in_the_workspace_with_it_on_sys_path() {
    let mut w = ws(&[
        ("data.csv", "city,n\nOslo,3\nLima,4\nOslo,5\n"),
        (
            "helpers.py",
            "def total(rows):\n    return sum(int(r[1]) for r in rows)\n",
        ),
    ]);
    let o = code(
        &mut w,
        "import csv, os, helpers\n\
         rows = [r for r in csv.reader(open('data.csv'))][1:]\n\
         print(os.getcwd(), helpers.total([r for r in rows if r[0] == 'Oslo']))",
    );
    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
    assert_eq!(o.text, "/workspace 8\n");
    assert!(sandbox().tool_names().contains(&"python"));
}

#[test]
fn a_script_runs_with_its_arguments_and_writes_the_workspace() {
    let mut w = ws(&[(
        "tools/count.py",
        "import sys\nn = len(open(sys.argv[1]).read().split())\nopen('out.txt', 'w').write(str(n))\nprint(sys.argv)\n",
    )]);
    std::fs::write(w.host_path().join("words.txt"), "a b c d").expect("write");
    let o = py(
        &mut w,
        json!({"path": "tools/count.py", "args": ["words.txt"]}),
    );
    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
    assert_eq!(o.text, "['tools/count.py', 'words.txt']\n");
    assert_eq!(w.read("out.txt").expect("written"), b"4");
    // Standard input reaches the program.
    let o = py(
        &mut w,
        json!({"code": "import sys; print(sys.stdin.read().upper())", "stdin": "hi"}),
    );
    assert_eq!(o.text, "HI\n", "{}", o.text);
}

#[test]
fn an_error_prints_the_traceback_a_user_sees() {
    let mut w = ws(&[("lib.py", "def half(x):\n    return x / 0\n")]);
    let o = code(&mut w, "import lib\nprint('before')\nlib.half(3)");
    assert_eq!(o.result.status, ToolStatus::ExitNonzero, "{}", o.text);
    assert_eq!(o.result.exit_code, 1);
    assert!(
        o.text
            .starts_with("before\nTraceback (most recent call last):\n"),
        "{}",
        o.text
    );
    assert!(
        o.text.contains("File \"<code>\", line 3, in <module>"),
        "{}",
        o.text
    );
    assert!(
        o.text.contains("/workspace/lib.py\", line 2, in half"),
        "{}",
        o.text
    );
    assert!(
        o.text.contains("ZeroDivisionError: division by zero"),
        "{}",
        o.text
    );
    // The prelude that runs the caller's code is not part of it.
    assert!(
        !o.text.contains("<string>") && !o.text.contains("runpy"),
        "{}",
        o.text
    );
    // A syntax error is reported the same way, and sys.exit keeps its code.
    let o = code(&mut w, "def f(:\n  pass");
    assert!(o.text.contains("SyntaxError"), "{}", o.text);
    let o = code(&mut w, "import sys; sys.exit(3)");
    assert_eq!(
        (o.result.status, o.result.exit_code),
        (ToolStatus::ExitNonzero, 3)
    );
    assert_alive(&mut w);
}

#[test]
fn unittest_runs_and_reports_a_failure() {
    let mut w = ws(&[
        ("calc.py", "def add(a, b):\n    return a - b\n"),
        (
            "test_calc.py",
            "import unittest\nimport calc\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(calc.add(2, 2), 4)\n    def test_zero(self):\n        self.assertEqual(calc.add(0, 0), 0)\n\nif __name__ == '__main__':\n    unittest.main()\n",
        ),
    ]);
    let o = py(&mut w, json!({"path": "test_calc.py"}));
    assert_eq!(o.result.status, ToolStatus::ExitNonzero, "{}", o.text);
    assert!(o.text.contains("FAILED (failures=1)"), "{}", o.text);
    assert!(o.text.contains("AssertionError: 0 != 4"), "{}", o.text);
    std::fs::write(
        w.host_path().join("calc.py"),
        "def add(a, b):\n    return a + b\n",
    )
    .expect("fix");
    let o = code(
        &mut w,
        "import unittest; unittest.main(module='test_calc', argv=['t'])",
    );
    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
    assert!(
        o.text.contains("Ran 2 tests") && o.text.contains("\nOK\n"),
        "{}",
        o.text
    );
}

#[test]
fn tmp_is_scratch_space_of_the_call_alone() {
    let mut w = ws(&[]);
    let o = code(
        &mut w,
        "open('/tmp/s.txt', 'w').write('x' * 10)\nprint(len(open('/tmp/s.txt').read()))",
    );
    assert_eq!(o.text, "10\n", "{}", o.text);
    // Gone with the call (nothing there accumulates), never part of the workspace.
    let o = code(&mut w, "import os; print(os.listdir('/tmp'))");
    assert_eq!(o.text, "[]\n", "{}", o.text);
    assert!(w.snapshot().expect("snapshot").entries.is_empty());
    // Its host path never shows: an error names it as /tmp.
    let o = code(&mut w, "open('/tmp/missing/x')");
    assert!(o.text.contains("'/tmp/missing/x'"), "{}", o.text);
    let root = w
        .host_path()
        .parent()
        .expect("root")
        .to_string_lossy()
        .into_owned();
    assert!(!o.text.contains(&root), "{}", o.text);
}

#[test]
fn code_runs_as_main_and_a_script_imports_its_neighbours() {
    let mut w = ws(&[
        ("pkg/helper.py", "X = 7\n"),
        ("pkg/main.py", "import helper\nprint(__name__, helper.X)\n"),
    ]);
    let o = code(
        &mut w,
        "import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n        self.assertTrue(True)\nunittest.main()",
    );
    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
    assert!(o.text.contains("Ran 1 test"), "{}", o.text);
    let o = code(
        &mut w,
        "import __main__; print(sorted(k for k in vars(__main__) if not k.startswith('__')))",
    );
    assert_eq!(o.text, "[]\n", "the prelude's names leak: {}", o.text);
    let o = py(&mut w, json!({"path": "pkg/main.py"}));
    assert_eq!(o.text, "__main__ 7\n", "{}", o.text);
    // A workspace file named like a module the prelude uses does not replace it.
    std::fs::write(
        w.host_path().join("traceback.py"),
        "raise SystemExit('hijacked')",
    )
    .expect("write");
    let o = code(&mut w, "1/0");
    assert!(
        o.text.contains("ZeroDivisionError") && !o.text.contains("hijacked"),
        "{}",
        o.text
    );
}

#[test]
fn the_host_is_out_of_reach() {
    let mut w = ws(&[]);
    // Host files by absolute path and by traversal.
    let o = code(&mut w, python_cases::HOST_FILES);
    python_cases::assert_refused(&o, 4);
    assert!(o.text.ends_with("\n[]\n"), "{}", o.text);
    // The environment is the sandbox's own, nothing of the host's.
    let o = code(&mut w, "import os; print(sorted(os.environ))");
    assert_eq!(
        o.text,
        "['HOME', 'LANG', 'PWD', 'PYTHONDONTWRITEBYTECODE', 'PYTHONHASHSEED', 'PYTHONIOENCODING', 'PYTHONUTF8']\n"
    );
    // No sockets, no DNS, no processes, no threads.
    let o = code(&mut w, python_cases::NETWORK_AND_PROCESSES);
    python_cases::assert_refused(&o, 6);
    assert_alive(&mut w);
}

#[test]
fn a_symlink_the_guest_plants_is_never_followed_by_the_host() {
    let mut w = ws(&[]);
    let o = code(
        &mut w,
        "import os\n\
         for name, target in [('abs', '/etc/passwd'), ('up', '../../../../etc/passwd')]:\n\
         \x20   try:\n\
         \x20       os.symlink(target, name); print('made', name)\n\
         \x20   except OSError as e:\n\
         \x20       print('refused', name)",
    );
    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
    for name in ["abs", "up"] {
        // Whether or not the guest could make it, the host reads nothing through it.
        let r = sandbox().call(&mut w, "read_file", &json!({ "path": name }).to_string());
        assert_ne!(r.result.status, ToolStatus::Ok, "{name}: {}", r.text);
        assert!(!r.text.contains("root:"), "{}", r.text);
        assert!(w.read(name).is_err(), "the host followed {name}");
        // A snapshot lists it as a link, never as the file it points at.
        let snap = w.snapshot().expect("snapshot");
        assert!(
            matches!(snap.entries.get(name), None | Some(Entry::Symlink(_))),
            "{name}: {:?}",
            snap.entries.get(name)
        );
    }
    assert_alive(&mut w);
}

#[test]
fn runaway_programs_end_as_tool_errors() {
    let mut w = ws(&[]);
    let cases = [
        // Past the memory cap: CPython's MemoryError, or the limiter.
        (
            "x = bytearray(1 << 30)\nprint(len(x))",
            &[ToolStatus::ExitNonzero, ToolStatus::MemoryLimit][..],
        ),
        // Deep recursion: Python's RecursionError, or the wasm stack.
        (
            "import sys\nsys.setrecursionlimit(1000000)\ndef f(n): return f(n + 1)\nf(0)",
            &[ToolStatus::ExitNonzero, ToolStatus::MemoryLimit][..],
        ),
    ];
    // An infinite loop (fuel or the deadline) and an output flood (the capture cap) too.
    for (src, allowed) in cases.into_iter().chain(python_cases::RUNAWAY_LOOPS) {
        let o = code(&mut w, src);
        python_cases::assert_ended_as(src, &o, allowed);
        assert_alive(&mut w);
    }
}

#[test]
fn bad_arguments_are_refused_before_anything_runs() {
    let mut w = ws(&[]);
    for args in [
        json!({}),
        json!({"code": "print(1)", "path": "a.py"}),
        json!({"code": 3}),
    ] {
        let o = py(&mut w, args.clone());
        assert_eq!(
            o.result.status,
            ToolStatus::InvalidCall,
            "{args}: {}",
            o.text
        );
    }
    // A script that does not exist is Python's own error.
    let o = py(&mut w, json!({"path": "missing.py"}));
    assert_eq!(o.result.status, ToolStatus::ExitNonzero, "{}", o.text);
    assert!(o.text.contains("missing.py"), "{}", o.text);
}

#[test]
fn another_module_is_refused_by_its_checksum() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = dir.path().join(PythonFlavor::Cpython.module_file());
    std::fs::write(&fake, corvid_sandbox::toolbox_wasm()).expect("write");
    let err = Sandbox::builder()
        .python(PythonRuntime::open(&fake))
        .build()
        .expect_err("refused")
        .to_string();
    assert!(err.contains("sha256") && err.contains("expected"), "{err}");
    let err = Sandbox::builder()
        .python(PythonRuntime::open(dir.path().join("absent.wasm")))
        .build()
        .expect_err("refused")
        .to_string();
    assert!(err.contains("make") && err.contains("step 6"), "{err}");
}

#[test]
fn a_preinitialised_call_answers_as_the_full_start_up_does() {
    let files = [
        ("lib.py", "VALUE = 1\ndef half(x):\n    return x / 0\n"),
        (
            "test_lib.py",
            "import unittest\nimport lib\n\nclass T(unittest.TestCase):\n    def test_value(self):\n        self.assertEqual(lib.VALUE, 2)\n\nunittest.main()\n",
        ),
        ("args.py", "import sys\nprint(sys.argv, sys.stdin.read())\n"),
        ("quits.py", "import sys\nprint('bye')\nsys.exit(3)\n"),
        ("done.py", "import sys\nsys.exit(0)\n"),
        (
            "leaves.py",
            "def m():\n    f = open('from-script.txt', 'w')\n    f.write('x')\n    raise ValueError('late')\nm()\n",
        ),
        ("pkg/main.py", "import os\nprint(os.getcwd())\n"),
        // A workspace module named like one the snapshot holds is the workspace's.
        ("string.py", "ascii_letters = 'mine'\n"),
    ];
    let calls: Vec<serde_json::Value> = vec![
        json!({"code": "print(1)"}),
        json!({"code": "import lib\nlib.half(3)"}),
        json!({"code": "import sys\nsys.exit(3)"}),
        json!({"code": "import sys\nsys.exit('bye')"}),
        json!({"code": "raise SystemExit"}),
        json!({"code": "x = (1,"}),
        json!({"path": "test_lib.py"}),
        json!({"path": "args.py", "args": ["a", "b"], "stdin": "in"}),
        // A file left open is flushed as the interpreter's shutdown would flush it.
        json!({"code": "f = open('left-open.txt', 'w')\nf.write('kept')"}),
        json!({"code": "print(open('left-open.txt').read())"}),
        json!({"code": "import atexit\natexit.register(print, 'at exit')\nprint('body')"}),
        json!({"code": "import os, sys\nprint(sys.path, sys.argv, os.getcwd(), sorted(os.environ))"}),
        // Each call draws its own randomness, the same on both paths.
        json!({"code": "import random\nprint(random.random(), random.randrange(1000))"}),
        json!({"code": "import time, hashlib\nprint(time.time(), hash('x'), hashlib.sha256(b'x').hexdigest()[:8])"}),
        // A module edited between calls is read again.
        json!({"code": "open('lib.py', 'w').write('VALUE = 2\\n')"}),
        json!({"path": "test_lib.py"}),
        // Exits from a script, and a file a failing function left open.
        json!({"path": "quits.py"}),
        json!({"path": "done.py"}),
        json!({"path": "leaves.py"}),
        json!({"code": "print(repr(open('from-script.txt').read()))"}),
        json!({"path": "pkg/main.py"}),
        json!({"code": "import string\nprint(string.ascii_letters)"}),
        // Output written before the program replaced its streams.
        json!({"code": "import sys\nprint('to stdout')\nsys.stdout = open('log.txt', 'w')\nprint('to log')"}),
        json!({"code": "print(open('log.txt').read())"}),
        // The stack a program sees, and how deep it may recurse.
        json!({"code": "import inspect, sys, traceback\ndef f():\n    traceback.print_stack()\n    return [x.function for x in inspect.stack()]\nprint(f())\nn = 0\nfr = sys._getframe()\nwhile fr is not None:\n    n += 1\n    fr = fr.f_back\nprint(n)"}),
        json!({"code": "import sys\ndef f(n):\n    try:\n        return f(n + 1)\n    except RecursionError:\n        return n\nprint(f(0), sys.getrecursionlimit())"}),
        json!({"code": "import threading\nt = threading.Thread(target=print)\ntry:\n    t.start()\nexcept RuntimeError as e:\n    print(type(e).__name__)"}),
    ];
    let mut fast = ws(&files);
    let mut reference = ws(&files);
    for call in &calls {
        let a = sandbox().call(&mut fast, "python", &call.to_string());
        let b = plain_sandbox().call(&mut reference, "python", &call.to_string());
        assert_eq!(
            (a.result.status, a.result.exit_code, &a.text),
            (b.result.status, b.result.exit_code, &b.text),
            "{call}"
        );
    }
    assert_eq!(
        fast.read("left-open.txt").expect("written"),
        b"kept",
        "the file left open was flushed"
    );
    assert_eq!(
        fast.read("from-script.txt").expect("written"),
        b"x",
        "the file a failing function left open was flushed"
    );
}

fn shell(ws: &mut Workspace, command: &str) -> ToolOutput {
    sandbox().call(ws, "shell", &json!({ "command": command }).to_string())
}

#[test]
fn the_shell_runs_python_in_its_pipelines() {
    let mut w = ws(&[
        ("data.txt", "3\n4\n5\n"),
        ("sum.py", "import sys\nprint(sum(int(x) for x in sys.stdin))\n"),
        (
            "test_sum.py",
            "import unittest\n\nclass T(unittest.TestCase):\n    def test_one(self):\n        self.assertEqual(1 + 1, 2)\n",
        ),
    ]);
    // A stage's input is the program's standard input, its output the next stage's.
    let o = shell(&mut w, "cat data.txt | python sum.py");
    assert_eq!((o.result.status, o.text.as_str()), (ToolStatus::Ok, "12\n"));
    let o = shell(
        &mut w,
        "python3 -c 'print(\"a\"); print(\"b\")' | grep b > out.txt && cat out.txt",
    );
    assert_eq!(o.text, "b\n", "{}", o.text);
    // After a `cd`, in that folder; empty arguments kept.
    let o = shell(
        &mut w,
        "mkdir sub && cd sub && python -c 'import os, sys; print(os.getcwd(), sys.argv[1:])' '' x",
    );
    assert_eq!(o.text, "/workspace/sub ['', 'x']\n", "{}", o.text);
    let o = shell(&mut w, "python -c ''; echo $?");
    assert_eq!(o.text, "0\n", "{}", o.text);
    // Two programs of one line draw different randomness.
    let o = shell(&mut w, "python -c 'import random; print(random.random())'; python -c 'import random; print(random.random())'");
    let draws: Vec<&str> = o.text.lines().collect();
    assert!(draws.len() == 2 && draws[0] != draws[1], "{}", o.text);
    // The program on standard input, and `-m`.
    let o = shell(&mut w, "echo 'print(6 * 7)' | python3");
    assert_eq!(o.text, "42\n", "{}", o.text);
    let o = shell(&mut w, "python -m unittest -q test_sum");
    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
    assert!(
        o.text.contains("Ran 1 test") && o.text.contains("OK"),
        "{}",
        o.text
    );
    // A traceback is the stage's standard error, its status the shell's.
    let o = shell(&mut w, "python -c '1/0'; echo after $?");
    assert!(o.text.contains("ZeroDivisionError"), "{}", o.text);
    assert!(o.text.contains("after 1"), "{}", o.text);
    let o = shell(&mut w, "python -X dev -c 1");
    assert_eq!(o.result.exit_code, 2, "{}", o.text);
    assert!(o.text.contains("usage: python"), "{}", o.text);
    // The shell's deadline covers its whole line, a runaway program included.
    let o = shell(&mut w, "python -c 'while True: pass'; echo after");
    assert_eq!(o.result.status, ToolStatus::Timeout, "{}", o.text);
    assert!(!o.text.contains("after"), "{}", o.text);
    // The same as the tool's `module` mode.
    let o = py(
        &mut w,
        json!({"module": "unittest", "args": ["-q", "test_sum"]}),
    );
    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
    assert!(o.text.contains("Ran 1 test"), "{}", o.text);
    assert_alive(&mut w);
}

#[test]
fn a_shell_without_the_interpreter_says_so() {
    let sb = Sandbox::new().expect("sandbox");
    let mut w = ws(&[]);
    let o = sb.call(
        &mut w,
        "shell",
        &json!({"command": "python -c 1"}).to_string(),
    );
    assert_eq!(o.result.exit_code, 127, "{}", o.text);
    assert!(o.text.contains("not available"), "{}", o.text);
}
