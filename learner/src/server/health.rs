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

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{watch, Mutex};
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use tonic_health::ServingStatus;

/// The name under which the learner's own service reports its health.
pub const LEARNER_SERVICE: &str = corvid_proto::encoded::learner_server::SERVICE_NAME;

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
    /// The server SERVING; the learner's service has no status (a check gets NOT_FOUND)
    /// until [`follow_publishes`](Self::follow_publishes) writes its first.
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

    /// Writes the learner's service status now — SERVING when there is no policy store
    /// (`published` is `None`: an ingest-only service) or a policy is already published, else
    /// NOT_SERVING — and returns the future that turns it SERVING once `published` (the policy
    /// store's latest version, 0 while none) turns positive. It resolves then, or when the
    /// learner stops first.
    ///
    /// The first status is written before this returns, so a server that answers checks only
    /// after it never calls the learner's service unknown (NOT_FOUND): an actor takes that
    /// answer for a server that is not a Corvid learner and gives up.
    pub async fn follow_publishes(
        &self,
        published: Option<watch::Receiver<u64>>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let ready_now = published.as_ref().is_none_or(|p| *p.borrow() > 0);
        self.set(if ready_now {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        })
        .await;
        let health = self.clone();
        async move {
            let Some(mut published) = published.filter(|_| !ready_now) else {
                return;
            };
            if published.wait_for(|v| *v > 0).await.is_ok() {
                health.set(ServingStatus::Serving).await;
                tracing::info!(
                    service = LEARNER_SERVICE,
                    "health: SERVING (a policy is published)"
                );
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_health::pb::health_server::Health;
    use tonic_health::pb::HealthCheckRequest;

    /// What the health service answers for the learner's service, or the status code of
    /// its error.
    async fn learner_status(h: &LearnerHealth) -> Result<i32, tonic::Code> {
        let service = HealthService::from_health_reporter(h.reporter.clone());
        service
            .check(tonic::Request::new(HealthCheckRequest {
                service: LEARNER_SERVICE.into(),
            }))
            .await
            .map(|r| r.into_inner().status)
            .map_err(|s| s.code())
    }

    #[tokio::test]
    async fn the_first_status_is_written_before_the_follower_runs() {
        let h = LearnerHealth::new();
        // Before anything is written, the service is unknown: what a server must never say.
        assert_eq!(learner_status(&h).await, Err(tonic::Code::NotFound));

        let (publish, published) = watch::channel(0u64);
        let follower = h.follow_publishes(Some(published)).await;
        assert_eq!(
            learner_status(&h).await,
            Ok(ServingStatus::NotServing as i32)
        );
        publish.send(1).unwrap();
        follower.await;
        assert_eq!(learner_status(&h).await, Ok(ServingStatus::Serving as i32));

        // An ingest-only service, and one whose policy is out already, serve at once.
        for published in [None, Some(watch::channel(3u64).1)] {
            let h = LearnerHealth::new();
            let _follower = h.follow_publishes(published).await;
            assert_eq!(learner_status(&h).await, Ok(ServingStatus::Serving as i32));
        }
    }

    #[tokio::test]
    async fn a_publish_after_stopping_leaves_it_not_serving() {
        let h = LearnerHealth::new();
        let (publish, published) = watch::channel(0u64);
        let follower = h.follow_publishes(Some(published)).await;
        h.stopping().await;
        publish.send(1).unwrap();
        follower.await;
        assert_eq!(
            learner_status(&h).await,
            Ok(ServingStatus::NotServing as i32)
        );
    }
}
