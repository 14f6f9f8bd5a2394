//! Tests of `corvid replay`: stores of hops episodes made from the oracle (as they are, or
//! changed as a test needs), run through the subcommands and their parts.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use corvid_episode::{oracle_steps, EpisodeFormat};
use corvid_learner::train::batch::turn_advantages;
use corvid_proto::{
    RouteShape, SamplingParams, Step, Termination, Trajectory, TrajectoryFooter, TrajectoryHeader,
};
use corvid_store::{Begin, Filter, TrajectoryRecord, TrajectoryStore};
use corvid_tasks::{Families, TaskEnv};
use corvid_tokenizer::Special;

use super::advantages::{group_advantages, load_rl, run_rl_config, Advantages, RunRl};
use super::export::export_chat;
use super::rescore::{rescore, Skip};
use super::show::{write_transcript, Detail};
use super::{open, run, run_to, ReplayArgs};

/// How a stored member of [`store_episodes`]'s group differs from the oracle episode.
#[derive(Clone, Copy, PartialEq)]
enum Member {
    /// The oracle episode as it is: a success.
    Oracle,
    /// The final answer replaced by a wrong one: a failure.
    WrongAnswer,
    /// Cut off by actor shutdown: no verdict.
    Abandoned,
    /// Stored under another task-generator spec than today's.
    OldSpec,
    /// The oracle episode with turn 1 split into two steps of the same turn index, as
    /// an actor splits a turn longer than its step limit.
    SplitTurn,
    /// The oracle episode with the first character of the tool output read back at turn
    /// 1 changed (same length, same status: only the text tells).
    ForgedOutput,
    /// A failed second copy of the group's first episode (its sampler seed), as an
    /// actor taken for gone delivers it late.
    SecondCopy,
    /// The oracle episode folded before its last turn (`drop_tool_output`): the answer turn
    /// opens segment 1 with the prompt and both reads, the first read's output dropped.
    Folded,
}

/// `steps` (the oracle episode of `task`) folded before its last turn as an actor folds with
/// `drop_tool_output`: the last step opens segment 1 with the prompt and every earlier turn.
fn fold_before_last(
    steps: Vec<Step>,
    env: &TaskEnv,
    task: &corvid_tasks::TaskInstance,
) -> Vec<Step> {
    use corvid_episode::fold::{segment, FoldedTurn};
    let format = EpisodeFormat::default();
    let context = |s: &Step| -> Vec<u32> {
        s.token_ids
            .iter()
            .zip(&s.loss_mask)
            .take_while(|(_, m)| !**m)
            .map(|(id, _)| *id)
            .collect()
    };
    let last = steps.len() - 1;
    let turns: Vec<FoldedTurn> = (0..last)
        .map(|t| FoldedTurn {
            generated: steps[t].generated_ids(),
            result: format.tool_result_text(&context(&steps[t + 1]), steps[t].tool_call.as_ref()),
        })
        .collect();
    let base = format.conversation(env, task);
    let opening = segment(
        &format,
        &base,
        corvid_proto::Fold::DropToolOutput,
        None,
        &turns,
    )
    .expect("segment")
    .ids;
    let mut steps = steps;
    let s = &mut steps[last];
    let gen = s.generated_ids();
    let n = opening.len();
    s.token_ids = opening;
    s.token_ids.extend_from_slice(&gen);
    s.loss_mask = vec![false; n];
    s.loss_mask.extend(std::iter::repeat_n(true, gen.len()));
    s.logprobs = vec![0.0; s.token_ids.len()];
    s.segment = 1;
    steps
}

/// `steps` with turn 1 split in two steps: the first holds half its context, the second
/// the rest, the call, its result and the process reward (as the actor splits a turn).
fn split_turn_1(mut steps: Vec<Step>) -> Vec<Step> {
    let i = steps.iter().position(|s| s.turn == 1).expect("turn 1");
    let whole = steps.remove(i);
    let k = whole.loss_mask.iter().position(|m| *m).expect("generated") / 2;
    assert!(k > 0, "turn 1 has a context to split");
    let mut first = whole.clone();
    first.token_ids.truncate(k);
    first.loss_mask.truncate(k);
    first.logprobs.truncate(k);
    first.policy_version = 0;
    first.tool_call = None;
    first.tool_result = None;
    first.process_reward = 0.0;
    let mut rest = whole;
    rest.token_ids.drain(..k);
    rest.loss_mask.drain(..k);
    rest.logprobs.drain(..k);
    steps.insert(i, rest);
    steps.insert(i, first);
    steps
}

/// `steps` with the first character of turn 1's tool text replaced by another ASCII one.
fn forge_output(mut steps: Vec<Step>) -> Vec<Step> {
    let s = steps.iter_mut().find(|s| s.turn == 1).expect("turn 1");
    let at = 1 + s
        .token_ids
        .iter()
        .position(|&t| t == Special::Tool.id())
        .expect("a tool message");
    let c = s.token_ids[at];
    assert!(c < 128, "an ASCII character");
    s.token_ids[at] = if c == u32::from(b'x') {
        u32::from(b'y')
    } else {
        u32::from(b'x')
    };
    steps
}

/// Stores the oracle episode of hops/L2/s4 twice in one group: once as it is (success)
/// and once with the final answer replaced by a wrong one (failure).
fn store_group(dir: &Path) -> (Arc<TrajectoryStore>, TaskEnv) {
    store_episodes(
        dir,
        &[("good", Member::Oracle), ("bad", Member::WrongAnswer)],
    )
}

/// Stores one group of hops/L2/s4 episodes, each made from the oracle episode as
/// `members` says.
fn store_episodes(dir: &Path, members: &[(&str, Member)]) -> (Arc<TrajectoryStore>, TaskEnv) {
    let store = Arc::new(TrajectoryStore::open(dir.join("store")).expect("store"));
    let env = TaskEnv::new(
        corvid_sandbox::Sandbox::builder()
            .search_tool(true)
            .build()
            .expect("sandbox"),
    );
    let format = EpisodeFormat::default();
    let task = corvid_tasks::builtin_family("hops")
        .expect("hops")
        .instance(2, 4)
        .expect("task");
    for (i, &(id, member)) in members.iter().enumerate() {
        let wrong = matches!(member, Member::WrongAnswer | Member::SecondCopy);
        let mut task = task.clone();
        if wrong {
            task.oracle.answer = "12345678".into();
        }
        let demo = oracle_steps(&format, &env, &task).expect("demo");
        let mut task_ref = task.task_ref();
        if member == Member::OldSpec {
            task_ref.spec_hash = "0123456789abcdef".into();
        }
        let header = TrajectoryHeader {
            trajectory_id: id.into(),
            task: task_ref,
            actor_id: "test".into(),
            policy_version: 0,
            sampling: SamplingParams {
                temperature: 1.0,
                top_p: 1.0,
                max_new_tokens: 256,
                // Episode i's own seed; a second copy repeats the first's.
                seed: if member == Member::SecondCopy {
                    1
                } else {
                    i as u64 + 1
                },
            },
            group_id: "g1".into(),
            started_unix_ms: 0,
            routes: None,
            context: None,
        };
        let Begin::New(mut w) = store.begin(header).expect("begin") else {
            panic!("duplicate")
        };
        let success = demo.verdict.passed();
        let steps = match member {
            Member::SplitTurn => split_turn_1(demo.steps),
            Member::ForgedOutput => forge_output(demo.steps),
            Member::Folded => fold_before_last(demo.steps, &env, &task),
            _ => demo.steps,
        };
        let tokens: usize = steps.iter().map(|s| s.token_ids.len()).sum();
        let generated: usize = steps.iter().map(|s| s.generated_count()).sum();
        let n = steps.len();
        for (seq, step) in steps.into_iter().enumerate() {
            w.append(seq as u64, step).expect("append");
        }
        assert_eq!(success, !wrong);
        w.finish_blocking(TrajectoryFooter {
            outcome_reward: if success { 1.0 } else { 0.0 },
            success,
            termination: if member == Member::Abandoned {
                Termination::Abandoned
            } else {
                Termination::Answered
            },
            step_count: n as u64,
            token_count: tokens as u64,
            generated_token_count: generated as u64,
            wall_ms: 1,
            finished_unix_ms: 1,
            template_divergent: false,
        })
        .expect("finish");
    }
    (store, env)
}

#[test]
fn list_keeps_its_columns_under_their_headers_whatever_the_id() {
    let dir = tempfile::tempdir().expect("tmp");
    let long = "an-evaluation-label.hops.L2.s4611686018427387904.k0";
    let (store, _env) = store_episodes(
        dir.path(),
        &[("short", Member::Oracle), (long, Member::WrongAnswer)],
    );
    drop(store);
    let store = dir.path().join("store");
    let (status, text) = run_captured(&["replay", "list", "--store", store.to_str().unwrap()]);
    assert_eq!(status.expect("lists"), ExitCode::SUCCESS);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    // Each column ends where its header does; family/level and the id come last.
    let end_of = |line: &str, word: &str| line.find(word).map(|i| i + word.len());
    let reward_end = end_of(lines[0], "reward").expect("header");
    for (row, id, reward) in [(lines[1], "short", "1.000"), (lines[2], long, "0.000")] {
        assert_eq!(end_of(row, reward), Some(reward_end), "{text}");
        assert!(
            row.ends_with(&format!("  hops/2{} {id}", " ".repeat(10))),
            "{text}"
        );
    }
}

#[test]
fn rescore_reproduces_stored_results_and_verdicts() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, env) = store_group(dir.path());
    let families = Families::new(&[]).expect("families");
    for id in ["good", "bad"] {
        let rec = store.get(id).expect("get").expect("stored");
        let r = rescore(&store, &env, &families, &EpisodeFormat::default(), &rec).expect("rescore");
        assert_eq!(r.calls, 3, "{id}: two reads and the answer");
        assert!(r.diverged.is_empty(), "{id}: {:?}", r.diverged);
        assert_eq!(r.rescored, Some(id == "good"), "{id}: {}", r.note);
        assert!(!r.verdict_differs());
    }
    // A stored outcome that the checker does not reproduce is flagged.
    let mut rec = store.get("bad").expect("get").expect("stored");
    if let Some(f) = rec.footer.as_mut() {
        f.success = true;
    }
    let r = rescore(&store, &env, &families, &EpisodeFormat::default(), &rec).expect("rescore");
    assert!(r.verdict_differs());
}

#[test]
fn rescore_exits_0_when_verdicts_match_and_2_when_it_cannot_rescore() {
    let dir = tempfile::tempdir().expect("tmp");
    drop(store_group(dir.path()));
    let path = dir.path().join("store");
    let path = path.to_str().expect("utf8");
    let status = |extra: &[&str]| {
        let mut argv = vec!["replay", "rescore", "--store", path];
        argv.extend_from_slice(extra);
        run(parse(&argv)).expect("an exit status")
    };
    assert_eq!(status(&[]), ExitCode::SUCCESS);
    assert_eq!(status(&["--id", "no-such-trajectory"]), ExitCode::from(2));
}

#[test]
fn a_folder_without_a_store_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().expect("tmp");
    drop(store_group(&dir.path().join("run")));
    let refused = |path: &Path| match open(path) {
        Ok(_) => panic!("{} opened as a store", path.display()),
        Err(e) => e,
    };
    // The run folder, not its store/: refused, pointing at store/, and nothing written.
    let run = dir.path().join("run");
    let before: Vec<_> = std::fs::read_dir(&run).expect("ls").collect();
    let err = format!("{:#}", refused(&run));
    assert!(err.contains("did you mean"), "{err}");
    assert!(
        err.contains(&run.join("store").display().to_string()),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&run).expect("ls").count(), before.len());
    let err = format!("{:#}", refused(&dir.path().join("nowhere")));
    assert!(err.contains("does not exist"), "{err}");
    let file = dir.path().join("file");
    std::fs::write(&file, "x").expect("write");
    let err = format!("{:#}", refused(&file));
    assert!(err.contains("is a file"), "{err}");
    assert!(open(&run.join("store")).is_ok());
}

#[test]
fn rescore_skips_unscored_trajectories_and_exits_2_for_one_it_cannot_rescore() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, env) = store_episodes(
        dir.path(),
        &[
            ("good", Member::Oracle),
            ("cut", Member::Abandoned),
            ("old", Member::OldSpec),
        ],
    );
    let families = Families::new(&[]).expect("families");
    let rescored = |id: &str| {
        let rec = store.get(id).expect("get").expect("stored");
        rescore(&store, &env, &families, &EpisodeFormat::default(), &rec).expect("rescore")
    };
    assert_eq!(rescored("good").skipped, None);
    let cut = rescored("cut");
    assert_eq!((cut.skipped, cut.calls), (Some(Skip::NotScored), 0));
    let old = rescored("old");
    assert_eq!((old.skipped, old.calls), (Some(Skip::SpecChanged), 0));
    assert!(old.note.contains("task generator changed"), "{}", old.note);
    drop((store, env));
    let path = dir.path().join("store");
    let path = path.to_str().expect("utf8");
    let status = |id: &str| {
        let argv = ["replay", "rescore", "--store", path, "--id", id];
        run(parse(&argv)).expect("an exit status")
    };
    assert_eq!(status("good"), ExitCode::SUCCESS);
    assert_eq!(status("cut"), ExitCode::SUCCESS, "nothing to compare");
    assert_eq!(status("old"), ExitCode::from(2), "could not re-score");
}

/// The command line `argv` (after `corvid`) parsed as `corvid replay` parses it.
fn parse(argv: &[&str]) -> ReplayArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        replay: ReplayArgs,
    }
    Cli::try_parse_from(argv).expect("arguments").replay
}

/// The command line `argv` (after `corvid`) run as `corvid replay` does, its standard
/// output captured.
fn run_captured(argv: &[&str]) -> (Result<ExitCode>, String) {
    let args = parse(argv);
    let mut out = Vec::new();
    let status = run_to(args, &mut out);
    (status, String::from_utf8(out).expect("utf8"))
}

fn stored_steps(store: &TrajectoryStore, id: &str) -> Vec<Step> {
    super::stored_steps(store, id).expect("steps")
}

/// `id` as the trainer reads it.
fn training_trajectory(store: &TrajectoryStore, id: &str) -> Trajectory {
    let rec = store.get(id).expect("get").expect("stored");
    Trajectory {
        header: rec.header,
        footer: rec.footer.expect("finished"),
        steps: stored_steps(store, id),
    }
}

fn rl_from(path: &Path, toml: &str) -> RunRl {
    std::fs::write(path, toml).expect("config");
    load_rl(path).expect("rl config")
}

/// What `replay show` prints for `rec` with `steps` and `advantages`.
fn shown(rec: &TrajectoryRecord, steps: &[Step], advantages: &Advantages) -> String {
    let mut text = Vec::new();
    write_transcript(
        &mut text,
        &EpisodeFormat::default(),
        rec,
        steps,
        advantages,
        Detail::default(),
    )
    .expect("show");
    String::from_utf8(text).expect("utf8")
}

/// `replay show --routes` prints a line per token but the first: the experts each MoE layer
/// chose for the input before it, at its position in the trajectory.
#[test]
fn show_routes_prints_each_tokens_experts_per_layer() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _env) = store_group(dir.path());
    let mut rec = store.get("good").expect("get").expect("stored");
    let mut steps = stored_steps(&store, "good");
    let shape = RouteShape {
        moe_layers: 2,
        experts_per_token: 2,
        routed_experts: 8,
    };
    rec.header.routes = Some(shape);
    let mut next = 0u16;
    for (seq, s) in steps.iter_mut().enumerate() {
        let rows = RouteShape::rows_of(s.token_ids.len(), seq == 0);
        let ids: Vec<u16> = (0..rows * 4)
            .map(|_| {
                next = (next + 3) % 8;
                next
            })
            .collect();
        s.routes = shape.pack(&ids);
    }
    let none = group_advantages(&store, &rec, None).expect("adv");
    let mut text = Vec::new();
    let detail = Detail {
        full: false,
        routes: true,
    };
    write_transcript(
        &mut text,
        &EpisodeFormat::default(),
        &rec,
        &steps,
        &none,
        detail,
    )
    .expect("show");
    let text = String::from_utf8(text).expect("utf8");
    assert!(
        text.contains("routes: 2 MoE layers × 2 of 8 experts per token"),
        "{text}"
    );
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("route |")).collect();
    let total: usize = steps.iter().map(|s| s.token_ids.len()).sum();
    assert_eq!(lines.len(), total - 1);
    // The first row is position 1's: ids 3 6 | 1 4.
    let first = steps[0].token_ids[1];
    assert!(
        lines[0].contains(&format!("     1 {first:>6}")) && lines[0].ends_with("[3 6] [1 4]"),
        "{}",
        lines[0]
    );
    // Without recorded routes it says so.
    let plain = store.get("good").expect("get").expect("stored");
    let mut text = Vec::new();
    write_transcript(
        &mut text,
        &EpisodeFormat::default(),
        &plain,
        &stored_steps(&store, "good"),
        &none,
        detail,
    )
    .expect("show");
    assert!(String::from_utf8(text)
        .expect("utf8")
        .contains("routes: none recorded"));
}

#[test]
fn advantages_favour_the_successful_member_of_the_group() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _env) = store_group(dir.path());
    let rl = rl_from(
        &dir.path().join("learner.toml"),
        "[rl]\nnormalize_step_advantages = true\n",
    );
    let good = store.get("good").expect("get").expect("stored");
    let bad = store.get("bad").expect("get").expect("stored");
    let a_good = group_advantages(&store, &good, Some(&rl)).expect("adv");
    let a_bad = group_advantages(&store, &bad, Some(&rl)).expect("adv");
    let last = |a: &Advantages| {
        *a.by_turn
            .as_ref()
            .expect("shown")
            .values()
            .last()
            .expect("turns")
    };
    // Identical reads, so equal returns-to-go until the answer decides: the last turn's
    // advantage is positive for the success and negative for the failure.
    assert!(last(&a_good) > 0.5, "{a_good:?}");
    assert!(last(&a_bad) < -0.5, "{a_bad:?}");
    let text = shown(&good, &stored_steps(&store, "good"), &a_good);
    assert!(text.contains("advantage +"), "{text}");
    assert!(text.contains("call  | read_file("), "{text}");
    assert!(
        text.contains("advantages: the trainer's, advantage = step")
            && text.contains("learner.toml"),
        "{text}"
    );
    assert!(text.contains("never consumed by a trainer"), "{text}");
}

#[test]
fn a_second_copy_shows_no_advantage_and_is_not_in_its_group_s_baseline() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _env) = store_episodes(
        dir.path(),
        &[
            ("good", Member::Oracle),
            ("bad", Member::WrongAnswer),
            ("copy", Member::SecondCopy),
        ],
    );
    let rl = rl_from(&dir.path().join("config.toml"), "[rl]\n");
    let (good, bad) = (
        training_trajectory(&store, "good"),
        training_trajectory(&store, "bad"),
    );
    // The trainer's group: the copy is not in it.
    let trainer = turn_advantages(&[&good, &bad], &rl.rl).expect("trainer");
    let rec = store.get("good").expect("get").expect("stored");
    let shown = group_advantages(&store, &rec, Some(&rl)).expect("adv");
    let by_turn: Vec<f64> = shown.by_turn.expect("shown").values().copied().collect();
    assert_eq!(&by_turn, trainer[0].as_ref().expect("scored"));
    let rec = store.get("copy").expect("get").expect("stored");
    let shown = group_advantages(&store, &rec, Some(&rl)).expect("adv");
    assert!(shown.by_turn.is_none());
    assert!(
        shown.note.contains("second copy of episode good"),
        "{}",
        shown.note
    );
}

#[test]
fn shown_advantages_are_the_trainers_on_a_group_with_a_split_turn() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _env) = store_episodes(
        dir.path(),
        &[("good", Member::SplitTurn), ("bad", Member::WrongAnswer)],
    );
    // The run's config sits next to its store; the demo trains without normalisation.
    let rl = rl_from(
        &dir.path().join("config.toml"),
        "[rl]\nnormalize_step_advantages = false\n",
    );
    let found = run_rl_config(&dir.path().join("store"), None)
        .expect("config")
        .expect("found next to the store");
    assert_eq!(found.path, dir.path().join("config.toml"));
    assert!(!found.rl.normalize_step_advantages);
    let (good, bad) = (
        training_trajectory(&store, "good"),
        training_trajectory(&store, "bad"),
    );
    assert_eq!(good.steps.len(), 4, "turn 1 is split over two steps");
    assert_eq!(bad.steps.len(), 3);
    let trainer = turn_advantages(&[&good, &bad], &rl.rl).expect("trainer");
    // By hand: gamma 1, no normalisation, so A_t = G_t - mean over the two at turn t,
    // G_t the outcome plus the process rewards of turns t.. (a split turn's summed, then
    // clipped at process_clip 1).
    let returns = |t: &Trajectory| -> Vec<f64> {
        let p: Vec<f64> = t
            .turns()
            .iter()
            .map(|t| t.process_reward.clamp(-1.0, 1.0))
            .collect();
        (0..p.len())
            .map(|i| p[i..].iter().sum::<f64>() + t.footer.outcome_reward as f64)
            .collect()
    };
    let (g_good, g_bad) = (returns(&good), returns(&bad));
    assert_eq!(g_good.len(), 3);
    for (i, (name, t)) in [("good", &good), ("bad", &bad)].into_iter().enumerate() {
        let rec = store.get(name).expect("get").expect("stored");
        let shown = group_advantages(&store, &rec, Some(&found)).expect("adv");
        let by_turn = shown.by_turn.as_ref().expect("shown");
        let expected = trainer[i].as_ref().expect("scored");
        assert_eq!(
            by_turn.values().copied().collect::<Vec<_>>(),
            *expected,
            "{name}: the trainer's per-turn advantages, in turn order"
        );
        assert_eq!(by_turn.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
        for turn in 0..3 {
            let mine = if name == "good" {
                g_good[turn]
            } else {
                g_bad[turn]
            };
            let hand = mine - (g_good[turn] + g_bad[turn]) / 2.0;
            assert!(
                (by_turn[&(turn as u32)] - hand).abs() < 1e-9,
                "{name} turn {turn}"
            );
        }
        // Every step of the split turn shows its turn's advantage.
        let text = self::shown(&rec, &t.steps, &shown);
        let turn_1: Vec<&str> = text.lines().filter(|l| l.contains("turn   1:")).collect();
        assert_eq!(turn_1.len(), if name == "good" { 2 } else { 1 }, "{text}");
        let a1 = format!("advantage {:+.3}", by_turn[&1]);
        assert!(turn_1.iter().all(|l| l.ends_with(&a1)), "{a1}: {text}");
        assert!(text.contains("normalize_step_advantages false"), "{text}");
    }
    // The settings decide the numbers: normalised, the same group shows others.
    let rec = store.get("good").expect("get").expect("stored");
    let mut normalised = found.clone();
    normalised.rl.normalize_step_advantages = true;
    assert_ne!(
        group_advantages(&store, &rec, Some(&normalised))
            .expect("adv")
            .by_turn,
        group_advantages(&store, &rec, Some(&found))
            .expect("adv")
            .by_turn
    );
}

#[test]
fn without_a_run_config_no_advantage_is_shown_and_config_selects_the_estimator() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _env) = store_group(dir.path());
    let store_dir = dir.path().join("store");
    // A bare store (an eval store): no numbers, and why.
    assert!(run_rl_config(&store_dir, None).expect("none").is_none());
    let good = store.get("good").expect("get").expect("stored");
    let none = group_advantages(&store, &good, None).expect("adv");
    assert_eq!(none.by_turn, None);
    let text = shown(&good, &stored_steps(&store, "good"), &none);
    assert!(
        text.contains(
            "advantages: not shown, no run config found next to the store; pass --config"
        ),
        "{text}"
    );
    assert!(!text.contains(", advantage "), "{text}");
    // --config: GRPO gives the trajectory's advantage on every turn.
    let other = dir.path().join("elsewhere.toml");
    std::fs::write(&other, "[rl]\nadvantage = \"grpo\"\n").expect("config");
    let grpo = run_rl_config(&store_dir, Some(&other))
        .expect("config")
        .expect("given");
    let shown = group_advantages(&store, &good, Some(&grpo)).expect("adv");
    let values: Vec<f64> = shown.by_turn.expect("shown").into_values().collect();
    let trainer = turn_advantages(
        &[
            &training_trajectory(&store, "good"),
            &training_trajectory(&store, "bad"),
        ],
        &grpo.rl,
    )
    .expect("trainer");
    assert_eq!(Some(&values), trainer[0].as_ref());
    assert_eq!(values.len(), 3);
    assert!(
        values.iter().all(|a| *a == values[0] && *a > 0.0),
        "{values:?}"
    );
    assert!(shown.note.contains("grpo"), "{}", shown.note);
    // A file found next to the store that is no run config costs only the advantages
    // (never silent defaults); named with --config, it is an error naming it.
    let found = dir.path().join("config.toml");
    std::fs::write(&found, "[rl]\ngamma = 2.0\n").expect("config");
    assert!(run_rl_config(&store_dir, None).expect("a note").is_none());
    let err = format!(
        "{:#}",
        run_rl_config(&store_dir, Some(&found)).expect_err("refused")
    );
    assert!(
        err.contains("config.toml") && err.contains("gamma"),
        "{err}"
    );
    drop((store, _env));
    // Through the command: the note is printed.
    let (status, out) = run_captured(&[
        "replay",
        "show",
        "--store",
        store_dir.to_str().expect("utf8"),
        "--config",
        other.to_str().expect("utf8"),
        "good",
    ]);
    assert_eq!(status.expect("shown"), ExitCode::SUCCESS);
    assert!(out.contains("advantage = grpo"), "{out}");
}

#[test]
fn export_out_is_replaced_only_by_a_whole_export_with_trajectories() {
    let dir = tempfile::tempdir().expect("tmp");
    drop(store_group(dir.path()));
    let store = dir.path().join("store");
    let store = store.to_str().expect("utf8");
    let file = dir.path().join("out.jsonl");
    let file_s = file.to_str().expect("utf8");
    let export = |extra: &[&str]| {
        let mut argv = vec!["replay", "export", "--store", store, "--out", file_s];
        argv.extend_from_slice(extra);
        run_captured(&argv).0
    };
    // Nothing there yet and nothing matches: refused, nothing written.
    let err = format!("{:#}", export(&["--family", "hopz"]).expect_err("refused"));
    assert!(err.contains("no trajectory matches"), "{err}");
    assert!(!file.exists());
    export(&[]).expect("exported");
    let before = std::fs::read(&file).expect("written");
    assert_eq!(String::from_utf8_lossy(&before).lines().count(), 2);
    // A filter typo leaves the earlier export as it was.
    let err = format!("{:#}", export(&["--family", "hopz"]).expect_err("refused"));
    assert!(err.contains("left as it was"), "{err}");
    assert_eq!(std::fs::read(&file).expect("kept"), before);
    // A narrower export replaces it whole.
    export(&["--success", "true", "--format", "chat"]).expect("exported");
    let after = std::fs::read_to_string(&file).expect("written");
    assert_eq!(after.lines().count(), 1);
    // No temporary file is left behind.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
}

#[test]
fn export_out_inside_the_store_is_refused_and_the_store_kept() {
    let dir = tempfile::tempdir().expect("tmp");
    drop(store_group(dir.path()));
    let store = dir.path().join("store");
    let db = std::fs::read(store.join("db")).expect("db");
    for out in [store.join("db"), store.join("new.jsonl"), store.clone()] {
        let (status, _) = run_captured(&[
            "replay",
            "export",
            "--store",
            store.to_str().expect("utf8"),
            "--out",
            out.to_str().expect("utf8"),
        ]);
        let err = format!("{:#}", status.expect_err("refused"));
        assert!(err.contains("inside the store"), "{}: {err}", out.display());
    }
    // The same file named through a relative path with `..` is refused too.
    let sneaky = store.join("..").join("store").join("db");
    let (status, _) = run_captured(&[
        "replay",
        "export",
        "--store",
        store.to_str().expect("utf8"),
        "--out",
        sneaky.to_str().expect("utf8"),
    ]);
    assert!(status.is_err());
    assert_eq!(std::fs::read(store.join("db")).expect("db"), db);
    assert!(!store.join("new.jsonl").exists());
    let store = open(&store).expect("the store still opens");
    assert_eq!(store.list(&Filter::default()).count(), 2);
}

#[test]
fn rescore_compares_the_output_text_the_policy_read() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, env) = store_episodes(
        dir.path(),
        &[("good", Member::Oracle), ("forged", Member::ForgedOutput)],
    );
    let families = Families::new(&[]).expect("families");
    let rec = store.get("forged").expect("get").expect("stored");
    let r = rescore(&store, &env, &families, &EpisodeFormat::default(), &rec).expect("rescore");
    assert_eq!(r.calls, 3);
    // Same status, exit code and size: only the text differs, and the verdict agrees.
    assert_eq!(r.diverged.len(), 1, "{:?}", r.diverged);
    let d = &r.diverged[0];
    assert!(
        d.starts_with("turn 0: read_file: output text differs at character 0"),
        "{d}"
    );
    assert!(!d.contains("bytes"), "{d}");
    let lines: Vec<&str> = d.lines().collect();
    assert_eq!(lines.len(), 3, "{d}");
    assert!(
        lines[1].trim_start().starts_with("stored \"x")
            || lines[1].trim_start().starts_with("stored \"y"),
        "{d}"
    );
    assert!(lines[2].trim_start().starts_with("now    \""), "{d}");
    assert_ne!(lines[1].trim_start()[6..], lines[2].trim_start()[6..]);
    assert_eq!(r.rescored, Some(true));
    assert!(!r.verdict_differs());
    let good = store.get("good").expect("get").expect("stored");
    assert!(
        rescore(&store, &env, &families, &EpisodeFormat::default(), &good)
            .expect("rescore")
            .diverged
            .is_empty()
    );
}

#[test]
fn rescore_counts_diverged_calls_and_exits_1_although_every_verdict_matches() {
    let dir = tempfile::tempdir().expect("tmp");
    drop(store_episodes(
        dir.path(),
        &[("good", Member::Oracle), ("forged", Member::ForgedOutput)],
    ));
    let store = dir.path().join("store");
    let store = store.to_str().expect("utf8");
    let (status, out) = run_captured(&["replay", "rescore", "--store", store]);
    assert_eq!(status.expect("an exit status"), ExitCode::from(1), "{out}");
    assert!(
        out.contains(
            "2 trajectories re-executed; 1 call(s) diverged from the stored result in 1 \
             trajectory(ies); 0 verdict(s) differ"
        ),
        "{out}"
    );
    assert!(out.contains("output text differs"), "{out}");
    let (status, out) = run_captured(&["replay", "rescore", "--store", store, "--id", "good"]);
    assert_eq!(status.expect("an exit status"), ExitCode::SUCCESS, "{out}");
    assert!(out.contains("0 call(s) diverged"), "{out}");
}

/// The lines of `store`'s chat export in the byte layout, which must hold `trajectories`.
fn chat_lines(store: &TrajectoryStore, trajectories: u64) -> Vec<serde_json::Value> {
    let mut buf = Vec::new();
    let summary = export_chat(
        store,
        &Filter::default(),
        &EpisodeFormat::default(),
        &mut buf,
    )
    .expect("export");
    assert_eq!(summary.trajectories, trajectories);
    String::from_utf8(buf)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

#[test]
fn chat_export_writes_one_transcript_per_trajectory() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _env) = store_group(dir.path());
    let lines = chat_lines(&store, 2);
    assert_eq!(lines.len(), 2);
    for l in &lines {
        let msgs = l["messages"].as_array().expect("messages");
        assert_eq!(msgs[0]["role"], "system");
        assert_eq!(msgs[1]["role"], "user");
        assert!(msgs
            .iter()
            .any(|m| m["tool_calls"][0]["function"]["name"] == "answer"));
    }
}

/// A folded episode: its chat export is one conversation per segment, the folded one opening
/// with the prompt, the kept calls and their outputs (the first dropped); rescore re-runs its
/// calls across the fold and reads each output back where the policy read it.
#[test]
fn a_folded_episode_exports_one_conversation_per_segment_and_rescores_across_the_fold() {
    use corvid_episode::fold::DROPPED_OUTPUT;
    let dir = tempfile::tempdir().expect("tmp");
    let (store, env) = store_episodes(dir.path(), &[("folded", Member::Folded)]);
    let lines = chat_lines(&store, 1);
    assert_eq!(lines.len(), 2);
    assert_eq!(
        (lines[0]["segment"].clone(), lines[1]["segment"].clone()),
        (0.into(), 1.into())
    );
    let roles = |l: &serde_json::Value| -> Vec<String> {
        l["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| m["role"].as_str().expect("role").to_string())
            .collect()
    };
    let folded = &lines[1]["messages"];
    assert_eq!(
        roles(&lines[1]),
        [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant"
        ]
    );
    assert_eq!(folded[3]["content"], DROPPED_OUTPUT);
    assert_eq!(folded[3]["tool_call_id"], folded[2]["tool_calls"][0]["id"]);
    assert_eq!(folded[5]["tool_call_id"], folded[4]["tool_calls"][0]["id"]);
    assert_ne!(folded[5]["content"], DROPPED_OUTPUT);
    assert_eq!(folded[6]["tool_calls"][0]["function"]["name"], "answer");
    // The same user message opens both conversations (no memory under drop_tool_output).
    assert_eq!(lines[0]["messages"][1], folded[1]);

    let families = Families::new(&[]).expect("families");
    let rec = store.get("folded").expect("get").expect("stored");
    let r = rescore(&store, &env, &families, &EpisodeFormat::default(), &rec).expect("rescore");
    assert_eq!(r.calls, 3);
    assert!(r.diverged.is_empty(), "{:?}", r.diverged);
    assert_eq!(r.rescored, Some(true), "{}", r.note);
}

/// A folded episode in a model's own chat layout (a ChatML template with tools): one
/// conversation per segment, each laid out again as exactly that segment's ids, a folded one
/// opening with the notes it carried and the turns the fold kept.
#[test]
fn a_folded_episode_in_a_models_own_layout_exports_one_conversation_per_segment() {
    use corvid_episode::fold::MEMORY_HEADING;
    use corvid_episode::{oracle_steps_folded, ChatFormat, ChatMessage, Mistakes, ToolCallSyntax};
    use corvid_proto::{ContextFold, Fold};
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tokenizer/tests/fixtures/chatml_tools");
    let format = EpisodeFormat::chat(
        ChatFormat::from_folder(&fixture, ToolCallSyntax::Hermes).expect("fixture"),
    );
    let dir = tempfile::tempdir().expect("tmp");
    let store = Arc::new(TrajectoryStore::open(dir.path().join("store")).expect("store"));
    let env = crate::cmd::task_env().expect("env");
    let task = corvid_tasks::builtin_family("ledger")
        .expect("ledger")
        .instance(8, 3)
        .expect("task");
    let context = ContextFold {
        window_tokens: 3072,
        fold: Fold::Notes,
        memory_tokens: 256,
        notes_path: "notes.md".into(),
    };
    let demo = oracle_steps_folded(&format, &env, &task, Mistakes::NONE, (&context, 128))
        .expect("demonstration");
    let segments = demo.flatten_segments();
    assert!(segments.len() >= 3, "{} segments", segments.len());
    let header = TrajectoryHeader {
        trajectory_id: "folded".into(),
        task: task.task_ref(),
        actor_id: "test".into(),
        policy_version: 0,
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens: 128,
            seed: 1,
        },
        group_id: "g1".into(),
        started_unix_ms: 0,
        routes: None,
        context: Some(context),
    };
    let Begin::New(mut w) = store.begin(header).expect("begin") else {
        panic!("duplicate")
    };
    let n = demo.steps.len();
    for (seq, step) in demo.steps.iter().cloned().enumerate() {
        w.append(seq as u64, step).expect("append");
    }
    w.finish_blocking(TrajectoryFooter {
        outcome_reward: 1.0,
        success: true,
        termination: Termination::Answered,
        step_count: n as u64,
        token_count: demo.len() as u64,
        generated_token_count: demo.steps.iter().map(|s| s.generated_count() as u64).sum(),
        wall_ms: 1,
        finished_unix_ms: 1,
        template_divergent: false,
    })
    .expect("finish");

    let mut buf = Vec::new();
    let summary = export_chat(&store, &Filter::default(), &format, &mut buf).expect("export");
    assert_eq!(summary.trajectories, 1);
    let lines: Vec<serde_json::Value> = String::from_utf8(buf)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), segments.len());
    for (i, (line, (ids, _))) in lines.iter().zip(&segments).enumerate() {
        assert_eq!(line["segment"], i);
        assert_eq!(line["segments"], segments.len());
        let messages: Vec<ChatMessage> =
            serde_json::from_value(line["messages"].clone()).expect("messages");
        let tools = line["tools"].as_array().expect("tools");
        let (again, _) = format.from_messages(&messages, tools).expect("layout");
        assert_eq!(&again, ids, "segment {i}");
        let user = messages.iter().find(|m| m.role == "user").expect("user");
        assert_eq!(user.content.contains(MEMORY_HEADING), i > 0, "segment {i}");
    }
}
