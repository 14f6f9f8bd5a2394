//! `SubmitTrajectory` over a real tonic server on loopback into a real store:
//! round trip, idempotence, authentication and every malformed-stream class,
//! each leaving nothing partial behind.

use std::sync::Arc;

use corvid_learner::server::{serve, Admission, LearnerService};
use corvid_proto::client::{connect, trajectory_parts, AuthedClient};
use corvid_proto::encoded;
use corvid_proto::limits::MAX_STEP_CHUNK_BYTES;
use corvid_proto::pb::{self, trajectory_part::Part};
use corvid_proto::synthetic::{self, Shape};
use corvid_proto::{RouteShape, Step};
use corvid_store::TrajectoryStore;
use prost::Message;
use tonic::Code;

const TOKEN: &str = "test-token";

struct Learner {
    url: String,
    store: Arc<TrajectoryStore>,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start() -> Learner {
    start_admitting(None).await
}

/// A learner whose service checks `admission` at submit.
async fn start_admitting(admission: Option<Admission>) -> Learner {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(TrajectoryStore::open(dir.path().join("store")).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut service = LearnerService::new(Arc::clone(&store));
    if let Some(a) = admission {
        service = service.with_admission(a);
    }
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
        _dir: dir,
        _stop: stop,
    }
}

async fn client(l: &Learner) -> AuthedClient {
    connect(&l.url, TOKEN).await.unwrap()
}

fn header_part(id: &str) -> pb::TrajectoryPart {
    pb::TrajectoryPart {
        part: Some(Part::Header(synthetic::header(id, "hops", 1, 0).into())),
    }
}

fn step_part(seq: u64, step: Step) -> pb::TrajectoryPart {
    pb::TrajectoryPart {
        part: Some(Part::Step(pb::StepChunk {
            seq,
            step: Some(step.into()),
        })),
    }
}

fn footer_part(id: &str, shape: Shape) -> pb::TrajectoryPart {
    pb::TrajectoryPart {
        part: Some(Part::Footer(synthetic::footer(id, shape).into())),
    }
}

async fn submit(
    c: &mut AuthedClient,
    parts: Vec<pb::TrajectoryPart>,
) -> Result<pb::SubmitAck, tonic::Status> {
    let parts = parts.into_iter().map(encoded::TrajectoryPart::from);
    c.submit_trajectory(futures::stream::iter(parts))
        .await
        .map(|r| r.into_inner())
}

/// Nothing of `id` is visible, open or left in the step tree.
fn assert_nothing_of(store: &TrajectoryStore, id: &str) {
    assert!(store.get(id).unwrap().is_none(), "{id} is visible");
    assert_eq!(
        store.stats().unwrap().open,
        0,
        "{id} left an open trajectory"
    );
    assert_eq!(store.stats().unwrap().finished, 0);
}

const SMALL: Shape = Shape {
    steps: 3,
    tokens_per_step: 10,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn million_token_trajectory_round_trips_byte_identical() {
    let l = start().await;
    let mut c = client(&l).await;
    let shape = Shape {
        steps: 1000,
        tokens_per_step: 1000,
    };
    let id = "million";
    let ack = c
        .submit_trajectory(trajectory_parts(
            synthetic::header(id, "hops", 8, 3),
            synthetic::steps(id, shape),
            synthetic::footer(id, shape),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (ack.duplicate, ack.steps_stored, ack.tokens_stored),
        (false, 1000, 1_000_000)
    );

    let rec = l.store.get(id).unwrap().unwrap();
    assert_eq!(rec.header, synthetic::header(id, "hops", 8, 3));
    let mut n = 0;
    for (seq, stored) in l.store.steps(id).unwrap().unwrap().enumerate() {
        let want = synthetic::step(id, seq as u64, shape);
        let stored = pb::Step::from(stored.unwrap()).encode_to_vec();
        assert!(
            stored == pb::Step::from(want).encode_to_vec(),
            "step {seq} differs"
        );
        n += 1;
    }
    assert_eq!(n, 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resubmitting_a_finished_id_is_acked_and_stored_once() {
    let l = start().await;
    let mut c = client(&l).await;
    let send = |c: &mut AuthedClient| {
        let mut c = c.clone();
        async move {
            c.submit_trajectory(trajectory_parts(
                synthetic::header("t1", "hops", 1, 0),
                synthetic::steps("t1", SMALL),
                synthetic::footer("t1", SMALL),
            ))
            .await
            .unwrap()
            .into_inner()
        }
    };
    let first = send(&mut c).await;
    let second = send(&mut c).await;
    assert!(!first.duplicate);
    assert!(second.duplicate);
    assert_eq!((second.steps_stored, second.tokens_stored), (3, 30));
    let stats = l.store.stats().unwrap();
    assert_eq!((stats.finished, stats.steps), (1, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_token_is_unauthenticated() {
    let l = start().await;
    let channel = tonic::transport::Endpoint::from_shared(l.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut anonymous = encoded::learner_client::LearnerClient::new(channel);
    let err = anonymous
        .submit_trajectory(futures::stream::iter(vec![header_part("t1").into()]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("missing"), "{}", err.message());
    let err = anonymous
        .policy_info(pb::PolicyInfoRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    let mut wrong = connect(&l.url, "not-the-token").await.unwrap();
    let err = submit(
        &mut wrong,
        vec![
            header_part("t1"),
            footer_part(
                "t1",
                Shape {
                    steps: 0,
                    tokens_per_step: 0,
                },
            ),
        ],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("wrong token"), "{}", err.message());
    assert_nothing_of(&l.store, "t1");
}

async fn assert_invalid(l: &Learner, parts: Vec<pb::TrajectoryPart>, id: &str, says: &str) {
    let mut c = client(l).await;
    let err = submit(&mut c, parts).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(
        err.message().contains(says),
        "message {:?} should say {says:?}",
        err.message()
    );
    assert_nothing_of(&l.store, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_streams_are_invalid_argument_and_leave_nothing() {
    let l = start().await;
    let s = |seq| synthetic::step("t1", seq, SMALL);
    assert_invalid(
        &l,
        vec![footer_part("t1", SMALL)],
        "t1",
        "a footer arrived before the header",
    )
    .await;
    assert_invalid(
        &l,
        vec![step_part(0, s(0))],
        "t1",
        "step chunk seq 0 arrived before the header",
    )
    .await;
    assert_invalid(
        &l,
        vec![
            header_part("t1"),
            step_part(0, s(0)),
            step_part(2, s(2)),
            footer_part("t1", SMALL),
        ],
        "t1",
        "sequence gap: expected step chunk seq 1, got 2",
    )
    .await;
    assert_invalid(
        &l,
        vec![
            header_part("t1"),
            step_part(0, s(0)),
            header_part("t2"),
            footer_part("t1", SMALL),
        ],
        "t1",
        "a header for trajectory \"t2\" arrived mid-stream",
    )
    .await;
    assert_invalid(
        &l,
        vec![header_part("t1"), step_part(0, s(0))],
        "t1",
        "stream ended after 1 step chunks without a footer",
    )
    .await;
    assert_invalid(
        &l,
        vec![
            header_part("t1"),
            step_part(0, s(0)),
            footer_part("t1", SMALL),
        ],
        "t1",
        "footer.step_count is 3 but 1 were streamed",
    )
    .await;
    let no_step = pb::TrajectoryPart {
        part: Some(Part::Step(pb::StepChunk { seq: 0, step: None })),
    };
    assert_invalid(
        &l,
        vec![header_part("t1"), no_step, footer_part("t1", SMALL)],
        "t1",
        "step chunk seq 0 has no step",
    )
    .await;
    let mut bad = s(0);
    bad.logprobs.pop();
    assert_invalid(
        &l,
        vec![header_part("t1"), step_part(0, bad)],
        "t1",
        "step.logprobs",
    )
    .await;
    let mut bad_header = header_part("t1");
    if let Some(Part::Header(h)) = &mut bad_header.part {
        h.trajectory_id = "../etc".into();
    }
    assert_invalid(&l, vec![bad_header], "t1", "trajectory_id").await;
    assert_invalid(&l, vec![], "t1", "empty stream").await;
    let mut all = vec![header_part("t1")];
    all.extend((0..3).map(|i| step_part(i, s(i))));
    all.push(footer_part("t1", SMALL));
    all.push(step_part(3, s(3)));
    assert_invalid(&l, all, "t1", "step chunk seq 3 arrived after the footer").await;
}

const ROUTES: RouteShape = RouteShape {
    moe_layers: 3,
    experts_per_token: 2,
    routed_experts: 8,
};

fn routed_header(id: &str, routes: Option<RouteShape>) -> pb::TrajectoryPart {
    let mut h = synthetic::header(id, "hops", 1, 0);
    h.routes = routes;
    pb::TrajectoryPart {
        part: Some(Part::Header(h.into())),
    }
}

fn routed_step(id: &str, seq: u64) -> Step {
    synthetic::with_routes(id, seq, synthetic::step(id, seq, SMALL), ROUTES)
}

/// The policy a refusal case is submitted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// An MoE policy of [`ROUTES`]'s shape, vocabulary 50,000.
    Moe,
    /// A dense policy: it takes no routes.
    Dense,
    /// The MoE policy in a run that replays the actors' routes: it requires them.
    Replay,
}

impl Policy {
    const ALL: [Policy; 3] = [Policy::Moe, Policy::Dense, Policy::Replay];

    fn admission(self) -> Admission {
        Admission {
            vocab_size: 50_000,
            routes: (self != Policy::Dense).then_some(ROUTES),
            require_routes: self == Policy::Replay,
        }
    }
}

/// A trajectory the learner must refuse: to whom it goes, and what the refusal says.
struct Refusal {
    name: &'static str,
    policy: Policy,
    id: &'static str,
    parts: Vec<pb::TrajectoryPart>,
    says: &'static str,
}

/// Header, `steps` and footer of routed trajectory `id`.
fn routed_whole(id: &str, routes: Option<RouteShape>, steps: Vec<Step>) -> Vec<pb::TrajectoryPart> {
    let mut parts = vec![routed_header(id, routes)];
    parts.extend(
        steps
            .into_iter()
            .enumerate()
            .map(|(i, s)| step_part(i as u64, s)),
    );
    parts.push(footer_part(id, SMALL));
    parts
}

/// A well-formed routed trajectory `id`.
fn routed_good(id: &str) -> Vec<Step> {
    (0..SMALL.steps).map(|i| routed_step(id, i)).collect()
}

/// Every way routes or tokens can be wrong at submit, each refused before anything is stored.
fn refusals() -> Vec<Refusal> {
    let good = routed_good("r2");
    let whole = |id, steps| routed_whole(id, Some(ROUTES), steps);
    // One row too many in the first step (it has none for its first token).
    let mut extra_row = good.clone();
    extra_row[0] = synthetic::with_routes("r2", 1, synthetic::step("r2", 0, SMALL), ROUTES);
    let mut past_experts = good.clone();
    past_experts[1].routes[5] = 8;
    let mut past_vocab = good.clone();
    past_vocab[2].token_ids[1] = 50_000;
    let unrouted: Vec<Step> = (0..SMALL.steps)
        .map(|i| synthetic::step("r4", i, SMALL))
        .collect();
    let other = RouteShape {
        routed_experts: 16,
        ..ROUTES
    };
    let refusal = |name, policy, id, parts, says| Refusal {
        name,
        policy,
        id,
        parts,
        says,
    };
    vec![
        refusal("extra_row", Policy::Moe, "r2", whole("r2", extra_row), "step chunk seq 0: step.routes"),
        refusal("past_experts", Policy::Moe, "r2", whole("r2", past_experts), "names expert 8, but the policy has 8"),
        refusal("other_shape", Policy::Moe, "r2", routed_whole("r2", Some(other), good.clone()), "but the learner's policy routes as"),
        refusal("no_shape", Policy::Moe, "r2", routed_whole("r2", None, good.clone()), "the header declares no route shape"),
        refusal(
            "past_vocab",
            Policy::Moe,
            "r2",
            whole("r2", past_vocab),
            "step chunk seq 2: step.token_ids[1]` is invalid: 50000 is outside the policy's vocabulary",
        ),
        refusal("dense", Policy::Dense, "r3", routed_whole("r3", Some(ROUTES), routed_good("r3")), "the learner's policy is dense"),
        refusal("replay_without_routes", Policy::Replay, "r4", routed_whole("r4", None, unrouted), "header.routes is missing"),
    ]
}

/// Routes are checked at submit, before anything is stored or acked: their length per
/// token (one row fewer in the first step), every id below the expert count, their shape
/// against the learner's policy (none for a dense one), their presence where the run
/// replays them; token ids against the vocabulary. Each refusal names the step and field
/// and leaves nothing; a well-formed routed trajectory round-trips byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_and_vocabulary_are_checked_at_submit() {
    let ok = start_admitting(Some(Policy::Moe.admission())).await;
    let good = routed_good("r1");
    let ack = submit(
        &mut client(&ok).await,
        routed_whole("r1", Some(ROUTES), good.clone()),
    )
    .await
    .unwrap();
    assert!(!ack.duplicate);
    let (_, stored) = ok.store.load("r1").unwrap().unwrap();
    assert_eq!(stored.header.routes, Some(ROUTES));
    assert_eq!(stored.steps, good);
    let per = ROUTES.ids_per_token();
    assert_eq!(
        stored.route_ids().unwrap().len(),
        (stored.len() - 1) * per,
        "a row per input but the last"
    );
    for policy in Policy::ALL {
        let l = start_admitting(Some(policy.admission())).await;
        for r in refusals().into_iter().filter(|r| r.policy == policy) {
            assert_invalid(&l, r.parts, r.id, r.says).await;
        }
    }
}

/// A gRPC client that is not Corvid's (Python grpcio, its stubs generated from
/// learner.proto, each message re-serialised by Python's protobuf) gets Corvid's answers:
/// its well-formed routed trajectory is stored as Corvid's client would store it, and each
/// refusal comes with the same status and message, leaving nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpcio_client_gets_the_same_answers_as_corvids() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut learners = Vec::new();
    for policy in Policy::ALL {
        learners.push((policy, start_admitting(Some(policy.admission())).await));
    }
    let url_of = |p: Policy| {
        let l = &learners.iter().find(|(q, _)| *q == p).unwrap().1;
        l.url.trim_start_matches("http://").to_owned()
    };
    let hex = |parts: &[pb::TrajectoryPart]| -> Vec<String> {
        parts
            .iter()
            .map(|p| hex::encode(p.encode_to_vec()))
            .collect()
    };
    let good = routed_good("p1");
    let mut cases = vec![serde_json::json!({
        "name": "good", "url": url_of(Policy::Moe), "token": TOKEN,
        "parts": hex(&routed_whole("p1", Some(ROUTES), good.clone())),
    })];
    for r in refusals() {
        cases.push(serde_json::json!({
            "name": r.name, "url": url_of(r.policy), "token": TOKEN, "parts": hex(&r.parts),
        }));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cases.json");
    std::fs::write(&file, serde_json::to_vec(&cases).unwrap()).unwrap();
    let mut peer = std::process::Command::new(root.join(".corvid/venv/bin/python"));
    peer.arg(root.join("scripts/grpc_peer.py"))
        .arg("--proto-dir")
        .arg(root.join("proto"))
        .arg("--cases")
        .arg(&file);
    let out = tokio::task::spawn_blocking(move || peer.output())
        .await
        .unwrap()
        .unwrap_or_else(|e| {
            panic!(
                "running .corvid/venv/bin/python ({e}): run `make` or scripts/bootstrap.sh first"
            )
        });
    assert!(
        out.status.success(),
        "grpc_peer.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: serde_json::Value = serde_json::from_slice(&out.stdout).expect("answers JSON");

    let moe = &learners[0].1;
    assert_eq!(answers["good"]["code"], "OK", "{answers}");
    assert_eq!(
        answers["good"]["ack"]["steps_stored"], SMALL.steps,
        "{answers}"
    );
    let (_, stored) = moe.store.load("p1").unwrap().unwrap();
    assert_eq!(stored.steps, good);
    for r in refusals() {
        let l = &learners.iter().find(|(p, _)| *p == r.policy).unwrap().1;
        let theirs = &answers[r.name];
        let ours = submit(&mut client(l).await, r.parts).await.unwrap_err();
        assert_eq!(theirs["code"], "INVALID_ARGUMENT", "{}: {theirs}", r.name);
        assert_eq!(theirs["details"], ours.message(), "{}", r.name);
        assert!(
            ours.message().contains(r.says),
            "{}: {}",
            r.name,
            ours.message()
        );
        assert!(
            l.store.get(r.id).unwrap().is_none(),
            "{} stored {}",
            r.name,
            r.id
        );
        assert_eq!(l.store.stats().unwrap().open, 0, "{}", r.name);
    }
}

/// A context-only step whose `StepChunk` encoding is exactly `target` bytes.
fn chunk_of_size(seq: u64, target: usize) -> pb::TrajectoryPart {
    let tokens = target / 8; // each token costs ~6 bytes (id, mask, logprob, version)
    let mut step = Step::context(0, vec![1; tokens]);
    let mut pad = 0usize;
    loop {
        step.tool_call = Some(corvid_proto::ToolCall {
            name: "x".into(),
            arguments_json: "y".repeat(pad),
        });
        let chunk = pb::StepChunk {
            seq,
            step: Some(step.clone().into()),
        };
        let len = chunk.encoded_len();
        if len == target {
            return step_part(seq, step);
        }
        // Varint length prefixes can move by a byte as the padding grows: converge from both sides.
        pad = if len < target {
            pad + (target - len)
        } else {
            pad - (len - target)
        };
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_chunk_size_limit_holds_at_its_exact_edge() {
    let l = start().await;
    let mut c = client(&l).await;
    for (id, size) in [
        ("under", MAX_STEP_CHUNK_BYTES - 1),
        ("at", MAX_STEP_CHUNK_BYTES),
    ] {
        let part = chunk_of_size(0, size);
        let Some(Part::Step(chunk)) = &part.part else {
            unreachable!()
        };
        let step = Step::try_from(chunk.step.clone().unwrap()).unwrap();
        let shape_footer = corvid_proto::TrajectoryFooter {
            step_count: 1,
            token_count: step.token_ids.len() as u64,
            generated_token_count: 0,
            ..synthetic::footer(id, SMALL)
        };
        let footer = pb::TrajectoryPart {
            part: Some(Part::Footer(shape_footer.into())),
        };
        let ack = submit(&mut c, vec![header_part(id), part, footer])
            .await
            .unwrap();
        assert_eq!(ack.steps_stored, 1, "{id}");
    }
    let err = submit(
        &mut c,
        vec![
            header_part("over"),
            chunk_of_size(0, MAX_STEP_CHUNK_BYTES + 1),
        ],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains(&format!(
            "is {} bytes, over the {MAX_STEP_CHUNK_BYTES}-byte limit",
            MAX_STEP_CHUNK_BYTES + 1
        )),
        "{}",
        err.message()
    );
    assert!(l.store.get("over").unwrap().is_none());
    assert_eq!(l.store.stats().unwrap().open, 0);
    assert_eq!(l.store.stats().unwrap().finished, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_are_each_stored_once() {
    let l = start().await;
    let c = client(&l).await;
    // Sixteen streams multiplexed on one HTTP/2 connection; the server handles
    // each in its own task.
    let sends = (0..16).map(|i| {
        let mut c = c.clone();
        async move {
            let id = format!("c{i}");
            let shape = Shape {
                steps: 20,
                tokens_per_step: 100,
            };
            c.submit_trajectory(trajectory_parts(
                synthetic::header(&id, "hops", 1, 0),
                synthetic::steps(&id, shape),
                synthetic::footer(&id, shape),
            ))
            .await
            .unwrap()
            .into_inner()
        }
    });
    for ack in futures::future::join_all(sends).await {
        assert!(!ack.duplicate);
    }
    let stats = l.store.stats().unwrap();
    assert_eq!(
        (stats.finished, stats.steps, stats.tokens),
        (16, 320, 32_000)
    );
}
