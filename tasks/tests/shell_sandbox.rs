//! The `shell` family's oracles in the real sandbox, all five kinds (seeds 0..5) at every
//! level: each call gets the planned status, each `shell` output the simulator recorded is
//! byte for byte what the sandbox shows, and the checker passes.

use corvid_proto::ToolStatus;
use corvid_sandbox::Sandbox;
use corvid_tasks::{Episode, Shell, TaskEnv, TaskFamily, Verdict};

#[test]
fn shell_oracles_match_the_sandbox_byte_for_byte() {
    let env = TaskEnv::new(Sandbox::builder().build().expect("sandbox"));
    for seed in 0..5 {
        for level in 1..=Shell.levels() {
            let task = Shell.instance(level, seed).expect("instance");
            let mut ep = Episode::start(&env, &task).expect("episode");
            for (i, step) in task.oracle.steps.iter().enumerate() {
                let out = ep.call(&step.tool_call());
                assert_eq!(out.result.status, step.expect, "{} call {i}", task.id);
                if step.name == "shell" || step.name == "write_file" {
                    assert_eq!(
                        out.text, step.output,
                        "{} call {i}: {}",
                        task.id, step.arguments
                    );
                }
            }
            let out = ep.call(&task.oracle.answer_step().tool_call());
            assert_eq!(out.result.status, ToolStatus::Ok, "{}", task.id);
            assert_eq!(ep.check(), Verdict::Pass, "{}: checker", task.id);
        }
    }
}
