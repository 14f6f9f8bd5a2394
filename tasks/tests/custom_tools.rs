//! A pack that registers its own WASI module as a tool (`[custom_tools.NAME]`): loaded,
//! declared to the policy, attached to each episode's workspace, called through the
//! task's tool gate and the sandbox; and malformed declarations reported at file:line.
//! The module is the sandbox's toolbox, a plain WASI preview-1 command.

use corvid_proto::{ToolCall, ToolStatus};
use corvid_sandbox::{toolbox_wasm, Sandbox};
use corvid_tasks::{load_pack, Episode, TaskEnv, TaskFamily, TasksError};

const PACK: &str = r#"prompt = "How many lines does {name}.txt have? Count them with the `lines` tool, then answer the number."

[pack]
name = "line-count"
description = "count a file's lines with the pack's own WASI tool"

[vars]
name = { choices = ["alpha", "beta", "gamma"] }

[tools]
lines = { max_calls = 2 }
answer = {}

[custom_tools.lines]
description = "Runs the toolbox: args = [COMMAND, ARG...], e.g. [\"wc\", \"-l\", \"FILE\"]."
module = "wasm/toolbox.wasm"
fuel = 50_000_000
memory_mib = 16
timeout_ms = 500
output_bytes = 65536

[[levels]]
level = 1
max_turns = 3
context_budget = 1024

[files]
"{name}.txt" = "one\ntwo\nthree\n"

[checker]
kind = "exact"
expected = "3"

[oracle]
answer = "3"

[[oracle.calls]]
tool = "lines"
args = { args = ["wc", "-l", "{name}.txt"] }
"#;

/// Writes `pack` as `dir/line-count.toml` next to `dir/wasm/toolbox.wasm`.
fn pack_dir(pack: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("wasm")).expect("mkdir");
    std::fs::write(dir.path().join("wasm/toolbox.wasm"), toolbox_wasm()).expect("module");
    let file = dir.path().join("line-count.toml");
    std::fs::write(&file, pack).expect("pack");
    (dir, file)
}

#[test]
fn a_pack_tool_is_declared_attached_called_and_limited() {
    let (_dir, file) = pack_dir(PACK);
    let pack = load_pack(&file).expect("pack loads");
    let env = TaskEnv::new(Sandbox::builder().build().expect("sandbox"));
    let task = pack.instance(1, 5).expect("instance");
    let decl = &task.custom_tools[0];
    assert_eq!(
        (decl.name.as_str(), decl.limits.fuel),
        ("lines", 50_000_000)
    );
    assert_eq!(
        (decl.limits.deadline_ticks, decl.limits.memory_bytes),
        (50, 16 << 20)
    );

    // The policy is shown the task's tools in order, the custom one with its schema.
    let decls = env.tool_declarations(&task).expect("declarations");
    let names: Vec<&str> = decls
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|d| d["function"]["name"].as_str())
        .collect();
    assert_eq!(names, ["answer", "lines"]);
    let lines = &decls[1]["function"];
    assert!(lines["description"]
        .as_str()
        .is_some_and(|d| d.contains("toolbox")));
    assert_eq!(lines["parameters"]["properties"]["args"]["type"], "array");

    // The oracle runs in the real sandbox: the tool answers, the checker passes.
    let mut ep = Episode::start(&env, &task).expect("episode");
    let step = &task.oracle.steps[0];
    let out = ep.call(&step.tool_call());
    assert_eq!(out.result.status, ToolStatus::Ok, "{}", out.text);
    let file_name = task.files.keys().next().expect("one file");
    assert_eq!(out.text, format!("3 {file_name}\n"));
    assert!(out.result.fuel_used > 0);
    ep.call(&task.oracle.answer_step().tool_call());
    assert!(ep.check().passed(), "{:?}", ep.check());

    // Read-only by default, and its own call limit from [tools].
    let call = |args: &str| ToolCall {
        name: "lines".into(),
        arguments_json: args.into(),
    };
    let out = ep.call(&call(r#"{"args": ["touch", "x"]}"#));
    assert_eq!(out.result.status, ToolStatus::ExitNonzero, "{}", out.text);
    let out = ep.call(&call(r#"{"args": ["true"]}"#));
    assert_eq!(out.result.status, ToolStatus::InvalidCall, "{}", out.text);

    // Its own fuel budget: a busy command is stopped at 50M fuel.
    let mut ep = Episode::start(&env, &task).expect("episode");
    let out = ep.call(&call(
        r#"{"args": ["sh", "-c", "seq 1 100000000 | wc -l"]}"#,
    ));
    assert_eq!(out.result.status, ToolStatus::ComputeBudget, "{}", out.text);
}

#[test]
fn a_task_without_the_pack_tool_cannot_reach_it() {
    let (_dir, file) = pack_dir(PACK);
    let task = load_pack(&file)
        .expect("pack")
        .instance(1, 1)
        .expect("instance");
    let env = TaskEnv::new(Sandbox::builder().build().expect("sandbox"));
    let greeting = load_pack(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packs/greeting-fix.toml"
    )))
    .expect("shipped pack")
    .instance(1, 1)
    .expect("instance");
    // Compiled for the first task, never attached to the other's workspace.
    env.custom_tool(&task, &task.custom_tools[0]).expect("tool");
    let mut ep = Episode::start(&env, &greeting).expect("episode");
    let out = ep.call(&ToolCall {
        name: "lines".into(),
        arguments_json: r#"{"args": ["true"]}"#.into(),
    });
    assert_eq!(out.result.status, ToolStatus::UnknownTool);
}

/// `(line, message)` of every diagnostic for `pack`.
fn diagnostics(pack: &str) -> Vec<(usize, String)> {
    let (_dir, file) = pack_dir(pack);
    match load_pack(&file) {
        Err(TasksError::Pack(diags)) => {
            for d in &diags {
                assert!(d.file.ends_with("line-count.toml"), "{d}");
                assert!(!d.hint.is_empty(), "{d}");
            }
            diags.into_iter().map(|d| (d.line, d.message)).collect()
        }
        other => panic!("expected pack diagnostics, got {other:?}"),
    }
}

#[test]
fn malformed_declarations_are_reported_at_file_line() {
    // A missing module, an out-of-range limit, an empty description.
    let bad = PACK
        .replace(
            "module = \"wasm/toolbox.wasm\"",
            "module = \"wasm/missing.wasm\"",
        )
        .replace("memory_mib = 16", "memory_mib = 100000")
        .replace(
            "description = \"Runs the toolbox",
            "description = \"\"\nold_description = \"Runs the toolbox",
        );
    let d = diagnostics(&bad);
    assert!(
        d.iter()
            .any(|(_, m)| m.contains("unknown field `old_description`")),
        "{d:?}"
    );
    let bad = PACK
        .replace(
            "module = \"wasm/toolbox.wasm\"",
            "module = \"wasm/missing.wasm\"",
        )
        .replace("memory_mib = 16", "memory_mib = 100000");
    let d = diagnostics(&bad);
    let line_of = |key: &str| bad.lines().position(|l| l.starts_with(key)).expect(key) + 1;
    assert!(
        d.contains(&(
            line_of("module ="),
            d.iter()
                .find(|(_, m)| m.contains("missing.wasm"))
                .expect("module")
                .1
                .clone()
        )),
        "{d:?}"
    );
    assert!(
        d.iter().any(|(l, m)| *l == line_of("memory_mib")
            && m.contains("memory_mib = 100000 is outside 1..=256")),
        "{d:?}"
    );
    // Declared but not allowed; a built-in's name; a module that is not wasm.
    let bad = PACK.replace("lines = { max_calls = 2 }\n", "").replace(
        "[custom_tools.lines]",
        "[custom_tools.lines]\nworkspace_writable = true",
    );
    let d = diagnostics(&bad);
    assert!(
        d.iter()
            .any(|(_, m)| m.contains("declared but [tools] does not allow it")),
        "{d:?}"
    );
    assert!(
        d.iter().any(|(_, m)| m.contains("oracle calls `lines`")),
        "{d:?}"
    );
    let bad = PACK.replace("[custom_tools.lines]", "[custom_tools.shell]");
    let d = diagnostics(&bad);
    assert!(
        d.iter().any(|(_, m)| m.contains("not a built-in tool")),
        "{d:?}"
    );
    let (dir, file) = pack_dir(PACK);
    std::fs::write(dir.path().join("wasm/toolbox.wasm"), "(module)").expect("write");
    match load_pack(&file) {
        Err(TasksError::Pack(diags)) => {
            let module_line = PACK
                .lines()
                .position(|l| l.starts_with("module ="))
                .expect("line")
                + 1;
            assert!(
                diags
                    .iter()
                    .any(|d| d.line == module_line && d.message.contains("is not a wasm binary")),
                "{diags:?}"
            );
        }
        other => panic!("{other:?}"),
    }
}
