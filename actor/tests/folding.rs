//! Context folding in the engine: an episode that outgrows its window goes on in new segments
//! rebuilt from the prompt, the carried memory and the recent turns. Each segment's ids are
//! exactly what the policy saw (every recorded log-prob is a full forward over its segment),
//! an oracle still passes its checker across the folds, `drop_tool_output` replaces earlier
//! outputs with the marker, `notes` carries the file the policy wrote, `summary` asks for a
//! summary turn and carries it, recorded routes start again with each segment, a model's own
//! chat template folds without diverging from its rendering, the episode's budget bounds its
//! segments, a fold that cannot make room ends the episode as `context_full`, and so does a
//! full window under `none`.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use corvid_actor::{run_episodes, EngineConfig, EpisodeSpec, LoadedPolicy, ScriptedTokens};
use corvid_episode::fold::{DROPPED_OUTPUT, MEMORY_HEADING, SUMMARY_REQUEST};
use corvid_episode::{oracle_steps_folded, ChatFormat, EpisodeFormat, Mistakes, ToolCallSyntax};
use corvid_model::ModelConfig;
use corvid_proto::{ContextFold, Fold, StepRules, Termination, Trajectory};
use corvid_tasks::{TaskInstance, ToolSpec};

const WINDOW: u32 = 1024;

fn cfg(record_routes: bool) -> EngineConfig {
    EngineConfig {
        max_concurrency: 2,
        tool_timeout: Duration::from_secs(30),
        record_routes,
        ..EngineConfig::default()
    }
}

/// An episode of `task` in a window of [`WINDOW`] tokens folding by `fold`, with a budget of
/// 64K tokens over its segments.
fn folding(id: &str, task: Arc<TaskInstance>, fold: Fold, max_new: u32) -> EpisodeSpec {
    let mut spec = EpisodeSpec::new(id, task, sampling(max_new, 11));
    spec.context_budget = 65_536;
    spec.max_turns = 40;
    spec.context = Some(ContextFold {
        window_tokens: WINDOW,
        fold,
        memory_tokens: 96,
        notes_path: "notes.md".into(),
    });
    spec
}

/// hops level 5 (seven reads, ~1.7K tokens) with `write_file` allowed, so a policy can keep
/// notes.
fn long_task() -> Arc<TaskInstance> {
    let mut t = (*task("hops", 5, 3)).clone();
    t.tools.push(ToolSpec::unlimited("write_file"));
    Arc::new(t)
}

/// The oracle's turns in the byte layout, after `before`.
fn oracle_turns(task: &TaskInstance, before: Vec<Vec<u32>>) -> Vec<Vec<u32>> {
    oracle_turns_in(&EpisodeFormat::default(), task, before)
}

/// The oracle's turns in `format`, after `before`.
fn oracle_turns_in(
    format: &EpisodeFormat,
    task: &TaskInstance,
    before: Vec<Vec<u32>>,
) -> Vec<Vec<u32>> {
    let oracle = task
        .oracle
        .steps
        .iter()
        .cloned()
        .chain(std::iter::once(task.oracle.answer_step()))
        .map(|s| format.call_ids(&s.name, &s.arguments).unwrap());
    before.into_iter().chain(oracle).collect()
}

/// The text of each segment's opening context (its first step's context tokens).
fn openings(t: &Trajectory) -> Vec<String> {
    openings_in(&EpisodeFormat::default(), t)
}

/// [`openings`] in `format`.
fn openings_in(format: &EpisodeFormat, t: &Trajectory) -> Vec<String> {
    t.segments()
        .into_iter()
        .map(|r| {
            let s = &t.steps[r.start];
            let ctx: Vec<u32> = s
                .token_ids
                .iter()
                .zip(&s.loss_mask)
                .take_while(|(_, m)| !**m)
                .map(|(id, _)| *id)
                .collect();
            format.decode(&ctx)
        })
        .collect()
}

/// What holds for every folded trajectory: valid, steps in segments 0, 1, … in order, each
/// within the window, each opening with the task's prompt, every log-prob a full forward over
/// its own segment.
fn assert_folded(t: &Trajectory, policy: &LoadedPolicy, folds_at_least: usize) {
    assert_folded_in(&EpisodeFormat::default(), t, policy, folds_at_least, WINDOW);
}

/// [`assert_folded`] in `format`.
fn assert_folded_in(
    format: &EpisodeFormat,
    t: &Trajectory,
    policy: &LoadedPolicy,
    folds_at_least: usize,
    window: u32,
) {
    assert_valid(t);
    let mut rules = StepRules::new(t.header.routes, None);
    for (seq, s) in t.steps.iter().enumerate() {
        rules.check(seq as u64, s).unwrap();
    }
    let segments = t.segments();
    assert!(
        segments.len() > folds_at_least,
        "{}: {} segments",
        t.header.trajectory_id,
        segments.len()
    );
    for (i, r) in segments.iter().enumerate() {
        let tokens: usize = t.steps[r.clone()].iter().map(|s| s.token_ids.len()).sum();
        assert!(tokens <= window as usize, "segment {i}: {tokens} tokens");
    }
    let prompt = &t.steps[0];
    let task_line = format.decode(&prompt.token_ids[..prompt.token_ids.len().min(40)]);
    for (i, o) in openings_in(format, t).iter().enumerate() {
        assert!(o.starts_with(&task_line), "segment {i} opens with {o:?}");
    }
    let err = max_logprob_error(policy.model(), t, 1.0);
    assert!(
        err < 1e-4,
        "{}: log-prob error {err}",
        t.header.trajectory_id
    );
}

#[test]
fn an_oracle_folds_its_context_and_still_passes_under_each_fold() {
    let mut policy = random_policy(1);
    let env = env();
    let task = long_task();
    let notes = EpisodeFormat::default()
        .call_ids(
            "write_file",
            &serde_json::json!({"path": "notes.md", "content": "start at the prompt's file"}),
        )
        .unwrap();
    let with_notes = oracle_turns(&task, vec![notes]);
    let plain = oracle_turns(&task, Vec::new());
    let longest = with_notes.iter().map(Vec::len).max().unwrap() as u32;
    let chooser = ScriptedTokens::new()
        .with_episode("drop", plain.clone())
        .with_episode("notes", with_notes.clone());
    let specs = vec![
        folding("drop", task.clone(), Fold::DropToolOutput, longest + 4),
        folding("notes", task.clone(), Fold::Notes, longest + 4),
    ];
    let (trajs, _) = run_episodes(
        &mut policy,
        &env,
        specs,
        cfg(false),
        Some(Box::new(chooser)),
    )
    .unwrap();
    for t in &trajs {
        let id = t.header.trajectory_id.as_str();
        assert_eq!(t.footer.termination, Termination::Answered, "{id}");
        assert!(t.footer.success, "{id}: the oracle passes across folds");
        assert_folded(t, &policy, 2);
        let openings = openings(t);
        for o in &openings[1..] {
            match id {
                "drop" => {
                    assert!(!o.contains(MEMORY_HEADING), "{o}");
                    // Every kept output but the latest is the marker.
                    let tools = o.matches("<|tool|>").count();
                    assert_eq!(o.matches(DROPPED_OUTPUT).count(), tools - 1, "{o}");
                }
                _ => assert!(
                    o.contains(&format!("{MEMORY_HEADING}\nstart at the prompt's file")),
                    "{o}"
                ),
            }
        }
        // Every turn the oracle made is in the trajectory once, in order.
        let generated: Vec<Vec<u32>> = t.steps.iter().map(|s| s.generated_ids()).collect();
        let want = if id == "drop" { &plain } else { &with_notes };
        assert_eq!(&generated, want, "{id}");
    }
    // The oracle's demonstration folds at the same turns into the same ids (SFT shows the
    // policy the segments it will see).
    let drop = trajs
        .iter()
        .find(|t| t.header.trajectory_id == "drop")
        .unwrap();
    let spec = folding("drop", task.clone(), Fold::DropToolOutput, longest + 4);
    let demo = oracle_steps_folded(
        &EpisodeFormat::default(),
        &env,
        &task,
        Mistakes::NONE,
        (spec.context.as_ref().unwrap(), longest as usize + 4),
    )
    .unwrap();
    assert_eq!(demo.steps.len(), drop.steps.len());
    for (a, d) in drop.steps.iter().zip(&demo.steps) {
        assert_eq!(
            (a.segment, &a.token_ids),
            (d.segment, &d.token_ids),
            "turn {}",
            a.turn
        );
    }
}

#[test]
fn a_summary_fold_asks_for_a_summary_turn_and_carries_it() {
    let mut policy = random_policy(1);
    let env = env();
    let spec = folding("sum", long_task(), Fold::Summary, 48);
    let (trajs, _) = run_episodes(&mut policy, &env, vec![spec], cfg(true), None).unwrap();
    let t = &trajs[0];
    assert_folded(t, &policy, 2);
    let format = EpisodeFormat::default();
    let segments = t.segments();
    for pair in segments.windows(2) {
        // The segment's last step is the summary turn: its context asked for it, it made no
        // call, and its text is the next segment's memory.
        let last = &t.steps[pair[0].end - 1];
        let text = format.decode(&last.token_ids);
        assert!(text.contains(SUMMARY_REQUEST), "{text}");
        assert!(last.tool_call.is_none());
        let summary = last.generated_ids();
        assert!(summary.len() <= 96);
        let opening = &openings(t)[segments.iter().position(|r| r == &pair[1]).unwrap()];
        let memory = format.turn_text(&summary);
        assert!(
            opening.contains(&format!("{MEMORY_HEADING}\n{memory}")),
            "{opening}"
        );
    }
    // Summary turns are not counted against max_turns: the episode ran 40 other turns.
    let summaries = segments.len() - 1;
    assert_eq!(t.footer.termination, Termination::MaxTurns);
    assert_eq!(t.steps.len(), 40 + summaries);
}

#[test]
fn without_a_fold_a_full_window_ends_the_episode() {
    let mut policy = random_policy(1);
    let spec = folding("none", long_task(), Fold::None, 48);
    let (trajs, _) = run_episodes(&mut policy, &env(), vec![spec], cfg(false), None).unwrap();
    let t = &trajs[0];
    assert_valid(t);
    assert_eq!(t.footer.termination, Termination::ContextFull);
    assert_eq!(t.segments().len(), 1);
    assert!(t.len() <= WINDOW as usize);
}

/// The chat-template fixture's layout (`tokenizer/tests/fixtures/chatml_tools`), and a random
/// policy of the test config with its vocabulary.
fn chat_policy() -> (EpisodeFormat, LoadedPolicy) {
    let fixture =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/tests/fixtures/chatml_tools");
    let format =
        EpisodeFormat::chat(ChatFormat::from_folder(&fixture, ToolCallSyntax::Hermes).unwrap());
    tch::manual_seed(11);
    let cfg = ModelConfig {
        vocab_size: i64::from(format.vocab_size()),
        ..test_model_config()
    };
    let mut policy = LoadedPolicy::random(&cfg, tch::Device::Cpu).unwrap();
    policy.set_version(1);
    (format, policy)
}

#[test]
fn a_models_own_template_folds_and_each_segment_is_its_rendering() {
    let (format, mut policy) = chat_policy();
    let task = long_task();
    let turns = oracle_turns_in(&format, &task, Vec::new());
    let longest = turns.iter().map(Vec::len).max().unwrap() as u32;
    let mut spec = folding("chat", task, Fold::DropToolOutput, longest + 4);
    // The template's prompt, its tools declared in JSON, is ~900 tokens.
    spec.context.as_mut().unwrap().window_tokens = 1536;
    let chooser = ScriptedTokens::new().with_episode("chat", turns);
    let cfg = EngineConfig {
        format: format.clone(),
        ..cfg(true)
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
    assert_eq!(t.footer.termination, Termination::Answered);
    assert!(t.footer.success);
    assert_folded_in(&format, t, &policy, 1, 1536);
    // Every segment, folded away or last, renders as the template renders its conversation.
    assert!(!t.footer.template_divergent);
    for o in &openings_in(&format, t)[1..] {
        let tools = o.matches("<tool_response>").count();
        assert!(tools >= 1, "the latest output is kept: {o}");
        assert_eq!(
            o.matches(DROPPED_OUTPUT).count(),
            tools.saturating_sub(1),
            "{o}"
        );
    }
}

#[test]
fn the_episodes_budget_bounds_its_segments_and_a_fold_without_room_ends_it() {
    let mut policy = random_policy(1);
    // A budget of 1.5 windows: the episode folds once, then ends when the budget is spent.
    let mut spec = folding("budget", long_task(), Fold::DropToolOutput, 48);
    spec.context_budget = WINDOW * 3 / 2;
    // keychain level 12 parts are longer than the window: the first read cannot be folded in.
    let big = task("keychain", 12, 1);
    let read = EpisodeFormat::default()
        .call_ids(
            "read_file",
            &serde_json::json!({"path": "chain/part-01.txt"}),
        )
        .unwrap();
    let mut no_room = folding("no-room", big, Fold::DropToolOutput, read.len() as u32 + 4);
    no_room.max_turns = 4;
    let chooser = ScriptedTokens::new().with_episode("no-room", vec![read]);
    let (trajs, _) = run_episodes(
        &mut policy,
        &env(),
        vec![spec, no_room],
        cfg(false),
        Some(Box::new(chooser)),
    )
    .unwrap();
    for t in &trajs {
        assert_valid(t);
        assert_eq!(
            t.footer.termination,
            Termination::ContextFull,
            "{}",
            t.header.trajectory_id
        );
    }
    let budget = trajs
        .iter()
        .find(|t| t.header.trajectory_id == "budget")
        .unwrap();
    assert_eq!(budget.segments().len(), 2);
    assert!(budget.len() <= (WINDOW * 3 / 2) as usize);
    let no_room = trajs
        .iter()
        .find(|t| t.header.trajectory_id == "no-room")
        .unwrap();
    assert_eq!(no_room.segments().len(), 1);
    assert_eq!(no_room.steps.len(), 1, "the part's text fills the window");
}
