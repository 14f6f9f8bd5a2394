//! Process-reward rules against hand-computed examples.

use corvid_proto::{ToolCall, ToolStatus};
use corvid_tasks::*;

fn call(name: &str, args: &str) -> ToolCall {
    ToolCall {
        name: name.into(),
        arguments_json: args.into(),
    }
}

/// Each call with its status, scored by `rules`.
fn score(rules: &[ProcessRule], calls: &[ToolCall], statuses: &[ToolStatus]) -> Vec<f64> {
    let turns: Vec<ScoredTurn> = calls
        .iter()
        .zip(statuses)
        .map(|(call, status)| ScoredTurn {
            call,
            status: *status,
        })
        .collect();
    score_turns(rules, &turns)
}

#[test]
fn needed_reads_invalid_and_repeated_calls_score_as_hand_computed() {
    let rules = ProcessRule::defaults(vec!["a.txt".into(), "b.txt".into()]);
    let calls = [
        call("read_file", r#"{"path":"a.txt"}"#),    // +0.1 needed
        call("read_file", r#"{"path": "a.txt"}"#), // repeat (same parsed args): -0.05, no second +0.1
        call("read_file", r#"{"path":"x.txt"}"#),  // not needed, not found: 0
        call("read_file", r#"{"pth":"b.txt"}"#),   // invalid: -0.1
        call("shell", r#"{"command":"cat b.txt"}"#), // needed via shell: +0.1
        call("read_file", r#"{"path":"b.txt"}"#),  // already read: 0
        call("read_file", r#"{"path":"c.txt"}"#),  // infra error: 0, forgotten
        call("read_file", r#"{"path":"c.txt"}"#),  // so this is no repeat: 0
    ];
    let st = [
        ToolStatus::Ok,
        ToolStatus::Ok,
        ToolStatus::NotFound,
        ToolStatus::InvalidCall,
        ToolStatus::Ok,
        ToolStatus::Ok,
        ToolStatus::InfraError,
        ToolStatus::Ok,
    ];
    let p = score(&rules, &calls, &st);
    let want = [0.1, -0.05, 0.0, -0.1, 0.1, 0.0, 0.0, 0.0];
    for (i, (a, b)) in p.iter().zip(want).enumerate() {
        assert!((a - b).abs() < 1e-12, "turn {i}: {p:?}");
    }
}

#[test]
fn searches_for_counts_each_term_once_and_unknown_tools_are_invalid() {
    let rules = vec![
        ProcessRule::SearchesFor {
            terms: vec!["Kalo Ver".into()],
            reward: 0.2,
        },
        ProcessRule::InvalidCall { penalty: 0.3 },
    ];
    let calls = [
        call("search", r#"{"query":"kalo ver"}"#),
        call("search", r#"{"query":"Kalo Ver founded"}"#),
        call("browse", r#"{}"#),
    ];
    let st = [ToolStatus::Ok, ToolStatus::Ok, ToolStatus::UnknownTool];
    assert_eq!(score(&rules, &calls, &st), vec![0.2, 0.0, -0.3]);
}

#[test]
fn a_call_repeated_after_a_write_is_no_repeat() {
    let rules = vec![ProcessRule::RepeatCall { penalty: 0.05 }];
    let calls = [
        call("python", r#"{"path":"test_calc.py"}"#),
        call("python", r#"{"path":"test_calc.py"}"#), // failed, nothing changed: -0.05
        call("write_file", r#"{"path":"calc.py","content":"x"}"#),
        call("python", r#"{"path":"test_calc.py"}"#), // after the fix: 0
        call("shell", r#"{"command":"cat calc.py"}"#),
        call("shell", r#"{"command":"cat calc.py"}"#), // a read changes nothing: -0.05
        call("shell", r#"{"command":"sed -i s/x/y/ calc.py"}"#),
        call("shell", r#"{"command":"cat calc.py"}"#), // after sed -i: 0
        call("write_file", r#"{"path":"/etc","content":"x"}"#),
        call("shell", r#"{"command":"cat calc.py"}"#), // the write failed: -0.05
    ];
    let st = [
        ToolStatus::ExitNonzero,
        ToolStatus::ExitNonzero,
        ToolStatus::Ok,
        ToolStatus::Ok,
        ToolStatus::Ok,
        ToolStatus::Ok,
        ToolStatus::Ok,
        ToolStatus::Ok,
        ToolStatus::PermissionDenied,
        ToolStatus::Ok,
    ];
    assert_eq!(
        score(&rules, &calls, &st),
        vec![0.0, -0.05, 0.0, 0.0, 0.0, -0.05, 0.0, 0.0, 0.0, -0.05]
    );
}
