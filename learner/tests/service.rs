//! The whole `corvid.v1.Learner` service on a real loopback server with its control plane:
//! concurrent ingest stores every trajectory once, `Register` hands out the run's settings,
//! `NextTasks` forms groups of G and applies back-pressure, `FetchPolicy` returns exactly the
//! learner's weights with the right checksum, and a wrong or missing token is refused on
//! every RPC. The standard health service answers without a token: the learner's service is
//! NOT_SERVING until a policy is published, SERVING after, NOT_SERVING once it stops.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use corvid_learner::collect::Collector;
use corvid_learner::config::{LearnerConfig, SamplingSection};
use corvid_learner::dispenser::{DispenserConfig, DispenserState, TaskDispenser};
use corvid_learner::policy_store::PolicyStore;
use corvid_learner::server::{
    serve, ActorRegistry, Control, LearnerHealth, LearnerService, RunSettings, LEARNER_SERVICE,
};
use corvid_model::checkpoint::weights_to_bytes;
use corvid_model::{ModelConfig, MoePolicy};
use corvid_proto::client::{connect, trajectory_parts, AuthedClient};
use corvid_proto::pb;
use corvid_proto::synthetic::{self, Shape};
use corvid_store::TrajectoryStore;
use corvid_tasks::{Curriculum, CurriculumConfig};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tonic::Code;

const TOKEN: &str = "service-test-token";
const G: u32 = 3;
const MAX_OPEN: usize = 2;

struct Learner {
    url: String,
    store: Arc<TrajectoryStore>,
    control: Arc<Control>,
    model_cfg: ModelConfig,
    weights: Vec<u8>,
    health: LearnerHealth,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn small_model() -> (ModelConfig, Vec<u8>) {
    tch::set_num_threads(1);
    let cfg = ModelConfig {
        num_hidden_layers: 2,
        ..ModelConfig::tiny()
    };
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let _model = MoePolicy::new(&vs.root(), &cfg).unwrap();
    let bytes = weights_to_bytes(&vs).unwrap();
    (cfg, bytes)
}

async fn start() -> Learner {
    start_with(true).await
}

async fn start_with(publish: bool) -> Learner {
    start_configured(publish, |_| {}).await
}

async fn start_configured(publish: bool, edit: impl FnOnce(&mut LearnerConfig)) -> Learner {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(TrajectoryStore::open(dir.path().join("store")).unwrap());
    let (model_cfg, weights) = small_model();

    let mut cfg = LearnerConfig {
        run_name: "service-test".into(),
        ..LearnerConfig::default()
    };
    cfg.rl.group_size = G as usize;
    cfg.rollout.max_open_groups = MAX_OPEN;
    cfg.rollout.sampling = SamplingSection {
        temperature: 0.7,
        top_p: 0.95,
        max_new_tokens: 64,
    };
    edit(&mut cfg);
    cfg.validate().unwrap();
    let curriculum = Curriculum::new(CurriculumConfig::default(), &[("hops", 3)], 5).unwrap();
    let dispenser = TaskDispenser::new(
        DispenserConfig::from_learner(&cfg, 4096),
        vec![corvid_tasks::builtin_family("hops").unwrap()],
        Arc::new(Mutex::new(curriculum)),
        DispenserState::new(cfg.seed),
    )
    .unwrap();
    let policies = Arc::new(PolicyStore::new(2));
    if publish {
        policies.publish(1, weights.clone()).unwrap();
    }
    let control = Arc::new(Control {
        settings: RunSettings::new(
            &cfg,
            &model_cfg,
            &cfg.episode_format().unwrap().description(),
        ),
        dispenser: Arc::new(dispenser),
        policies,
        actors: Arc::new(ActorRegistry::default()),
    });

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = LearnerService::new(Arc::clone(&store)).with_control(Arc::clone(&control));
    let health = service.health();
    tokio::spawn(async move {
        serve(listener, service, TOKEN, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    Learner {
        url,
        store,
        control,
        model_cfg,
        weights,
        health,
        _dir: dir,
        _stop: stop,
    }
}

const SHAPE: Shape = Shape {
    steps: 4,
    tokens_per_step: 24,
};

async fn submit(
    c: &mut AuthedClient,
    id: &str,
    group_id: &str,
) -> Result<pb::SubmitAck, tonic::Status> {
    submit_as(c, id, group_id, "synthetic", 0).await
}

/// A trajectory of `group_id` that `actor` ran with the sampler seed `seed`.
async fn submit_as(
    c: &mut AuthedClient,
    id: &str,
    group_id: &str,
    actor: &str,
    seed: u64,
) -> Result<pb::SubmitAck, tonic::Status> {
    let mut header = synthetic::header(id, "hops", 1, 1);
    header.group_id = group_id.to_owned();
    header.actor_id = actor.to_owned();
    header.sampling.seed = seed;
    let parts = trajectory_parts(
        header,
        synthetic::steps(id, SHAPE),
        synthetic::footer(id, SHAPE),
    );
    c.submit_trajectory(parts).await.map(|r| r.into_inner())
}

async fn fetch(c: &mut AuthedClient, version: u64) -> Vec<pb::PolicyChunk> {
    let mut stream = c
        .fetch_policy(pb::FetchPolicyRequest { version })
        .await
        .unwrap()
        .into_inner();
    let mut chunks = Vec::new();
    while let Some(chunk) = stream.next().await {
        chunks.push(chunk.unwrap());
    }
    chunks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_store_every_trajectory_exactly_once() {
    let l = start().await;
    let (clients, per_client) = (6, 5);
    // One connection per client, all streaming at once. (The client-streaming future is
    // not provably `Send` to rustc, so the clients are joined on this task rather than
    // spawned; the server still handles them concurrently on its own threads.)
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = connect(&l.url, TOKEN).await.unwrap();
        tasks.push(async move {
            let mut acks = Vec::new();
            for i in 0..per_client {
                // Every id is sent by two clients (2k and 2k+1), at about the same time.
                let id = format!("t-{}-{i}", c / 2);
                loop {
                    match submit(&mut client, &id, "g-none").await {
                        Ok(ack) => break acks.push(ack),
                        // The other sender is writing this id right now: retry, as actors do.
                        Err(e) if e.code() == Code::Aborted => {
                            tokio::time::sleep(std::time::Duration::from_millis(5)).await
                        }
                        Err(e) => panic!("{id}: {e}"),
                    }
                }
            }
            acks
        });
    }
    let mut acked = BTreeMap::<String, usize>::new();
    let mut fresh = 0;
    for acks in futures::future::join_all(tasks).await {
        for ack in acks {
            assert_eq!(ack.steps_stored, SHAPE.steps);
            assert_eq!(ack.tokens_stored, SHAPE.tokens());
            fresh += usize::from(!ack.duplicate);
            *acked.entry(ack.trajectory_id).or_default() += 1;
        }
    }
    let stats = l.store.stats().unwrap();
    assert_eq!(
        stats.finished as usize,
        acked.len(),
        "each distinct id stored once"
    );
    assert_eq!(
        fresh,
        acked.len(),
        "exactly one ack per id is not a duplicate"
    );
    assert_eq!(stats.open, 0);
    assert_eq!(acked.len(), clients / 2 * per_client);
    assert!(
        acked.values().all(|&n| n == 2),
        "every id acked to both senders"
    );
    for id in acked.keys() {
        let rec = l.store.get(id).unwrap().expect("acked id is stored");
        assert_eq!(rec.footer.unwrap().token_count, SHAPE.tokens());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_returns_the_run_settings_and_distinct_ids() {
    let l = start().await;
    let mut c = connect(&l.url, TOKEN).await.unwrap();
    let mut ids = BTreeSet::new();
    for n in 0..3 {
        let r = c
            .register(pb::RegisterRequest {
                actor_name: format!("a{n}"),
                hostname: "localhost".into(),
                concurrency: 4,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.policy_version, 1);
        let s = r.settings.unwrap();
        assert_eq!(s.run_name, "service-test");
        let sampling = s.sampling.unwrap();
        assert_eq!(
            (
                sampling.temperature,
                sampling.top_p,
                sampling.max_new_tokens
            ),
            (0.7, 0.95, 64)
        );
        assert_eq!(s.max_context as i64, l.model_cfg.max_position_embeddings);
        let cfg: ModelConfig = serde_json::from_str(&s.model_config_json).unwrap();
        assert_eq!(cfg, l.model_cfg);
        ids.insert(r.actor_id);
    }
    assert_eq!(ids.len(), 3);
    assert_eq!(l.control.actors.len(), 3);
    let err = c
        .register(pb::RegisterRequest {
            actor_name: "zero".into(),
            hostname: String::new(),
            concurrency: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_tasks_forms_groups_of_g_and_waits_for_completion() {
    let l = start().await;
    let mut a = connect(&l.url, TOKEN).await.unwrap();
    let mut b = connect(&l.url, TOKEN).await.unwrap();
    let reg = |name: &str| pb::RegisterRequest {
        actor_name: name.into(),
        hostname: "h".into(),
        concurrency: 2,
    };
    let id_a = a.register(reg("a")).await.unwrap().into_inner().actor_id;
    let id_b = b.register(reg("b")).await.unwrap().into_inner().actor_id;
    let ask = |c: &mut AuthedClient, id: &str, n: u32| {
        let mut c = c.clone();
        let req = pb::NextTasksRequest {
            actor_id: id.to_owned(),
            max_tasks: n,
        };
        async move { c.next_tasks(req).await.unwrap().into_inner().assignments }
    };
    // Two actors ask concurrently, two at a time, until back-pressure answers nothing.
    let mut all = Vec::new();
    loop {
        let (x, y) = tokio::join!(ask(&mut a, &id_a, 2), ask(&mut b, &id_b, 2));
        if x.is_empty() && y.is_empty() {
            break;
        }
        all.extend(x);
        all.extend(y);
        assert!(
            all.len() <= G as usize * MAX_OPEN,
            "more handed out than open groups allow"
        );
    }
    assert_eq!(all.len(), G as usize * MAX_OPEN);
    let mut groups: BTreeMap<String, Vec<&pb::TaskAssignment>> = BTreeMap::new();
    for x in &all {
        groups.entry(x.group_id.clone()).or_default().push(x);
    }
    assert_eq!(groups.len(), MAX_OPEN);
    for (gid, members) in &groups {
        assert_eq!(members.len(), G as usize, "group {gid}");
        let task = members[0].task.clone().unwrap();
        assert_eq!(task.family, "hops");
        assert!(members.iter().all(|m| m.task.as_ref() == Some(&task)
            && m.group_size == G
            && m.max_turns > 0
            && m.context_budget > 0));
        let seeds: BTreeSet<u64> = members.iter().map(|m| m.sampling.unwrap().seed).collect();
        assert_eq!(
            seeds.len(),
            G as usize,
            "each episode samples with its own seed"
        );
    }

    // Completing one group (G stored trajectories) frees exactly one group's worth.
    let (gid, members) = groups.iter().next().unwrap();
    for (i, m) in members.iter().enumerate() {
        let seed = m.sampling.unwrap().seed;
        let ack = submit_as(&mut a, &format!("{gid}-ep{i}"), gid, &id_a, seed)
            .await
            .unwrap();
        assert!(!ack.duplicate);
    }
    // A resend is a duplicate and must not count twice.
    assert!(
        submit(&mut a, &format!("{gid}-ep0"), gid)
            .await
            .unwrap()
            .duplicate
    );
    let more = ask(&mut a, &id_a, 10).await;
    assert_eq!(more.len(), G as usize);
    assert!(more.iter().all(|m| !groups.contains_key(&m.group_id)));
    assert!(ask(&mut b, &id_b, 10).await.is_empty());
    let counters = l.control.dispenser.counters();
    assert_eq!((counters.groups_opened, counters.groups_completed), (3, 1));

    let err = a
        .next_tasks(pb::NextTasksRequest {
            actor_id: String::new(),
            max_tasks: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_actors_episodes_go_to_the_next_actor_and_a_polling_one_keeps_its_own() {
    use std::time::Duration;
    let l = start_configured(true, |c| {
        c.rollout.actor_timeout_s = 1;
        c.rollout.policy_poll_interval_ms = 100;
    })
    .await;
    let mut a = connect(&l.url, TOKEN).await.unwrap();
    let mut b = connect(&l.url, TOKEN).await.unwrap();
    let reg = pb::RegisterRequest {
        actor_name: "n".into(),
        hostname: "h".into(),
        concurrency: 8,
    };
    let id_a = a.register(reg.clone()).await.unwrap().into_inner().actor_id;
    let id_b = b.register(reg).await.unwrap().into_inner().actor_id;
    let ask = |c: &AuthedClient, id: &str| {
        let mut c = c.clone();
        let req = pb::NextTasksRequest {
            actor_id: id.to_owned(),
            max_tasks: 10,
        };
        async move { c.next_tasks(req).await.unwrap().into_inner().assignments }
    };
    let poll = |c: &AuthedClient, id: &str| {
        let mut c = c.clone();
        let req = pb::PolicyInfoRequest {
            actor_id: id.to_owned(),
        };
        async move { c.policy_info(req).await.unwrap() }
    };
    let held = ask(&a, &id_a).await;
    assert_eq!(held.len(), G as usize * MAX_OPEN);

    // `a` polls PolicyInfo as a running actor does, for longer than the timeout: it keeps
    // its episodes.
    for _ in 0..15 {
        poll(&a, &id_a).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ask(&b, &id_b).await.is_empty());
    assert_eq!(l.control.dispenser.counters().episodes_reclaimed, 0);

    // Then `a` goes silent (a SIGKILL): after the timeout `b` gets the same episodes.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let again = ask(&b, &id_b).await;
    let key = |x: &pb::TaskAssignment| (x.group_id.clone(), x.sampling.unwrap().seed);
    let mut want: Vec<_> = held.iter().map(key).collect();
    let mut got: Vec<_> = again.iter().map(key).collect();
    want.sort();
    got.sort();
    assert_eq!(got, want, "the same episodes: groups and sampler seeds");
    assert_eq!(
        l.control.dispenser.counters().episodes_reclaimed,
        held.len() as u64
    );

    // `b` finishes them; a late trajectory from `a` is stored but closes nothing twice.
    for (i, x) in again.iter().enumerate() {
        let (gid, seed) = key(x);
        submit_as(&mut b, &format!("b-{i}"), &gid, &id_b, seed)
            .await
            .unwrap();
    }
    let (gid, seed) = key(&held[0]);
    let late = submit_as(&mut a, "a-late", &gid, &id_a, seed)
        .await
        .unwrap();
    assert!(!late.duplicate, "stored: nothing an actor sends is dropped");
    let counters = l.control.dispenser.counters();
    assert_eq!(counters.groups_completed, MAX_OPEN as u64);
    assert_eq!(l.control.dispenser.open_groups(), 0);

    // The trainer's collector forms each group of its G distinct episodes and skips the copy.
    let mut collector = Collector::new(G as usize, Duration::from_secs(60), 0);
    assert_eq!(
        collector.poll(&l.store, |_| {}).unwrap(),
        held.len() + 1,
        "every stored trajectory is read"
    );
    assert_eq!(collector.take_copies(), 1);
    let groups = collector.take_ready(MAX_OPEN + 1, &|_| false);
    assert_eq!(groups.len(), MAX_OPEN);
    for g in &groups {
        let seeds: BTreeSet<u64> = g
            .iter()
            .map(|t| t.trajectory.header.sampling.seed)
            .collect();
        assert_eq!(seeds.len(), G as usize, "G distinct episodes");
        assert!(g.iter().all(|t| t.trajectory.header.actor_id == id_b));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_from_before_a_restart_is_active_and_a_submission_is_a_sign_of_life() {
    let l = start().await;
    let mut c = connect(&l.url, TOKEN).await.unwrap();
    assert_eq!(l.control.actors_active(), 0);
    // This learner never registered the id: the actor registered with its previous life.
    c.policy_info(pb::PolicyInfoRequest {
        actor_id: "actor-7-0123abcd".into(),
    })
    .await
    .unwrap();
    assert_eq!(l.control.actors_active(), 1);
    let known = l.control.actors.snapshot();
    assert!(known.contains_key("actor-7-0123abcd"), "{known:?}");

    // A trajectory submitted by another such actor counts for both clocks.
    submit_as(&mut c, "t-1", "g00000000", "actor-8-4567abcd", 0)
        .await
        .unwrap();
    assert_eq!(l.control.actors_active(), 2);
    // An empty id (an older client's poll) is no one.
    c.policy_info(pb::PolicyInfoRequest::default())
        .await
        .unwrap();
    assert_eq!(l.control.actors_active(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_the_first_policy_there_are_no_tasks_and_no_weights() {
    let l = start_with(false).await;
    let mut c = connect(&l.url, TOKEN).await.unwrap();
    let r = c
        .register(pb::RegisterRequest {
            actor_name: "early".into(),
            hostname: "h".into(),
            concurrency: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.policy_version, 0);
    let tasks = c
        .next_tasks(pb::NextTasksRequest {
            actor_id: r.actor_id,
            max_tasks: 8,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(tasks.assignments.is_empty());
    assert_eq!(l.control.dispenser.counters().groups_opened, 0);
    let err = c
        .policy_info(pb::PolicyInfoRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    let err = c
        .fetch_policy(pb::FetchPolicyRequest { version: 0 })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetched_weights_equal_the_learners_and_match_the_checksum() {
    let l = start().await;
    let mut c = connect(&l.url, TOKEN).await.unwrap();
    let info = c
        .policy_info(pb::PolicyInfoRequest::default())
        .await
        .unwrap()
        .into_inner();
    let digest = hex::encode(Sha256::digest(&l.weights));
    assert_eq!(info.version, 1);
    assert_eq!(info.total_bytes as usize, l.weights.len());
    assert_eq!(info.sha256, digest);

    let chunks = fetch(&mut c, 0).await;
    assert!(chunks.len() > 1, "the weights span several chunks");
    let mut bytes = Vec::new();
    for (i, ch) in chunks.iter().enumerate() {
        assert_eq!(ch.version, 1);
        assert_eq!(ch.offset as usize, bytes.len());
        assert_eq!(ch.sha256, digest);
        assert_eq!(ch.total_bytes as usize, l.weights.len());
        assert_eq!(ch.last, i + 1 == chunks.len());
        bytes.extend_from_slice(&ch.data);
    }
    assert!(
        bytes == l.weights,
        "fetched bytes differ from weights_to_bytes"
    );
    assert_eq!(hex::encode(Sha256::digest(&bytes)), info.sha256);

    // A newer version becomes the latest; the previous one can still be fetched by number,
    // and one pushed out of the store is NOT_FOUND.
    let mut v2 = l.weights.clone();
    v2[100] ^= 0xff;
    l.control.policies.publish(2, v2.clone()).unwrap();
    let latest: Vec<u8> = fetch(&mut c, 0)
        .await
        .into_iter()
        .flat_map(|c| c.data)
        .collect();
    assert!(latest == v2);
    let old: Vec<u8> = fetch(&mut c, 1)
        .await
        .into_iter()
        .flat_map(|c| c.data)
        .collect();
    assert!(old == l.weights);
    l.control.policies.publish(3, v2).unwrap();
    let err = c
        .fetch_policy(pb::FetchPolicyRequest { version: 1 })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_or_missing_token_is_unauthenticated_on_every_rpc() {
    let l = start().await;
    let wrong = connect(&l.url, "not-the-token").await.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(l.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let missing = corvid_proto::encoded::learner_client::LearnerClient::new(channel);

    macro_rules! check_all {
        ($c:expr) => {{
            let mut c = $c;
            let codes = [
                c.register(pb::RegisterRequest {
                    actor_name: "x".into(),
                    hostname: "h".into(),
                    concurrency: 1,
                })
                .await
                .map(|_| ())
                .unwrap_err()
                .code(),
                c.next_tasks(pb::NextTasksRequest {
                    actor_id: "actor-1".into(),
                    max_tasks: 1,
                })
                .await
                .map(|_| ())
                .unwrap_err()
                .code(),
                c.policy_info(pb::PolicyInfoRequest::default())
                    .await
                    .map(|_| ())
                    .unwrap_err()
                    .code(),
                c.fetch_policy(pb::FetchPolicyRequest { version: 0 })
                    .await
                    .map(|_| ())
                    .unwrap_err()
                    .code(),
                c.submit_trajectory(trajectory_parts(
                    synthetic::header("intruder", "hops", 1, 1),
                    synthetic::steps("intruder", SHAPE),
                    synthetic::footer("intruder", SHAPE),
                ))
                .await
                .map(|_| ())
                .unwrap_err()
                .code(),
            ];
            assert_eq!(codes, [Code::Unauthenticated; 5]);
        }};
    }
    check_all!(wrong);
    check_all!(missing);
    // Nothing reached the control plane or the store.
    assert!(l.control.actors.is_empty());
    assert_eq!(l.control.dispenser.counters().episodes_issued, 0);
    assert_eq!(l.store.stats().unwrap().finished, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_only_service_refuses_the_control_rpcs_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(TrajectoryStore::open(dir.path().join("store")).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, LearnerService::new(store), TOKEN, async {
        let _ = stopped.await;
    }));
    let mut c = connect(&url, TOKEN).await.unwrap();
    let err = c
        .policy_info(pb::PolicyInfoRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("only ingests"), "{}", err.message());
}

/// What `grpc.health.v1` says of `service`, asked without a token.
async fn health_of(url: &str, service: &str) -> Result<i32, tonic::Status> {
    let mut h = corvid_proto::client::connect_health(url).await.unwrap();
    h.check(corvid_proto::health::HealthCheckRequest {
        service: service.into(),
    })
    .await
    .map(|r| r.into_inner().status)
}

#[tokio::test]
async fn health_is_not_serving_until_a_policy_is_published_and_again_once_stopping() {
    use corvid_proto::health::health_check_response::ServingStatus;
    let (serving, not_serving) = (
        ServingStatus::Serving as i32,
        ServingStatus::NotServing as i32,
    );
    let l = start_with(false).await;
    // The process is up; the learner hands out no work yet (and a token is not needed).
    assert_eq!(health_of(&l.url, "").await.unwrap(), serving);
    assert_eq!(
        health_of(&l.url, LEARNER_SERVICE).await.unwrap(),
        not_serving
    );
    let unknown = health_of(&l.url, "corvid.v1.Nothing").await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);

    l.control.policies.publish(1, l.weights.clone()).unwrap();
    let t = std::time::Instant::now();
    while health_of(&l.url, LEARNER_SERVICE).await.unwrap() != serving {
        assert!(
            t.elapsed().as_secs() < 10,
            "still NOT_SERVING after a publish"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    l.health.stopping().await;
    assert_eq!(
        health_of(&l.url, LEARNER_SERVICE).await.unwrap(),
        not_serving
    );
    assert_eq!(health_of(&l.url, "").await.unwrap(), not_serving);
    // A publish while stopping does not bring it back.
    l.control.policies.publish(2, l.weights.clone()).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(
        health_of(&l.url, LEARNER_SERVICE).await.unwrap(),
        not_serving
    );
}

#[tokio::test]
async fn an_ingest_only_service_is_serving_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(TrajectoryStore::open(dir.path().join("store")).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(serve(
        listener,
        LearnerService::new(store),
        TOKEN,
        std::future::pending(),
    ));
    // The status is written before the first call is answered: no polling.
    assert_eq!(
        health_of(&url, LEARNER_SERVICE).await.unwrap(),
        corvid_proto::health::health_check_response::ServingStatus::Serving as i32
    );
}
