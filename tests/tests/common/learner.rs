//! A real learner service on loopback, in its own runtime so a test can kill it (every
//! connection and handler dropped at once, as when the process dies) and restart it on the
//! same port over the same store.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corvid_learner::config::{LearnerConfig, SamplingSection};
use corvid_learner::dispenser::{DispenserConfig, DispenserState, TaskDispenser};
use corvid_learner::policy_store::PolicyStore;
use corvid_learner::server::{serve, ActorRegistry, Control, LearnerService, RunSettings};
use corvid_model::MoePolicy;
use corvid_proto::Step;
use corvid_store::{Filter, TrajectoryStore};
use corvid_tasks::{Curriculum, CurriculumConfig};

use crate::actor_common::{max_logprob_error, random_policy, test_model_config};
use corvid_actor::LoadedPolicy;
use corvid_proto::Trajectory;

/// The shared token of test learners.
pub const TOKEN: &str = "actor-test-token";

/// How the learner hands out work.
#[derive(Debug, Clone, Copy)]
pub struct LearnerOpts {
    /// Episodes per group.
    pub group_size: usize,
    /// Tokens per turn.
    pub max_new_tokens: u32,
    /// Sampling temperature.
    pub temperature: f32,
    /// PolicyInfo poll interval for actors, ms.
    pub poll_ms: u32,
}

impl Default for LearnerOpts {
    fn default() -> Self {
        Self {
            group_size: 2,
            max_new_tokens: 16,
            temperature: 1.0,
            poll_ms: 100,
        }
    }
}

/// A learner service that can be killed and restarted.
pub struct TestLearner {
    /// The store (survives restarts).
    pub store: Arc<TrajectoryStore>,
    /// Tasks, weights, registry (survive restarts).
    pub control: Arc<Control>,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Sampling temperature actors are told to use.
    pub temperature: f32,
    rt: Option<tokio::runtime::Runtime>,
    _dir: tempfile::TempDir,
}

impl TestLearner {
    /// Builds the store and control plane (publishing a random policy as version 1) and
    /// starts serving. Call from outside an async context or inside `block_in_place`.
    pub fn start(opts: LearnerOpts) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(TrajectoryStore::open(dir.path().join("store")).unwrap());
        let model_cfg = test_model_config();
        let policy = random_policy(1);
        let mut cfg = LearnerConfig {
            run_name: "actor-test".into(),
            ..LearnerConfig::default()
        };
        cfg.rl.group_size = opts.group_size;
        cfg.rollout.max_open_groups = 8;
        cfg.rollout.policy_poll_interval_ms = opts.poll_ms;
        cfg.rollout.sampling = SamplingSection {
            temperature: opts.temperature,
            top_p: 1.0,
            max_new_tokens: opts.max_new_tokens,
        };
        let curriculum = Curriculum::new(CurriculumConfig::default(), &[("hops", 3)], 5).unwrap();
        let dispenser = TaskDispenser::new(
            DispenserConfig::from_learner(&cfg, 4096),
            vec![corvid_tasks::builtin_family("hops").unwrap()],
            Arc::new(Mutex::new(curriculum)),
            DispenserState::new(11),
        )
        .unwrap();
        let policies = Arc::new(PolicyStore::new(4));
        policies.publish(1, policy.to_bytes().unwrap()).unwrap();
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
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_listener.local_addr().unwrap();
        drop(std_listener);
        let mut l = Self {
            store,
            control,
            addr,
            temperature: opts.temperature,
            rt: None,
            _dir: dir,
        };
        l.restart();
        l
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Serves again on the same address (after [`TestLearner::kill`]).
    pub fn restart(&mut self) {
        assert!(self.rt.is_none(), "already running");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let service =
            LearnerService::new(Arc::clone(&self.store)).with_control(Arc::clone(&self.control));
        let addr = self.addr;
        let listener = rt.block_on(async {
            // The port was just freed; retry briefly in case the OS holds it.
            let mut last = None;
            for _ in 0..50 {
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => return l,
                    Err(e) => last = Some(e),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("cannot rebind {addr}: {last:?}");
        });
        rt.spawn(async move {
            let _ = serve(listener, service, TOKEN, std::future::pending::<()>()).await;
        });
        self.rt = Some(rt);
    }

    /// Drops the server with every connection and in-flight call, as a crash would.
    pub fn kill(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }

    /// Publishes `policy` as a new version.
    pub fn publish(&self, policy: &LoadedPolicy) {
        self.control
            .policies
            .publish(policy.version(), policy.to_bytes().unwrap())
            .unwrap();
    }

    /// Every finished trajectory in the store, whole.
    pub fn trajectories(&self) -> Vec<Trajectory> {
        let filter = Filter::default();
        let mut out = Vec::new();
        for rec in self.store.list(&filter) {
            let rec = rec.unwrap();
            let Some(footer) = rec.footer else { continue };
            let steps: Vec<Step> = self
                .store
                .steps(&rec.header.trajectory_id)
                .unwrap()
                .unwrap()
                .map(|s| s.unwrap())
                .collect();
            out.push(Trajectory {
                header: rec.header,
                steps,
                footer,
            });
        }
        out
    }

    /// The model of the published version `v` (rebuilt from its bytes).
    pub fn model_of(&self, v: u64) -> LoadedPolicy {
        let blob = self.control.policies.get(v).expect("version kept");
        LoadedPolicy::from_bytes(&test_model_config(), tch::Device::Cpu, &blob.bytes, v).unwrap()
    }
}

impl Drop for TestLearner {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Asserts a model scores a trajectory's generated tokens as recorded.
pub fn assert_exact_logprobs(model: &MoePolicy, t: &Trajectory, temperature: f64) {
    let err = max_logprob_error(model, t, temperature);
    assert!(
        err < 1e-4,
        "{}: log-prob error {err}",
        t.header.trajectory_id
    );
}
