//! The `corvid.v1.Learner` gRPC service.
//!
//! - Authentication is an interceptor ([`AuthInterceptor`]): every RPC without the
//!   run's token is refused with UNAUTHENTICATED before any handler runs.
//! - `SubmitTrajectory` folds each chunk into the store as it arrives
//!   (`submit`), so memory stays bounded by one chunk per stream.
//! - Message sizes are capped on both directions at
//!   [`MAX_MESSAGE_BYTES`].
//!
//! - `Register` ([`register`]) hands out actor ids and the run's [`RunSettings`];
//!   `NextTasks` hands out groups of assignments from the [`TaskDispenser`]
//!   ([`crate::dispenser`]); `PolicyInfo` and `FetchPolicy` ([`policy`]) serve the
//!   versioned weights of the [`PolicyStore`]. These four need the learner's
//!   control plane ([`Control`], attached with [`LearnerService::with_control`]);
//!   a service built for ingest alone answers them FAILED_PRECONDITION.
//! - The standard health protocol `grpc.health.v1` ([`health`]) is served beside it on the
//!   same port, without a token: NOT_SERVING until the learner can hand out work, SERVING
//!   after, NOT_SERVING while it stops.

pub mod health;
pub mod policy;
pub mod register;
mod submit;

use std::future::Future;
use std::sync::Arc;

use corvid_proto::auth::{self, AUTH_HEADER};
use corvid_proto::encoded::{self, learner_server::LearnerServer};
use corvid_proto::limits::{HTTP2_CONNECTION_WINDOW, HTTP2_STREAM_WINDOW, MAX_MESSAGE_BYTES};
use corvid_proto::pb;
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

use crate::dispenser::TaskDispenser;
use crate::policy_store::PolicyStore;
use corvid_store::TrajectoryStore;

pub use health::{LearnerHealth, LEARNER_SERVICE};
pub use register::{ActorRegistry, RunSettings};
pub use submit::Admission;

/// Checks the shared token on every request.
#[derive(Clone)]
pub struct AuthInterceptor {
    token: Arc<str>,
}

impl AuthInterceptor {
    /// An interceptor accepting exactly `token`.
    pub fn new(token: impl Into<Arc<str>>) -> Self {
        Self {
            token: token.into(),
        }
    }
}

impl tonic::service::Interceptor for AuthInterceptor {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let presented = req.metadata().get(AUTH_HEADER).map(|v| v.as_bytes());
        match auth::check(presented, &self.token) {
            Ok(()) => Ok(req),
            Err(e) => Err(Status::unauthenticated(e.to_string())),
        }
    }
}

/// The learner's control plane: what the service hands out besides ingest.
#[derive(Debug)]
pub struct Control {
    /// Settings every actor receives at `Register`.
    pub settings: RunSettings,
    /// Task groups from the curriculum.
    pub dispenser: Arc<TaskDispenser>,
    /// Published policy weights.
    pub policies: Arc<PolicyStore>,
    /// Registered actors.
    pub actors: Arc<ActorRegistry>,
}

impl Control {
    /// A sign of life from `actor` (a `NextTasks` call that handed it `episodes`, a
    /// `PolicyInfo` poll, a submitted trajectory): one clock for the registry's "active"
    /// figure and the dispenser's rule 6. An empty id (an older client's poll) is no one.
    pub fn heard_from(&self, actor: &str, episodes: u64) {
        if actor.is_empty() {
            return;
        }
        self.dispenser.heard_from(actor);
        if !self.actors.seen(actor, episodes) {
            tracing::info!(
                actor,
                "an actor registered before a learner restart is back"
            );
        }
    }

    /// Actors heard from within `[rollout] actor_timeout_s`: those whose episodes the
    /// dispenser still counts as theirs (its rule 6).
    pub fn actors_active(&self) -> usize {
        self.actors.active(self.dispenser.config().actor_timeout)
    }
}

/// The learner's gRPC service.
#[derive(Debug, Clone)]
pub struct LearnerService {
    store: Arc<TrajectoryStore>,
    control: Option<Arc<Control>>,
    admission: Option<Admission>,
    health: LearnerHealth,
}

impl LearnerService {
    /// A service that ingests into `store` and serves nothing else.
    pub fn new(store: Arc<TrajectoryStore>) -> Self {
        Self {
            store,
            control: None,
            admission: None,
            health: LearnerHealth::new(),
        }
    }

    /// The service's health state ([`health`]): the learner turns it to NOT_SERVING when it
    /// starts to stop, before the server itself stops.
    pub fn health(&self) -> LearnerHealth {
        self.health.clone()
    }

    /// The same service, refusing at submit what `admission` says the policy cannot take.
    pub fn with_admission(mut self, admission: Admission) -> Self {
        self.admission = Some(admission);
        self
    }

    /// The same service, also serving registration, tasks and weights from `control`.
    pub fn with_control(mut self, control: Arc<Control>) -> Self {
        self.control = Some(control);
        self
    }

    fn control(&self, rpc: &str) -> Result<&Arc<Control>, Status> {
        self.control.as_ref().ok_or_else(|| {
            Status::failed_precondition(format!(
                "{rpc}: this learner service only ingests trajectories (it has no tasks or weights to serve)"
            ))
        })
    }

    /// The service wrapped with authentication and size limits, ready to serve.
    pub fn into_server(
        self,
        token: impl Into<Arc<str>>,
    ) -> InterceptedService<LearnerServer<Self>, AuthInterceptor> {
        let server = LearnerServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        InterceptedService::new(server, AuthInterceptor::new(token))
    }
}

/// Response type of `FetchPolicy`.
pub type PolicyStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::PolicyChunk, Status>> + Send>>;

#[tonic::async_trait]
impl encoded::learner_server::Learner for LearnerService {
    async fn register(
        &self,
        req: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let c = self.control("Register")?;
        let version = c.policies.latest_version();
        register::register(&c.actors, &c.settings, version, req.into_inner()).map(Response::new)
    }

    async fn next_tasks(
        &self,
        req: Request<pb::NextTasksRequest>,
    ) -> Result<Response<pb::NextTasksResponse>, Status> {
        let c = Arc::clone(self.control("NextTasks")?);
        let req = req.into_inner();
        if req.actor_id.is_empty() {
            return Err(Status::invalid_argument(
                "actor_id is empty; call Register first and send the id it returns",
            ));
        }
        if req.max_tasks == 0 {
            return Err(Status::invalid_argument(
                "max_tasks is 0; ask for at least one",
            ));
        }
        if c.policies.latest_version() == 0 {
            // No policy to roll out with yet (SFT is running): hand out nothing, so no group
            // opens and then waits for episodes that cannot start.
            return Ok(Response::new(pb::NextTasksResponse {
                assignments: Vec::new(),
            }));
        }
        // Opening a group generates a task instance: blocking work, off the reactor.
        let dispenser = Arc::clone(&c.dispenser);
        let actor = req.actor_id.clone();
        let assignments =
            tokio::task::spawn_blocking(move || dispenser.next(&actor, req.max_tasks))
                .await
                .map_err(|e| Status::internal(format!("task dispenser panicked: {e}")))?
                .map_err(|e| {
                    tracing::error!(error = %e, "task dispenser failed");
                    Status::internal(e.to_string())
                })?;
        c.heard_from(&req.actor_id, assignments.len() as u64);
        Ok(Response::new(pb::NextTasksResponse {
            assignments: assignments.into_iter().map(Into::into).collect(),
        }))
    }

    async fn policy_info(
        &self,
        req: Request<pb::PolicyInfoRequest>,
    ) -> Result<Response<pb::PolicyInfoResponse>, Status> {
        let c = self.control("PolicyInfo")?;
        // An actor's poll is its sign of life (dispenser, rule 6).
        c.heard_from(&req.into_inner().actor_id, 0);
        policy::info(&c.policies).map(Response::new)
    }

    type FetchPolicyStream = PolicyStream;

    async fn fetch_policy(
        &self,
        req: Request<pb::FetchPolicyRequest>,
    ) -> Result<Response<Self::FetchPolicyStream>, Status> {
        let c = self.control("FetchPolicy")?;
        policy::fetch(&c.policies, req.into_inner().version).map(Response::new)
    }

    async fn submit_trajectory(
        &self,
        req: Request<Streaming<encoded::TrajectoryPart>>,
    ) -> Result<Response<pb::SubmitAck>, Status> {
        let ack = submit::ingest(&self.store, self.admission.as_ref(), req.into_inner()).await?;
        if let (Some(c), false) = (&self.control, ack.duplicate) {
            // A new trajectory counts towards its group's completion (dispenser, rule 4).
            match self.store.get(&ack.trajectory_id) {
                Ok(Some(rec)) => {
                    let h = &rec.header;
                    c.heard_from(&h.actor_id, 0);
                    c.dispenser
                        .complete(&h.group_id, &h.actor_id, h.sampling.seed);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "cannot read back a stored trajectory"),
            }
        }
        Ok(Response::new(ack))
    }
}

/// Serves `service` on `listener` until `shutdown` resolves, with `token` required
/// on every call but the health checks.
pub async fn serve(
    listener: TcpListener,
    service: LearnerService,
    token: impl Into<Arc<str>>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let health = service.health();
    let published = service.control.as_ref().map(|c| c.policies.subscribe());
    // The learner's service has a status before the first call is answered.
    let ready = tokio::spawn(health.follow_publishes(published).await);
    let result = tonic::transport::Server::builder()
        // HTTP/2's default 64 KiB windows stall a long trajectory stream on
        // round trips; these let a few chunks be in flight per stream.
        .initial_stream_window_size(Some(HTTP2_STREAM_WINDOW))
        .initial_connection_window_size(Some(HTTP2_CONNECTION_WINDOW))
        .add_service(health.server())
        .add_service(service.into_server(token))
        // Nagle's algorithm off: a response's small writes (headers, message, trailers)
        // would otherwise wait for the peer's delayed ACK, 40 ms on Linux, before the last
        // one leaves (`docs/bench/log.md`, 2026-12-07). A socket that refuses is served as is.
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            async {
                shutdown.await;
                health.stopping().await;
            },
        )
        .await;
    ready.abort();
    result
}
