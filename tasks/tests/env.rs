//! Oracle plans executed in the real sandbox: every built-in family and shipped pack, every
//! level, several seeds — each call gets the status the plan expects and the checker passes.
//! The task's tool gate refuses tools it does not allow and calls over a tool's limit.

use corvid_proto::{ToolCall, ToolStatus};
use corvid_sandbox::Sandbox;
use corvid_tasks::{builtin_families, load_pack, Episode, TaskEnv, TaskFamily, Verdict};

fn env() -> TaskEnv {
    TaskEnv::new(
        Sandbox::builder()
            .search_tool(true)
            .build()
            .expect("sandbox"),
    )
}

fn run_oracle(env: &TaskEnv, family: &dyn TaskFamily, level: u32, seed: u64) {
    let task = family.instance(level, seed).expect("instance");
    let mut ep = Episode::start(env, &task).expect("episode");
    for (i, step) in task.oracle.steps.iter().enumerate() {
        let out = ep.call(&step.tool_call());
        assert_eq!(
            out.result.status, step.expect,
            "{} call {i} ({}): sandbox said {:?}",
            task.id, step.name, out.text
        );
    }
    let out = ep.call(&task.oracle.answer_step().tool_call());
    assert_eq!(out.result.status, ToolStatus::Ok, "{}: answer", task.id);
    assert_eq!(ep.answer(), Some(task.oracle.answer.as_str()));
    assert_eq!(ep.check(), Verdict::Pass, "{}: checker", task.id);
}

#[test]
fn builtin_oracles_pass_in_the_real_sandbox() {
    let env = env();
    for family in builtin_families() {
        for level in 1..=family.levels() {
            for seed in [0, 1, 2] {
                run_oracle(&env, family.as_ref(), level, seed);
            }
        }
    }
}

#[test]
fn shipped_pack_oracles_pass_in_the_real_sandbox() {
    let env = env();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("packs");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("packs dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "toml") {
            let pack = load_pack(&path).expect("pack loads");
            for level in 1..=pack.levels() {
                run_oracle(&env, &pack, level, 3);
            }
            n += 1;
        }
    }
    assert!(n >= 2, "expected the shipped packs, found {n}");
}

#[test]
fn wrong_answer_fails_and_no_answer_fails() {
    let env = env();
    let family = &builtin_families()[0];
    let task = family.instance(1, 5).expect("instance");
    let mut ep = Episode::start(&env, &task).expect("episode");
    assert!(matches!(ep.check(), Verdict::Fail(_)), "no answer yet");
    ep.call(&ToolCall {
        name: "answer".into(),
        arguments_json: r#"{"answer": "definitely wrong"}"#.into(),
    });
    assert!(matches!(ep.check(), Verdict::Fail(_)));
}

#[test]
fn the_tool_gate_refuses_disallowed_tools_and_calls_over_the_limit() {
    let env = env();
    let hops = corvid_tasks::builtin_family("hops").expect("hops");
    let task = hops.instance(1, 0).expect("instance");
    assert!(task.tools.iter().all(|t| t.name != "shell"));
    let mut ep = Episode::start(&env, &task).expect("episode");
    let out = ep.call(&ToolCall {
        name: "shell".into(),
        arguments_json: r#"{"command": "ls"}"#.into(),
    });
    assert_eq!(out.result.status, ToolStatus::UnknownTool);
    assert!(out.text.contains("read_file"), "{}", out.text);
    assert!(
        ep.last_process_reward() < 0.0,
        "invalid calls are penalised"
    );

    let limit = task
        .tools
        .iter()
        .find(|t| t.name == "read_file")
        .and_then(|t| t.limits.max_calls)
        .expect("hops limits read_file");
    let call = task.oracle.steps[0].tool_call();
    for i in 0..limit {
        let out = ep.call(&call);
        assert!(out.result.status.is_success(), "call {i}: {}", out.text);
    }
    let out = ep.call(&call);
    assert_eq!(out.result.status, ToolStatus::InvalidCall);
    assert!(out.text.contains("at most"), "{}", out.text);
}

#[test]
fn command_exit_checker_runs_in_the_workspace() {
    let src = r#"
prompt = "Write ok to flag.txt, then answer done."

[pack]
name = "cmd-check"
description = "write ok to flag.txt"

[tools]
write_file = {}
answer = {}

[[levels]]
level = 1
max_turns = 3
context_budget = 1024

[checker]
kind = "command_exit"
command = "grep ok flag.txt"
exit_code = 0

[oracle]
answer = "done"

[[oracle.calls]]
tool = "write_file"
args = { path = "flag.txt", content = "ok" }
"#;
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("cmd-check.toml");
    std::fs::write(&path, src).expect("write pack");
    let pack = load_pack(&path).expect("pack loads");
    let env = env();
    run_oracle(&env, &pack, 1, 0);
    let task = pack.instance(1, 0).expect("instance");
    let mut ep = Episode::start(&env, &task).expect("episode");
    assert!(matches!(ep.check(), Verdict::Fail(_)), "flag.txt is absent");
}

#[test]
fn file_state_checker_judges_its_rendered_paths_in_the_real_sandbox() {
    // The checker's paths are templates like the `[files]` paths: `{dir}` is rendered in
    // both, and the rendered path is the one the sandbox's final workspace holds.
    let pack = corvid_tasks::TaskPack::parse(
        "out-dir.toml",
        r#"prompt = "Copy {dir}/in.txt to {dir}/out.txt, then answer done."

[pack]
name = "out-dir"

[vars]
dir = { choices = ["data", "logs"] }
n = { min = 1, max = 9 }

[tools]
read_file = {}
write_file = {}
answer = {}

[[levels]]
level = 1
max_turns = 4
context_budget = 1024

[files]
"{dir}/in.txt" = "n = {n}\n"

[checker]
kind = "file_state"
files = { "{dir}/out.txt" = { kind = "equals", text = "n = {n}" } }

[oracle]
answer = "done"

[[oracle.calls]]
tool = "read_file"
args = { path = "{dir}/in.txt" }

[[oracle.calls]]
tool = "write_file"
args = { path = "{dir}/out.txt", content = "n = {n}\n" }
"#,
    )
    .expect("pack");
    let env = env();
    for seed in [0, 1, 2, 3] {
        run_oracle(&env, &pack, 1, seed);
        // Answering at once leaves the rendered path missing.
        let task = pack.instance(1, seed).expect("instance");
        let dir = task.files.keys().next().and_then(|p| p.split_once('/'));
        let dir = dir.expect("a file under {dir}").0;
        let mut ep = Episode::start(&env, &task).expect("episode");
        ep.call(&task.oracle.answer_step().tool_call());
        assert_eq!(
            ep.check(),
            Verdict::Fail(format!("{dir}/out.txt does not exist")),
            "{}",
            task.id
        );
    }
}

/// A pack whose `[files]` hold `{f}` and `a.txt/b.txt`: with `f = "a.txt"` one path is a
/// file and the other needs it as its folder.
const NESTED_FILES_PACK: &str = r#"prompt = "Read {f} and answer its number."

[pack]
name = "nested-files"

[vars]
f = { choices = ["a.txt", "c.txt"] }
n = { min = 1, max = 9 }

[tools]
read_file = {}
answer = {}

[[levels]]
level = 1
max_turns = 3
context_budget = 1024

[files]
"{f}" = "n = {n}\n"
"a.txt/b.txt" = "not this one\n"

[checker]
kind = "exact"
expected = "{n}"

[oracle]
answer = "{n}"

[[oracle.calls]]
tool = "read_file"
args = { path = "{f}" }
"#;

#[test]
fn files_where_one_path_is_the_folder_of_another_never_reach_the_sandbox() {
    let env = env();
    // What the sandbox does with such files: it cannot create the workspace at all, so
    // every episode that drew them would end before its first turn as an infra error.
    let hops = corvid_tasks::builtin_family("hops").expect("hops");
    let mut task = hops.instance(1, 0).expect("instance");
    task.files = [
        ("a.txt".to_string(), b"n = 1\n".to_vec()),
        ("a.txt/b.txt".to_string(), b"not this one\n".to_vec()),
    ]
    .into_iter()
    .collect();
    let e = Episode::start(&env, &task).expect_err("a file and a folder at one path");
    assert!(
        matches!(&e, corvid_tasks::TasksError::Sandbox { message, .. }
            if message.contains("create_dir at a.txt")),
        "{e}"
    );
    // So validation refuses a pack that can draw them, naming both templates (before this
    // check the pack validated and seed 0's episode failed as above).
    match corvid_tasks::TaskPack::parse("nested.toml", NESTED_FILES_PACK) {
        Err(corvid_tasks::TasksError::Pack(d)) => assert!(
            d.iter().any(|e| e.to_string().starts_with(
                "nested.toml:21:1: [files] paths \"{f}\" and \"a.txt/b.txt\" render to \"a.txt\" and \"a.txt/b.txt\" with f = \"a.txt\""
            )),
            "{d:?}"
        ),
        Err(e) => panic!("not a pack error: {e}"),
        Ok(pack) => {
            for seed in 0..8 {
                let task = pack.instance(1, seed).expect("instance");
                if let Err(e) = Episode::start(&env, &task) {
                    panic!("validated, then the episode failed to start: {e}");
                }
            }
            panic!("validated, and no seed drew f = \"a.txt\"");
        }
    }
    // Past validation's rendering cap (100 x 100 values, meeting at "s" only off its
    // diagonal) `instance` refuses the nesting pair, and every instance it builds starts.
    let a: Vec<String> = (0..100)
        .map(|i| if i < 50 { "s".into() } else { format!("a{i}") })
        .collect();
    let b: Vec<String> = (0..100)
        .map(|i| if i < 50 { format!("b{i}") } else { "s".into() })
        .collect();
    let src = NESTED_FILES_PACK
        .replacen(
            "n = { min = 1, max = 9 }",
            &format!(
                "n = {{ min = 1, max = 9 }}\na = {{ choices = {a:?} }}\nb = {{ choices = {b:?} }}"
            ),
            1,
        )
        .replacen(
            "\"a.txt/b.txt\" = ",
            "\"x{a}\" = \"first\\n\"\n\"x{b}/in.txt\" = ",
            1,
        );
    let pack = corvid_tasks::TaskPack::parse("nested.toml", &src).expect("valid past the cap");
    let (mut started, mut refused) = (0, 0);
    for seed in 0..200 {
        match pack.instance(1, seed) {
            Ok(task) => {
                Episode::start(&env, &task).expect("an instance that builds starts");
                started += 1;
            }
            Err(e) => {
                assert!(
                    matches!(&e, corvid_tasks::TasksError::PackInstance { .. }),
                    "{e}"
                );
                assert!(
                    e.to_string().contains("[files] paths \"x{a}\" and \"x{b}/in.txt\" render to \"xs\" and \"xs/in.txt\""),
                    "{e}"
                );
                refused += 1;
            }
        }
    }
    assert!(
        started > 0 && refused > 0,
        "{started} started, {refused} refused"
    );
}
