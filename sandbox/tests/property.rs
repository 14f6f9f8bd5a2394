//! 10,000 random tool calls against one pre-built sandbox: no host panic, no
//! `infra_error`, and the text shown always obeys the display contract.

mod common;

use common::*;
use corvid_proto::ToolStatus;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("shell".to_string()),
        Just("read_file".to_string()),
        Just("write_file".to_string()),
        Just("list_dir".to_string()),
        Just("answer".to_string()),
        "[a-z_]{0,12}",
    ]
}

fn arb_path() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a.txt".to_string()),
        Just("dir/b.txt".to_string()),
        Just("/workspace/dir".to_string()),
        Just("../x".to_string()),
        Just("/etc/passwd".to_string()),
        "[a-z./\\\\]{0,20}",
        any::<String>(),
    ]
}

fn arb_command() -> impl Strategy<Value = String> {
    let word = prop_oneof![
        Just("ls"),
        Just("cat"),
        Just("grep"),
        Just("sed"),
        Just("sort"),
        Just("uniq"),
        Just("cut"),
        Just("tr"),
        Just("head"),
        Just("tail"),
        Just("wc"),
        Just("find"),
        Just("echo"),
        Just("printf"),
        Just("seq"),
        Just("expr"),
        Just("calc"),
        Just("mkdir"),
        Just("rm"),
        Just("cp"),
        Just("mv"),
        Just("touch"),
        Just("diff"),
        Just("-n"),
        Just("-r"),
        Just("-c"),
        Just("a.txt"),
        Just("dir"),
        Just("*"),
        Just("|"),
        Just(";"),
        Just("&&"),
        Just("||"),
        Just(">"),
        Just(">>"),
        Just("<"),
        Just("'"),
        Just("\""),
        Just("$?"),
        Just("s/a/b/g"),
        Just("1"),
        Just("-5"),
        Just("2>&1"),
        Just("("),
        Just("\\"),
        Just("[a-"),
    ];
    prop_oneof![
        prop::collection::vec(word, 0..10).prop_map(|w| w.join(" ")),
        any::<String>(),
    ]
}

fn arb_args() -> impl Strategy<Value = String> {
    prop_oneof![
        arb_command().prop_map(|c| serde_json::json!({ "command": c }).to_string()),
        (arb_path(), any::<Option<u32>>(), any::<Option<u16>>()).prop_map(|(p, o, l)| {
            let mut v = serde_json::json!({ "path": p });
            if let Some(o) = o {
                v["offset"] = o.into();
            }
            if let Some(l) = l {
                v["limit"] = l.into();
            }
            v.to_string()
        }),
        (arb_path(), ".{0,40}")
            .prop_map(|(p, c)| serde_json::json!({ "path": p, "content": c }).to_string()),
        ".{0,40}".prop_map(|a| serde_json::json!({ "answer": a }).to_string()),
        any::<String>(),
        Just(String::new()),
        Just("{\"command\": null}".to_string()),
    ]
}

#[test]
fn ten_thousand_random_calls_never_panic_or_infra_error() {
    let sb = sandbox();
    let w = std::cell::RefCell::new(ws(&[("a.txt", "alpha\nbeta\n"), ("dir/b.txt", "gamma\n")]));
    let host = w.borrow().host_path().to_string_lossy().into_owned();
    let mut runner = TestRunner::new(Config {
        cases: 10_000,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&(arb_name(), arb_args()), |(name, args)| {
        let o = sb.call(&mut w.borrow_mut(), &name, &args);
        prop_assert_ne!(
            o.result.status,
            ToolStatus::InfraError,
            "{} {} -> {}",
            name,
            args,
            o.text
        );
        prop_assert!(!o.text.contains(&host), "host path in {}", o.text);
        prop_assert!(o.text.len() <= (16 << 10) + 1024);
        prop_assert!(!o.text.contains(char::from(27)), "raw escape in text");
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert_alive(&mut w.borrow_mut());
}
