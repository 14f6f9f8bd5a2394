//! Every class of tool failure reaches the model as a tool message naming the error, and
//! the episode goes on: the engine is driven by scripted tokens through the real decode,
//! parse, sandbox and context path, then answers correctly and passes.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use corvid_actor::{run_episodes, EngineConfig, EpisodeSpec, ScriptedTokens};
use corvid_episode::EpisodeFormat;
use corvid_proto::{Termination, ToolStatus};
use corvid_tasks::ToolLimits;
use corvid_tokenizer::Special;
use serde_json::json;

const MAX_NEW: u32 = 160;

/// What turn `t`'s tool message must say, and the status recorded for it (`None`: the
/// call did not parse, so no tool ran).
struct Case {
    tokens: Vec<u32>,
    status: Option<&'static [ToolStatus]>,
    says: &'static [&'static str],
}

#[test]
fn each_tool_failure_class_becomes_a_tool_message_and_the_episode_goes_on() {
    let format = EpisodeFormat::default();
    let tok = corvid_tokenizer::ByteTokenizer::new();
    // Seed 5: the `count` kind (seed mod 5 = 0), judged on the answer alone.
    let mut inst = (*task("shell", 1, 5)).clone();
    // Cut shell output for display at 120 bytes so truncation is cheap to provoke.
    for t in &mut inst.tools {
        if t.name == "shell" {
            t.limits = ToolLimits {
                max_calls: None,
                max_output_bytes: Some(120),
            };
        }
    }
    let inst = Arc::new(inst.seal());
    let answer = inst.oracle.answer.clone();
    let call = |name: &str, args: serde_json::Value| format.call_ids(name, &args).unwrap();
    let mut malformed = vec![Special::ToolCallOpen.id()];
    malformed.extend(tok.encode_plain(r#"{"name": "shell", "arguments": {"command": "#));
    malformed.push(Special::ToolCallClose.id());
    let mut no_call = tok.encode_plain("I think I should look around first.");
    no_call.push(Special::End.id());
    let mut unclosed = vec![Special::ToolCallOpen.id()];
    unclosed.extend(tok.encode_plain(&"a".repeat(MAX_NEW as usize - 1)));
    let limit_classes: &'static [ToolStatus] = &[
        ToolStatus::Timeout,
        ToolStatus::ComputeBudget,
        ToolStatus::MemoryLimit,
        ToolStatus::OutputTruncated,
    ];
    let cases = vec![
        Case {
            tokens: malformed,
            status: None,
            says: &["invalid_call", "not valid JSON"],
        },
        Case {
            tokens: call("frobnicate", json!({"x": 1})),
            status: Some(&[ToolStatus::UnknownTool]),
            says: &["unknown_tool", "frobnicate"],
        },
        Case {
            tokens: call("read_file", json!({"paht": "x"})),
            status: Some(&[ToolStatus::InvalidCall]),
            says: &["invalid_call"],
        },
        Case {
            tokens: call("read_file", json!({"path": "no/such/file.txt"})),
            status: Some(&[ToolStatus::NotFound]),
            says: &["not_found"],
        },
        Case {
            tokens: call("shell", json!({"command": "cat no_such_file"})),
            status: Some(&[ToolStatus::ExitNonzero]),
            says: &["no_such_file"],
        },
        Case {
            tokens: call("shell", json!({"command": "seq 1 500"})),
            status: Some(&[ToolStatus::OutputTruncated]),
            says: &["[output truncated]"],
        },
        Case {
            tokens: call("shell", json!({"command": "seq 1 100000000"})),
            status: Some(limit_classes),
            says: &[],
        },
        Case {
            tokens: no_call,
            status: None,
            says: &["invalid_call", "no tool call"],
        },
        Case {
            tokens: unclosed,
            status: None,
            says: &["invalid_call", "not closed"],
        },
    ];
    let mut turns: Vec<Vec<u32>> = cases.iter().map(|c| c.tokens.clone()).collect();
    turns.push(call("answer", json!({"answer": answer})));
    let mut spec = EpisodeSpec::new("failures", inst, sampling(MAX_NEW, 3));
    spec.max_turns = turns.len() as u32 + 1;
    spec.context_budget = 4096;
    let chooser = ScriptedTokens::new().with_episode("failures", turns.clone());
    let mut policy = random_policy(1);
    let cfg = EngineConfig {
        max_concurrency: 1,
        tool_timeout: Duration::from_secs(60),
        ..EngineConfig::default()
    };
    let (trajs, _) = run_episodes(
        &mut policy,
        &env(),
        vec![spec],
        cfg,
        Some(Box::new(chooser)),
    )
    .unwrap();
    let t = &trajs[0];
    assert_valid(t);
    assert_eq!(
        t.steps.len(),
        turns.len(),
        "one step per turn, none skipped"
    );
    for (i, case) in cases.iter().enumerate() {
        let step = &t.steps[i];
        let generated: Vec<u32> = step
            .token_ids
            .iter()
            .zip(&step.loss_mask)
            .filter(|(_, m)| **m)
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(
            generated, case.tokens,
            "turn {i}: generated what was scripted"
        );
        match case.status {
            None => {
                assert!(
                    step.tool_call.is_none() && step.tool_result.is_none(),
                    "turn {i}"
                );
                assert!(
                    step.process_reward < 0.0,
                    "turn {i}: invalid turns are penalised"
                );
            }
            Some(allowed) => {
                let got = step.tool_result.expect("a tool ran").status;
                let said = tok.decode(&t.steps[i + 1].token_ids);
                assert!(
                    allowed.contains(&got),
                    "turn {i}: status {got}, want {allowed:?}: {said}"
                );
            }
        }
        // The next step's context is the tool message the model read.
        let next = &t.steps[i + 1];
        let ctx: Vec<u32> = next
            .token_ids
            .iter()
            .zip(&next.loss_mask)
            .filter(|(_, m)| !**m)
            .map(|(t, _)| *t)
            .collect();
        let text = tok.decode(&ctx);
        assert!(text.contains("<|tool|>"), "turn {i}: {text}");
        for s in case.says {
            assert!(
                text.contains(s),
                "turn {i}: tool message {text:?} lacks {s:?}"
            );
        }
        if let Some(r) = step.tool_result {
            if !r.status.is_success() {
                assert!(
                    text.contains(r.status.as_str()) || r.status == ToolStatus::ExitNonzero,
                    "turn {i}: the message names {}: {text:?}",
                    r.status
                );
            }
        }
    }
    assert_eq!(t.footer.termination, Termination::Answered);
    assert!(
        t.footer.success,
        "the episode recovered and solved the task"
    );
}
