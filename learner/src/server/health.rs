//! The standard gRPC health protocol (`grpc.health.v1.Health`) on the learner's port.
//!
//! Two names are answered, as the protocol defines them:
//! - `""` (the server as a whole): SERVING while the process serves, NOT_SERVING once it is
//!   stopping. A liveness probe asks this one.
//! - `corvid.v1.Learner` ([`LEARNER_SERVICE`]): SERVING only while the learner can hand out
//!   work — a service with tasks and weights is NOT_SERVING until its first policy is
//!   published (SFT may take minutes), an ingest-only service is SERVING from the start —
//!   and NOT_SERVING once it is stopping. Actors and readiness probes ask this one.
//!
//! The health service needs no token: a Kubernetes probe sends none, and the answer tells
//! nothing about the run.

use std::sync::Arc;

use tokio::sync::{watch, Mutex};
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use tonic_health::ServingStatus;

/// The name under which the learner's own service reports its health.
pub const LEARNER_SERVICE: &str = corvid_proto::pb::learner_server::SERVICE_NAME;

/// The learner's health: what `grpc.health.v1` answers, and the switch that turns it to
/// NOT_SERVING when the learner stops. Clones share one state.
#[derive(Clone)]
pub struct LearnerHealth {
    reporter: HealthReporter,
    /// True once [`LearnerHealth::stopping`] ran; held while a status is written, so a
    /// late "ready" never overwrites "stopping".
    stopped: Arc<Mutex<bool>>,
}

impl std::fmt::Debug for LearnerHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LearnerHealth").finish_non_exhaustive()
    }
}

impl Default for LearnerHealth {
    fn default() -> Self {
        Self::new()
    }
}

impl LearnerHealth {
    /// The server SERVING, the learner's service not (yet) serving.
    pub fn new() -> Self {
        Self {
            reporter: HealthReporter::new(),
            stopped: Arc::new(Mutex::new(false)),
        }
    }

    /// The `grpc.health.v1.Health` service answering from this state.
    pub fn server(&self) -> HealthServer<HealthService> {
        HealthServer::new(HealthService::from_health_reporter(self.reporter.clone()))
    }

    /// Writes `status` for the learner's service unless the learner is stopping.
    async fn set(&self, status: ServingStatus) {
        let stopped = self.stopped.lock().await;
        if !*stopped {
            self.reporter
                .set_service_status(LEARNER_SERVICE, status)
                .await;
        }
    }

    /// Reports the learner's service as NOT_SERVING until `published` (the policy store's
    /// latest version, 0 while none) turns positive, then SERVING; `None` serves at once.
    /// Returns when the status is SERVING, or when the learner stops first.
    pub async fn serve_when_published(&self, published: Option<watch::Receiver<u64>>) {
        let Some(mut published) = published else {
            self.set(ServingStatus::Serving).await;
            return;
        };
        self.set(ServingStatus::NotServing).await;
        if published.wait_for(|v| *v > 0).await.is_ok() {
            self.set(ServingStatus::Serving).await;
            tracing::info!(
                service = LEARNER_SERVICE,
                "health: SERVING (a policy is published)"
            );
        }
    }

    /// The learner is stopping: both names answer NOT_SERVING from now on.
    pub async fn stopping(&self) {
        let mut stopped = self.stopped.lock().await;
        if *stopped {
            return;
        }
        *stopped = true;
        for name in ["", LEARNER_SERVICE] {
            self.reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
        tracing::info!("health: NOT_SERVING (stopping)");
    }
}
