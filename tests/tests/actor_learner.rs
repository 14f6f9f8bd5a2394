//! The actor against a real learner service on loopback with a tiny random policy:
//! trajectories arrive valid with exact log-probs, newer policy versions are picked up
//! between turns, a learner killed mid-stream gets every trajectory exactly once after it
//! restarts, a learner that is down gets them from the spool (also across an actor
//! restart), and a shutdown stores the unfinished episodes as abandoned. An actor whose
//! learner URL or token is unusable stops at once with an error that says so; a call to a
//! learner that went away says which URL it tried and why it failed.

// The actor's own test helpers (random policies, tasks, trajectory checks), shared as a file
// so that the actor crate needs no learner to test itself.
#[path = "../../actor/tests/common/mod.rs"]
mod actor_common;
#[path = "common/learner.rs"]
mod learner;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use actor_common::{assert_valid, max_logprob_error_by_version, random_policy};
use corvid_actor::journal::JournalWriter;
use corvid_actor::{run_actor, ActorConfig, ActorReport, LearnerLink, SubmitConfig};
use corvid_proto::{Step, Termination};
use learner::{assert_exact_logprobs, LearnerOpts, TestLearner, TOKEN};

fn actor_cfg(l: &TestLearner, spool: &Path, concurrency: usize, max: Option<u64>) -> ActorConfig {
    let mut c = ActorConfig::new(l.url(), TOKEN);
    c.name = "test-actor".into();
    c.concurrency = concurrency;
    c.max_episodes = max;
    c.spool_dir = spool.to_path_buf();
    c.threads = 1;
    c.shutdown_grace = Duration::from_secs(10);
    c.final_drain = Duration::from_secs(5);
    c.submit = SubmitConfig {
        backoff_initial: Duration::from_millis(50),
        backoff_max: Duration::from_millis(400),
        attempts_before_spool: 3,
        drain_poll: Duration::from_millis(100),
    };
    c
}

fn actor_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spool_files(spool: &Path, sub: &str) -> usize {
    std::fs::read_dir(spool.join(sub))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn ids(l: &TestLearner) -> BTreeSet<String> {
    l.trajectories()
        .into_iter()
        .map(|t| t.header.trajectory_id)
        .collect()
}

#[test]
fn trajectories_arrive_valid_with_exact_logprobs() {
    let l = TestLearner::start(LearnerOpts::default());
    let spool = tempfile::tempdir().unwrap();
    let rt = actor_runtime();
    let report: ActorReport = rt
        .block_on(run_actor(
            actor_cfg(&l, spool.path(), 4, Some(6)),
            std::future::pending(),
        ))
        .unwrap();
    assert_eq!(report.assigned, 6);
    assert_eq!(report.finished, 6);
    assert_eq!(report.acked, 6, "{report:?}");
    assert_eq!((report.spooled, report.spool_left, report.lost), (0, 0, 0));
    let trajs = l.trajectories();
    assert_eq!(trajs.len(), 6);
    let v1 = l.model_of(1);
    let groups: BTreeSet<&str> = trajs.iter().map(|t| t.header.group_id.as_str()).collect();
    assert_eq!(groups.len(), 3, "groups of G = 2");
    for t in &trajs {
        assert_valid(t);
        assert_eq!(t.header.actor_id, report.actor_id);
        assert_eq!(t.header.policy_version, 1);
        assert!(t.footer.termination.is_scored(), "{:?}", t.footer);
        assert!(!t.steps.is_empty());
        assert_exact_logprobs(v1.model(), t, f64::from(l.temperature));
    }
    assert_eq!(
        spool_files(spool.path(), "active"),
        0,
        "acked journals are deleted"
    );
    assert_eq!(spool_files(spool.path(), "ready"), 0);
}

#[test]
fn a_newer_policy_is_fetched_and_used_from_the_next_turn() {
    let l = TestLearner::start(LearnerOpts {
        max_new_tokens: 24,
        ..LearnerOpts::default()
    });
    let spool = tempfile::tempdir().unwrap();
    let rt = actor_runtime();
    let actor = rt.spawn(run_actor(
        actor_cfg(&l, spool.path(), 4, Some(8)),
        std::future::pending(),
    ));
    // Publish version 2 while the first episodes are running.
    wait_for("episodes to stream", Duration::from_secs(30), || {
        l.store.stats().unwrap().open >= 1
    });
    let mut v2 = random_policy(2);
    v2.set_version(2);
    l.publish(&v2);
    let report = rt.block_on(actor).unwrap().unwrap();
    assert_eq!(report.finished, 8);
    assert_eq!(report.policy_updates, 1);
    assert_eq!(report.engine.weight_swaps, 1);
    let v1 = l.model_of(1);
    let v2 = l.model_of(2);
    let trajs = l.trajectories();
    assert_eq!(trajs.len(), 8);
    let mut generated_under_v2 = 0;
    for t in &trajs {
        assert_valid(t);
        generated_under_v2 += t
            .steps
            .iter()
            .filter(|s| s.policy_version == 2)
            .map(|s| s.generated_count())
            .sum::<usize>();
        let err = max_logprob_error_by_version(
            &|v| if v == 1 { v1.model() } else { v2.model() },
            t,
            f64::from(l.temperature),
        );
        assert!(
            err < 1e-4,
            "{}: log-prob error {err}",
            t.header.trajectory_id
        );
    }
    assert!(generated_under_v2 > 0, "version 2 generated tokens");
}

#[test]
fn a_learner_killed_mid_stream_gets_every_trajectory_exactly_once() {
    let mut l = TestLearner::start(LearnerOpts {
        max_new_tokens: 32,
        ..LearnerOpts::default()
    });
    let spool = tempfile::tempdir().unwrap();
    let rt = actor_runtime();
    let actor = rt.spawn(run_actor(
        actor_cfg(&l, spool.path(), 4, Some(4)),
        std::future::pending(),
    ));
    // Kill it while trajectories are open in the store (streams live, steps written).
    wait_for("live streams", Duration::from_secs(30), || {
        l.store.stats().unwrap().open >= 2
    });
    l.kill();
    assert_eq!(
        l.store.stats().unwrap().open,
        0,
        "the dead learner's partial trajectories are gone"
    );
    std::thread::sleep(Duration::from_millis(700));
    l.restart();
    let report = rt.block_on(actor).unwrap().unwrap();
    assert_eq!(report.finished, 4);
    assert!(report.resends >= 1, "streams were resent: {report:?}");
    assert_eq!(report.spool_left, 0);
    assert_eq!(
        report.acked + report.duplicates + report.drained as u64,
        4,
        "{report:?}"
    );
    let stats = l.store.stats().unwrap();
    assert_eq!((stats.finished, stats.open), (4, 0), "stored once each");
    let v1 = l.model_of(1);
    for t in l.trajectories() {
        assert_valid(&t);
        assert_exact_logprobs(v1.model(), &t, f64::from(l.temperature));
    }
}

#[test]
fn a_learner_that_is_down_gets_the_spooled_trajectories_when_it_is_back() {
    let mut l = TestLearner::start(LearnerOpts {
        // Long turns, so that the episodes are still running when the learner is killed.
        max_new_tokens: 160,
        ..LearnerOpts::default()
    });
    let spool = tempfile::tempdir().unwrap();
    let rt = actor_runtime();
    let mut cfg = actor_cfg(&l, spool.path(), 4, Some(4));
    cfg.final_drain = Duration::ZERO;
    let actor = rt.spawn(run_actor(cfg, std::future::pending()));
    // Handed out is not enough: a learner killed before its NextTasks answer arrives leaves
    // the actor asking for tasks until the learner is back, which this test only does after
    // the actor ends (it hung so about once in 15 runs). An episode's journal in the spool
    // proves the actor holds its task.
    wait_for(
        "the actor to begin its 4 episodes",
        Duration::from_secs(30),
        || spool_files(spool.path(), "active") + spool_files(spool.path(), "ready") >= 4,
    );
    l.kill();
    let first = rt.block_on(actor).unwrap().unwrap();
    assert_eq!(first.finished, 4);
    assert!(first.spool_left >= 1, "{first:?}");
    assert_eq!(first.acked as usize + first.spool_left, 4, "{first:?}");
    assert_eq!(spool_files(spool.path(), "ready"), first.spool_left);
    let spooled_ids: BTreeSet<String> = std::fs::read_dir(spool.path().join("ready"))
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            p.file_stem().unwrap().to_string_lossy().into_owned()
        })
        .collect();

    // A previous actor also died mid-episode: its journal holds a header and one step.
    let mut orphan = random_trajectory_header(&first.actor_id);
    orphan.trajectory_id = format!("{}.orphan", first.actor_id);
    let path = spool
        .path()
        .join("active")
        .join(format!("{}.traj", orphan.trajectory_id));
    let mut j = JournalWriter::create(&path).unwrap();
    j.header(&orphan).unwrap();
    j.step(Step::context(0, vec![1, 2, 3])).unwrap();
    j.flush().unwrap();
    drop(j);

    // The learner comes back; a new actor process with the same spool delivers everything.
    l.restart();
    let second = rt
        .block_on(run_actor(
            actor_cfg(&l, spool.path(), 4, Some(0)),
            std::future::pending(),
        ))
        .unwrap();
    assert_eq!(second.recovered, 1, "the orphaned journal was sealed");
    assert_eq!(second.spool_left, 0);
    assert_eq!(second.drained, first.spool_left + 1);
    let stored = ids(&l);
    assert_eq!(stored.len(), 5);
    for id in &spooled_ids {
        assert!(stored.contains(id), "{id} arrived");
    }
    let orphan_rec = l.store.get(&orphan.trajectory_id).unwrap().unwrap();
    let f = orphan_rec.footer.unwrap();
    assert_eq!(f.termination, Termination::Abandoned);
    assert_eq!((f.step_count, f.token_count), (1, 3));
    for t in l.trajectories() {
        assert_valid(&t);
        if t.header.trajectory_id == orphan.trajectory_id {
            continue;
        }
        // The routes the engine recorded came through the journal, the spool, the stream
        // and the store whole: a row per token but the first.
        let shape = t.header.routes.expect("the run's actors record routes");
        for (seq, s) in t.steps.iter().enumerate() {
            shape
                .check_step(seq as u64, s.token_ids.len(), &s.routes, seq == 0)
                .unwrap();
        }
        assert_eq!(
            t.route_ids().unwrap().len(),
            (t.len() - 1) * shape.ids_per_token()
        );
    }
    assert_eq!(spool_files(spool.path(), "active"), 0);
    assert_eq!(spool_files(spool.path(), "ready"), 0);
}

fn random_trajectory_header(actor: &str) -> corvid_proto::TrajectoryHeader {
    let task = actor_common::task("hops", 1, 1);
    let mut h = corvid_actor::EpisodeSpec::new("x", task, actor_common::sampling(8, 1)).header(1);
    h.actor_id = actor.to_string();
    h
}

#[test]
fn shutdown_finishes_within_the_grace_period_and_stores_the_rest_as_abandoned() {
    let l = TestLearner::start(LearnerOpts {
        max_new_tokens: 48,
        ..LearnerOpts::default()
    });
    let spool = tempfile::tempdir().unwrap();
    let rt = actor_runtime();
    let mut cfg = actor_cfg(&l, spool.path(), 4, None);
    cfg.shutdown_grace = Duration::from_millis(300);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let actor = rt.spawn(run_actor(cfg, async {
        let _ = stop_rx.await;
    }));
    wait_for("episodes in flight", Duration::from_secs(30), || {
        l.store.stats().unwrap().open >= 4
    });
    let t0 = Instant::now();
    stop_tx.send(()).unwrap();
    let report = rt.block_on(actor).unwrap().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    assert_eq!(report.spool_left, 0);
    let trajs = l.trajectories();
    assert_eq!(
        trajs.len() as u64,
        report.finished,
        "every started episode is stored"
    );
    let abandoned = trajs
        .iter()
        .filter(|t| t.footer.termination == Termination::Abandoned)
        .count();
    assert!(abandoned >= 1, "{report:?}");
    for t in &trajs {
        assert_valid(t);
        if t.footer.termination == Termination::Abandoned {
            assert!(!t.footer.success && t.footer.outcome_reward == 0.0);
        }
    }
}

#[test]
fn an_unusable_url_or_token_stops_the_actor_instead_of_retrying_forever() {
    let spool = tempfile::tempdir().unwrap();
    let rt = actor_runtime();
    for (url, token, needle) in [
        ("not a url", TOKEN, "learner URL \"not a url\" is invalid"),
        // Nothing listens on port 1 either: the token must be refused before dialling.
        (
            "http://127.0.0.1:1",
            "s3c\u{1}ret",
            "byte 0x01 at position 3",
        ),
    ] {
        let mut c = ActorConfig::new(url, token);
        c.spool_dir = spool.path().to_path_buf();
        let res = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(20),
                run_actor(c, std::future::pending()),
            )
            .await
        });
        let err = res
            .expect("the actor kept retrying a mistake no retry fixes")
            .unwrap_err()
            .to_string();
        // The first call is the health check the actor waits on before registering.
        assert!(err.contains("Health") && err.contains(needle), "{err}");
    }
}

#[test]
fn a_call_to_a_learner_that_went_away_names_its_url_and_what_failed() {
    let mut l = TestLearner::start(LearnerOpts::default());
    let rt = actor_runtime();
    let link = LearnerLink::new(&l.url(), TOKEN);
    rt.block_on(link.policy_info("")).unwrap();
    l.kill();
    // The connected channel redials and fails: a status made from the transport error.
    let e = rt.block_on(link.policy_info("")).unwrap_err();
    assert!(e.is_retryable(), "{e}");
    let text = e.to_string();
    assert!(
        text.starts_with(&format!(
            "PolicyInfo: cannot reach the learner at {}: ",
            l.url()
        )),
        "{text}"
    );
    // Which error the dead connection gives depends on timing: the redial is refused, or
    // the request goes out on the old socket before its close is seen (a broken pipe, a
    // reset, or hyper's "operation was canceled: connection closed"), each with its hint.
    let refused = text.to_lowercase().contains("connection refused")
        && text.ends_with("is `corvid learner` running and listening at that address?");
    let closed = text.ends_with(
        "the connection was closed; the learner may be restarting, or what listens there \
         is not a `corvid learner`",
    );
    assert!(refused || closed, "{text}");
    // The next call connects afresh, and says the same from the connect error.
    let text = rt.block_on(link.policy_info("")).unwrap_err().to_string();
    assert!(
        text.starts_with(&format!("cannot connect to the learner at {}: ", l.url()))
            && text.to_lowercase().contains("connection refused"),
        "{text}"
    );
}

/// The run's episode format travels with its settings: an actor given a model's tokenizer for
/// a run in Corvid's byte layout refuses to start, naming both formats' hashes, before it
/// rolls out a single episode.
#[test]
fn an_actor_with_another_tokenizer_refuses_to_start() {
    let l = TestLearner::start(LearnerOpts::default());
    let spool = tempfile::tempdir().unwrap();
    let mut cfg = actor_cfg(&l, spool.path(), 2, Some(2));
    cfg.tokenizer_dir = Some(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/tests/fixtures/chatml_tools"),
    );
    let run = corvid_episode::EpisodeFormat::default().description();
    let err = actor_runtime()
        .block_on(run_actor(cfg, std::future::pending()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&run.tokenizer_sha256) && err.contains("chat layout, tokenizer sha256"),
        "{err}"
    );
    assert!(l.trajectories().is_empty());
}
