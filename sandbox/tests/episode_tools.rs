//! Custom tools attached to one workspace ([`Sandbox::prepare_tool`] +
//! [`Workspace::add_tool`]): how task packs register their own WASI modules.

mod common;

use common::*;
use corvid_proto::ToolStatus;
use corvid_sandbox::{toolbox_wasm, CustomTool, Limits, Sandbox};
use serde_json::json;

fn toolbox_tool(name: &str, limits: Limits) -> CustomTool {
    CustomTool {
        name: name.into(),
        description: "the toolbox as a plain WASI command: args = [COMMAND, ARG...]".into(),
        wasm: toolbox_wasm().to_vec(),
        limits,
        workspace_writable: false,
    }
}

#[test]
fn an_attached_tool_runs_only_in_its_workspace_under_its_own_limits() {
    let sb = sandbox();
    let tb = sb
        .prepare_tool(toolbox_tool("tb", Limits::default()))
        .expect("prepare");
    let decl = tb.declaration();
    assert_eq!(decl["function"]["name"], "tb");
    assert_eq!(
        decl["function"]["parameters"]["properties"]["args"]["type"],
        "array"
    );

    let mut w = ws(&[("notes.txt", "b\na\nb\n")]);
    w.add_tool(tb.clone()).expect("attach");
    let o = tool(&mut w, "tb", json!({"args": ["sort", "-u", "notes.txt"]}));
    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
    assert_eq!(o.text, "a\nb\n");
    let o = tool(
        &mut w,
        "tb",
        json!({"args": ["wc", "-l"], "stdin": "x\ny\n"}),
    );
    assert_eq!(o.text, "2\n");
    // Declared read-only: the workspace is mounted read-only for it.
    let o = tool(&mut w, "tb", json!({"args": ["touch", "new.txt"]}));
    assert_eq!(o.result.status, ToolStatus::ExitNonzero, "{}", o.text);
    assert!(w.read("new.txt").is_err());
    // Attaching the same name twice is refused.
    assert!(w.add_tool(tb).is_err());

    // Another workspace of the same sandbox does not have it.
    let mut other = ws(&[]);
    let o = tool(&mut other, "tb", json!({"args": ["true"]}));
    assert_eq!(o.result.status, ToolStatus::UnknownTool);

    // Its own limits: a tiny fuel budget stops it, the shell is unaffected.
    let tiny = Limits {
        fuel: 1_000,
        ..Limits::default()
    };
    let mut w2 = ws(&[]);
    w2.add_tool(
        sb.prepare_tool(toolbox_tool("tb_tiny", tiny))
            .expect("prepare"),
    )
    .expect("attach");
    let o = tool(&mut w2, "tb_tiny", json!({"args": ["true"]}));
    assert_eq!(o.result.status, ToolStatus::ComputeBudget, "{}", o.text);
    assert_alive(&mut w2);
}

#[test]
fn prepare_tool_applies_the_registration_rules() {
    let sb = sandbox();
    for (name, why) in [
        ("shell", "a built-in"),
        ("adversary", "a sandbox-wide tool"),
        ("Bad-Name", "bad syntax"),
    ] {
        assert!(
            sb.prepare_tool(toolbox_tool(name, Limits::default()))
                .is_err(),
            "{name}: {why}"
        );
    }
    let huge = Limits {
        memory_bytes: 1 << 40,
        ..Limits::default()
    };
    assert!(sb.prepare_tool(toolbox_tool("tb", huge)).is_err());
    let mut garbage = toolbox_tool("tb", Limits::default());
    garbage.wasm = b"not wasm".to_vec();
    assert!(sb.prepare_tool(garbage).is_err());
}

#[test]
fn a_tool_from_another_sandbox_is_an_infra_error_not_a_crash() {
    let other = Sandbox::new().expect("sandbox");
    let tb = other
        .prepare_tool(toolbox_tool("tb", Limits::default()))
        .expect("prepare");
    let mut w = ws(&[]);
    w.add_tool(tb).expect("attach");
    let o = tool(&mut w, "tb", json!({"args": ["true"]}));
    assert_eq!(o.result.status, ToolStatus::InfraError);
    assert!(!o.text.contains("Sandbox"), "{}", o.text);
    assert_alive(&mut w);
}
