//! The `corvid.v1.Learner` gRPC service.
//!
//! - Authentication is an interceptor ([`AuthInterceptor`]): every RPC without the
//!   run's token is refused with UNAUTHENTICATED before any handler runs.
//! - `SubmitTrajectory` folds each chunk into the store as it arrives
//!   ([`submit`]), so memory stays bounded by one chunk per stream.
//! - Message sizes are capped on both directions at
//!   [`MAX_MESSAGE_BYTES`](corvid_proto::limits::MAX_MESSAGE_BYTES).
//!
//! `Register`, `NextTasks`, `PolicyInfo` and `FetchPolicy` answer UNIMPLEMENTED
//! until the learner's control plane (curriculum, weights) is attached.

mod submit;

use std::future::Future;
use std::sync::Arc;

use corvid_proto::auth::{self, AUTH_HEADER};
use corvid_proto::limits::{HTTP2_CONNECTION_WINDOW, HTTP2_STREAM_WINDOW, MAX_MESSAGE_BYTES};
use corvid_proto::pb::{self, learner_server::LearnerServer};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status, Streaming};

use crate::store::TrajectoryStore;

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

/// The learner's gRPC service.
#[derive(Debug, Clone)]
pub struct LearnerService {
    store: Arc<TrajectoryStore>,
}

impl LearnerService {
    /// A service that ingests into `store`.
    pub fn new(store: Arc<TrajectoryStore>) -> Self {
        Self { store }
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

const NOT_YET: &str = "not served by this learner yet: it arrives with the learner's control plane";

/// Response type of `FetchPolicy`.
pub type PolicyStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::PolicyChunk, Status>> + Send>>;

#[tonic::async_trait]
impl pb::learner_server::Learner for LearnerService {
    async fn register(
        &self,
        _req: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        Err(Status::unimplemented(format!("Register is {NOT_YET}")))
    }

    async fn next_tasks(
        &self,
        _req: Request<pb::NextTasksRequest>,
    ) -> Result<Response<pb::NextTasksResponse>, Status> {
        Err(Status::unimplemented(format!("NextTasks is {NOT_YET}")))
    }

    async fn policy_info(
        &self,
        _req: Request<pb::PolicyInfoRequest>,
    ) -> Result<Response<pb::PolicyInfoResponse>, Status> {
        Err(Status::unimplemented(format!("PolicyInfo is {NOT_YET}")))
    }

    type FetchPolicyStream = PolicyStream;

    async fn fetch_policy(
        &self,
        _req: Request<pb::FetchPolicyRequest>,
    ) -> Result<Response<Self::FetchPolicyStream>, Status> {
        Err(Status::unimplemented(format!("FetchPolicy is {NOT_YET}")))
    }

    async fn submit_trajectory(
        &self,
        req: Request<Streaming<pb::TrajectoryPart>>,
    ) -> Result<Response<pb::SubmitAck>, Status> {
        submit::ingest(&self.store, req.into_inner())
            .await
            .map(Response::new)
    }
}

/// Serves `service` on `listener` until `shutdown` resolves, with `token` required
/// on every call.
pub async fn serve(
    listener: TcpListener,
    service: LearnerService,
    token: impl Into<Arc<str>>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        // HTTP/2's default 64 KiB windows stall a long trajectory stream on
        // round trips; these let a few chunks be in flight per stream.
        .initial_stream_window_size(Some(HTTP2_STREAM_WINDOW))
        .initial_connection_window_size(Some(HTTP2_CONNECTION_WINDOW))
        .add_service(service.into_server(token))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}
