//! The actor's side of the `corvid.v1.Learner` protocol: a reconnecting link, the learner's
//! health (`grpc.health.v1`, asked before registering), `Register`, `NextTasks`, and weight
//! sync (`PolicyInfo` polling, `FetchPolicy` assembly with size and
//! SHA-256 checks), plus the exponential back-off every retry uses.

use std::sync::Arc;
use std::time::Duration;

use corvid_episode::FormatDescription;
use corvid_model::ModelConfig;
use corvid_proto::client::{check_token, connect, connect_health, AuthedClient, ConnectError};
use corvid_proto::health::{health_check_response::ServingStatus, HealthCheckRequest};
use corvid_proto::{pb, Assignment, SamplingParams};
use futures::StreamExt;
use tonic::Code;

use crate::error::ActorError;
use crate::policy::PolicyUpdate;

/// Exponential back-off with jitter.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
    jitter_state: u64,
}

impl Backoff {
    /// Starts at `initial`, doubles per failure up to `max`; each wait is jittered by ±20%.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            current: initial,
            jitter_state: (std::process::id() as u64) ^ 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// The next wait (and doubles the one after).
    pub fn next_delay(&mut self) -> Duration {
        let base = self.current;
        self.current = (self.current * 2).min(self.max);
        // xorshift for jitter; no need for a real RNG here.
        let mut x = self.jitter_state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.jitter_state = x;
        let frac = (x % 1000) as f64 / 1000.0; // [0, 1)
        base.mul_f64(0.8 + 0.4 * frac)
    }

    /// Back to the initial wait after a success.
    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

/// Whether a failed call may succeed later (the learner is restarting, busy, or the
/// stream of the same trajectory is still live on its side).
pub fn retryable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::Unknown
            | Code::Aborted
            | Code::Cancelled
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Internal
    )
}

/// A learner connection that is (re)established on demand.
#[derive(Clone)]
pub struct LearnerLink {
    url: Arc<str>,
    token: Arc<str>,
    client: Arc<tokio::sync::Mutex<Option<AuthedClient>>>,
}

impl std::fmt::Debug for LearnerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LearnerLink")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// The run's settings as the actor uses them.
#[derive(Debug, Clone)]
pub struct Registration {
    /// Id the learner gave this actor.
    pub actor_id: String,
    /// Run name.
    pub run_name: String,
    /// Default sampling (assignments carry their own).
    pub sampling: SamplingParams,
    /// Longest context the model takes.
    pub max_context: u32,
    /// How often to poll `PolicyInfo`.
    pub policy_poll_interval: Duration,
    /// The policy's architecture.
    pub model_config: ModelConfig,
    /// Latest policy version at registration (0: none yet).
    pub policy_version: u64,
    /// The run's episode format, which this actor's own must equal.
    pub episode_format: FormatDescription,
    /// Record each token's expert ids in the steps (the run's `[rollout] record_routes`).
    pub record_routes: bool,
}

/// `PolicyInfo`'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyInfo {
    /// Latest version.
    pub version: u64,
    /// Size of its weights.
    pub total_bytes: u64,
    /// Hex SHA-256 of its weights.
    pub sha256: String,
}

/// Why a connection to the learner failed, as far as the error's `source()` chain tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NetworkCause {
    /// Nothing accepts connections at the address (`ECONNREFUSED`).
    Refused,
    /// The host name does not resolve.
    Dns,
    /// No answer in time.
    TimedOut,
    /// The connection was reset or closed under the call.
    Closed,
    /// No route to the host or network.
    Unreachable,
    /// Anything else.
    Other,
}

impl NetworkCause {
    /// What to check, for an operator reading the log.
    fn hint(self) -> &'static str {
        match self {
            NetworkCause::Refused => "is `corvid learner` running and listening at that address?",
            NetworkCause::Dns => "the host name does not resolve; check the host in the learner URL",
            NetworkCause::TimedOut => {
                "no answer in time; is the learner's host up, and its port open through any firewall?"
            }
            NetworkCause::Closed => {
                "the connection was closed; the learner may be restarting, or what listens there \
                 is not a `corvid learner`"
            }
            NetworkCause::Unreachable => "no route to that host; check the address and the network",
            NetworkCause::Other => "is `corvid learner` running and reachable at that address?",
        }
    }

    fn of_io(kind: std::io::ErrorKind) -> Option<Self> {
        use std::io::ErrorKind as K;
        Some(match kind {
            K::ConnectionRefused => NetworkCause::Refused,
            K::TimedOut => NetworkCause::TimedOut,
            K::ConnectionReset
            | K::ConnectionAborted
            | K::BrokenPipe
            | K::UnexpectedEof
            | K::NotConnected => NetworkCause::Closed,
            K::HostUnreachable | K::NetworkUnreachable | K::NetworkDown | K::AddrNotAvailable => {
                NetworkCause::Unreachable
            }
            _ => return None,
        })
    }
}

/// The cause of a network failure and the text of its source chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NetworkFailure {
    /// The first cause the chain names (by type: `std::io::Error` kinds, tonic's timeout).
    pub cause: NetworkCause,
    /// The messages of the chain, each once, without tonic's bare "transport error"
    /// (`tcp connect error: Connection refused (os error 111)`).
    pub detail: String,
}

impl NetworkFailure {
    /// Walks `err` and its `source()` chain.
    pub fn from_chain(err: &(dyn std::error::Error + 'static)) -> Self {
        let mut cause = None;
        let mut parts: Vec<String> = Vec::new();
        for e in chain(err) {
            if cause.is_none() {
                cause = if let Some(io) = e.downcast_ref::<std::io::Error>() {
                    NetworkCause::of_io(io.kind())
                } else if e.is::<tonic::TimeoutExpired>() {
                    Some(NetworkCause::TimedOut)
                } else if let Some(h) = e.downcast_ref::<hyper::Error>() {
                    // A request on a connection the peer closed before or while it was
                    // sent: "operation was canceled: connection closed".
                    (h.is_canceled() || h.is_closed() || h.is_incomplete_message())
                        .then_some(NetworkCause::Closed)
                } else {
                    None
                };
            }
            // tonic's wrapper says only "transport error"; what failed is below it.
            if e.is::<tonic::transport::Error>() {
                continue;
            }
            let text = e.to_string();
            if cause.is_none() && text == "dns error" {
                // hyper-util's resolver error is not an exported type, and the resolver's
                // own io::Error has no distinguishing kind: its message is all there is.
                cause = Some(NetworkCause::Dns);
            }
            // Wrappers that show their source's message (tonic::ConnectError) add nothing.
            if !text.is_empty() && parts.last() != Some(&text) {
                parts.push(text);
            }
        }
        let detail = if parts.is_empty() {
            err.to_string()
        } else {
            parts.join(": ")
        };
        Self {
            cause: cause.unwrap_or(NetworkCause::Other),
            detail,
        }
    }
}

/// `cannot connect to the learner at URL: <chain>; <hint>` (or `WHAT: cannot reach the
/// learner at URL: …` for a call that failed on the way), from `err`'s source chain.
pub(crate) fn unreachable_message(
    what: Option<&str>,
    url: &str,
    err: &(dyn std::error::Error + 'static),
) -> String {
    let f = NetworkFailure::from_chain(err);
    let hint = f.cause.hint();
    match what {
        None => format!(
            "cannot connect to the learner at {url}: {}; {hint}",
            f.detail
        ),
        Some(w) => format!(
            "{w}: cannot reach the learner at {url}: {}; {hint}",
            f.detail
        ),
    }
}

/// `err`, then each error of its `source()` chain.
fn chain<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(err), |e| e.source())
}

/// Whether `err` or an error in its source chain is a `T`.
fn chain_has<T: std::error::Error + 'static>(err: &(dyn std::error::Error + 'static)) -> bool {
    chain(err).any(|e| e.is::<T>())
}

fn connect_message(e: &ConnectError) -> String {
    match e {
        ConnectError::Connect { url, source } => unreachable_message(None, url, source),
        // The URL or the token: the message already says what is wrong.
        other => other.to_string(),
    }
}

fn status_message(what: &str, url: &str, status: &tonic::Status) -> String {
    use std::error::Error as _;
    match status.source() {
        // Made by the client from a transport failure, not sent by the learner.
        Some(src) if chain_has::<tonic::transport::Error>(src) => {
            unreachable_message(Some(what), url, src)
        }
        _ => format!("{what}: {status}"),
    }
}

/// A failed learner call: retryable or not (see [`LinkError::is_retryable`]).
///
/// A learner that cannot be reached displays as what was tried (the URL, and the call)
/// and why it failed, from the transport error's source chain (connection refused, DNS,
/// timeout…), with a hint what to check.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The learner could not be reached, or the URL or token is unusable (see
    /// [`ConnectError::is_permanent`]).
    #[error("{}", connect_message(.0))]
    Connect(#[from] ConnectError),
    /// The learner answered with an error status, or the call failed on the way (then
    /// the status's source is the transport error).
    #[error("{}", status_message(what, url, status))]
    Status {
        /// The call.
        what: String,
        /// The learner's URL.
        url: String,
        /// Its status.
        status: tonic::Status,
    },
    /// The learner answers its health checks but cannot hand out work yet (it is in SFT,
    /// has no policy yet, or is stopping).
    #[error("the learner at {url} reports {status} for {service} (grpc.health.v1)")]
    NotServing {
        /// The learner's URL.
        url: String,
        /// The service asked about.
        service: String,
        /// What it answered (`NOT_SERVING`, `UNKNOWN`).
        status: String,
    },
    /// The answer does not make sense.
    #[error("{0}")]
    Protocol(#[from] ActorError),
}

impl LinkError {
    /// Whether trying again later may help. A learner that does not answer may be
    /// starting; a URL that does not parse or a token that cannot be sent never improves.
    pub fn is_retryable(&self) -> bool {
        match self {
            LinkError::Connect(e) => !e.is_permanent(),
            LinkError::Status { status, .. } => retryable(status),
            LinkError::NotServing { .. } => true,
            LinkError::Protocol(ActorError::Weights { .. }) => true,
            LinkError::Protocol(_) => false,
        }
    }
}

impl LearnerLink {
    /// A link to `url` with the shared `token`; nothing is connected yet.
    pub fn new(url: &str, token: &str) -> Self {
        Self {
            url: url.into(),
            token: token.into(),
            client: Arc::new(tokio::sync::Mutex::new(None)),
        }
    }

    /// The learner's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A connected client (connecting if needed).
    pub async fn client(&self) -> Result<AuthedClient, LinkError> {
        let mut guard = self.client.lock().await;
        if let Some(c) = guard.as_ref() {
            return Ok(c.clone());
        }
        let c = connect(&self.url, &self.token).await?;
        *guard = Some(c.clone());
        Ok(c)
    }

    /// A [`LinkError::Status`] for the call `what`.
    pub fn status_error(&self, what: &str, status: tonic::Status) -> LinkError {
        LinkError::Status {
            what: what.to_string(),
            url: self.url.to_string(),
            status,
        }
    }

    /// Forgets the connection after a transport failure, so the next call reconnects.
    pub async fn reset(&self) {
        *self.client.lock().await = None;
    }

    async fn note(&self, e: &LinkError) {
        let transport = match e {
            LinkError::Connect(_) => true,
            LinkError::Status { status, .. } => {
                matches!(
                    status.code(),
                    Code::Unavailable | Code::Unknown | Code::Cancelled
                )
            }
            LinkError::NotServing { .. } | LinkError::Protocol(_) => false,
        };
        if transport {
            self.reset().await;
        }
    }

    /// The learner's health (`grpc.health.v1`) for `corvid.v1.Learner`: `Ok` once it is
    /// SERVING (it hands out work), [`LinkError::NotServing`] before (retryable). A server
    /// that does not know the service (UNIMPLEMENTED, NOT_FOUND) is not a Corvid learner of
    /// this protocol: a permanent error.
    pub async fn serving(&self) -> Result<(), LinkError> {
        let service = corvid_proto::encoded::learner_server::SERVICE_NAME;
        // The health service takes no token, but a token no call could send is a mistake
        // to name now, not after the learner is up.
        check_token(&self.token)?;
        let mut health = connect_health(&self.url).await?;
        let answer = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .map_err(|s| self.status_error("grpc.health.v1.Health/Check", s))?
            .into_inner();
        match ServingStatus::try_from(answer.status) {
            Ok(ServingStatus::Serving) => Ok(()),
            other => Err(LinkError::NotServing {
                url: self.url.to_string(),
                service: service.into(),
                status: other.map_or_else(
                    |_| format!("status {}", answer.status),
                    |s| s.as_str_name().to_owned(),
                ),
            }),
        }
    }

    /// `Register`.
    pub async fn register(
        &self,
        actor_name: &str,
        hostname: &str,
        concurrency: u32,
    ) -> Result<Registration, LinkError> {
        let r = async {
            let mut c = self.client().await?;
            let resp = c
                .register(pb::RegisterRequest {
                    actor_name: actor_name.into(),
                    hostname: hostname.into(),
                    concurrency,
                })
                .await
                .map_err(|s| self.status_error("Register", s))?
                .into_inner();
            let s = resp.settings.ok_or_else(|| {
                ActorError::Learner("Register answered without run settings".into())
            })?;
            let sampling = s
                .sampling
                .ok_or_else(|| ActorError::Learner("run settings lack sampling".into()))
                .and_then(|p| {
                    SamplingParams::try_from(p).map_err(|e| ActorError::Learner(e.to_string()))
                })?;
            let model_config: ModelConfig =
                serde_json::from_str(&s.model_config_json).map_err(|e| {
                    ActorError::Learner(format!("the run's model config does not parse: {e}"))
                })?;
            model_config
                .validate()
                .map_err(|e| ActorError::Learner(format!("the run's model config: {e}")))?;
            let episode_format: FormatDescription = serde_json::from_str(&s.episode_format_json)
                .map_err(|e| {
                    ActorError::Learner(format!("the run's episode format does not parse: {e}"))
                })?;
            Ok(Registration {
                episode_format,
                record_routes: s.record_routes,
                actor_id: resp.actor_id,
                run_name: s.run_name,
                sampling,
                max_context: s.max_context,
                policy_poll_interval: Duration::from_millis(u64::from(
                    s.policy_poll_interval_ms.max(50),
                )),
                model_config,
                policy_version: resp.policy_version,
            })
        }
        .await;
        if let Err(e) = &r {
            self.note(e).await;
        }
        r
    }

    /// `NextTasks`: up to `max` assignments (none under back-pressure).
    pub async fn next_tasks(&self, actor_id: &str, max: u32) -> Result<Vec<Assignment>, LinkError> {
        let r = async {
            let mut c = self.client().await?;
            let resp = c
                .next_tasks(pb::NextTasksRequest {
                    actor_id: actor_id.into(),
                    max_tasks: max,
                })
                .await
                .map_err(|s| self.status_error("NextTasks", s))?
                .into_inner();
            let mut out = Vec::with_capacity(resp.assignments.len());
            for a in resp.assignments {
                out.push(Assignment::try_from(a).map_err(|e| {
                    LinkError::Protocol(ActorError::Learner(format!("assignment: {e}")))
                })?);
            }
            Ok(out)
        }
        .await;
        if let Err(e) = &r {
            self.note(e).await;
        }
        r
    }

    /// `PolicyInfo`, as the actor `actor_id` (its sign of life to the learner; empty for
    /// a caller that is not a registered actor).
    pub async fn policy_info(&self, actor_id: &str) -> Result<PolicyInfo, LinkError> {
        let r = async {
            let mut c = self.client().await?;
            let i = c
                .policy_info(pb::PolicyInfoRequest {
                    actor_id: actor_id.into(),
                })
                .await
                .map_err(|s| self.status_error("PolicyInfo", s))?
                .into_inner();
            Ok(PolicyInfo {
                version: i.version,
                total_bytes: i.total_bytes,
                sha256: i.sha256,
            })
        }
        .await;
        if let Err(e) = &r {
            self.note(e).await;
        }
        r
    }

    /// `FetchPolicy(version)` (0 = latest): assembles the chunks in order, then checks the
    /// size and the SHA-256 every chunk announced.
    pub async fn fetch_policy(&self, version: u64) -> Result<PolicyUpdate, LinkError> {
        let r = async {
            let mut c = self.client().await?;
            let mut stream = c
                .fetch_policy(pb::FetchPolicyRequest { version })
                .await
                .map_err(|s| self.status_error("FetchPolicy", s))?
                .into_inner();
            let mut bytes: Vec<u8> = Vec::new();
            let mut meta: Option<(u64, u64, String)> = None;
            let mut last = false;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|s| self.status_error("FetchPolicy stream", s))?;
                let this = (chunk.version, chunk.total_bytes, chunk.sha256.clone());
                let weights_err = |why: String| {
                    LinkError::Protocol(ActorError::Weights {
                        version: chunk.version,
                        why,
                    })
                };
                match &meta {
                    None => {
                        if chunk.total_bytes > (16u64 << 30) {
                            return Err(weights_err(format!(
                                "{} bytes announced; refusing",
                                chunk.total_bytes
                            )));
                        }
                        bytes.reserve(chunk.total_bytes as usize);
                        meta = Some(this);
                    }
                    Some(m) if *m != this => {
                        return Err(weights_err(
                            "chunks disagree on version, size or checksum".into(),
                        ))
                    }
                    Some(_) => {}
                }
                if chunk.offset != bytes.len() as u64 {
                    return Err(weights_err(format!(
                        "chunk at offset {} but {} bytes received so far",
                        chunk.offset,
                        bytes.len()
                    )));
                }
                bytes.extend_from_slice(&chunk.data);
                if chunk.last {
                    last = true;
                    break;
                }
            }
            let (v, total, sha) = meta.ok_or_else(|| {
                LinkError::Protocol(ActorError::Learner("FetchPolicy sent no chunk".into()))
            })?;
            if !last {
                return Err(LinkError::Protocol(ActorError::Weights {
                    version: v,
                    why: "the stream ended before the last chunk".into(),
                }));
            }
            Ok(PolicyUpdate::verified(v, bytes, total, &sha)?)
        }
        .await;
        if let Err(e) = &r {
            self.note(e).await;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_bounded_jitter() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let waits: Vec<Duration> = (0..7).map(|_| b.next_delay()).collect();
        let bases = [100u64, 200, 400, 800, 1000, 1000, 1000];
        for (w, base) in waits.iter().zip(bases) {
            let ms = w.as_secs_f64() * 1000.0;
            assert!(
                ms >= base as f64 * 0.8 - 1e-6 && ms <= base as f64 * 1.2 + 1e-6,
                "{ms} vs {base}"
            );
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(120));
    }

    /// A test error: a message and an optional source.
    #[derive(Debug)]
    struct Layer(
        &'static str,
        Option<Box<dyn std::error::Error + Send + Sync>>,
    );

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    fn layer(msg: &'static str, source: impl std::error::Error + Send + Sync + 'static) -> Layer {
        Layer(msg, Some(Box::new(source)))
    }

    fn io(kind: std::io::ErrorKind, msg: &str) -> std::io::Error {
        std::io::Error::new(kind, msg.to_string())
    }

    #[test]
    fn the_cause_of_a_network_failure_comes_from_the_source_chain() {
        use std::io::ErrorKind as K;
        let cases: Vec<(Layer, NetworkCause, &str)> = vec![
            (
                // As hyper-util nests it: tonic::ConnectError shows its source's message.
                layer(
                    "tcp connect error",
                    layer(
                        "tcp connect error",
                        io(K::ConnectionRefused, "Connection refused"),
                    ),
                ),
                NetworkCause::Refused,
                "tcp connect error: Connection refused",
            ),
            (
                layer(
                    "dns error",
                    io(
                        K::Other,
                        "failed to lookup address information: Name or service not known",
                    ),
                ),
                NetworkCause::Dns,
                "dns error: failed to lookup address information: Name or service not known",
            ),
            (
                layer("connect", tonic::TimeoutExpired(())),
                NetworkCause::TimedOut,
                "connect: Timeout expired",
            ),
            (
                layer("tcp connect error", io(K::TimedOut, "Connection timed out")),
                NetworkCause::TimedOut,
                "tcp connect error: Connection timed out",
            ),
            (
                layer(
                    "connection error",
                    io(K::ConnectionReset, "Connection reset by peer"),
                ),
                NetworkCause::Closed,
                "connection error: Connection reset by peer",
            ),
            (
                layer(
                    "tcp connect error",
                    io(K::NetworkUnreachable, "Network is unreachable"),
                ),
                NetworkCause::Unreachable,
                "tcp connect error: Network is unreachable",
            ),
            (
                Layer("h2 protocol error", None),
                NetworkCause::Other,
                "h2 protocol error",
            ),
        ];
        for (err, cause, detail) in cases {
            let f = NetworkFailure::from_chain(&err);
            assert_eq!((f.cause, f.detail.as_str()), (cause, detail));
        }
    }

    #[test]
    fn an_unreachable_learner_is_reported_with_its_url_cause_and_a_hint() {
        let err = layer(
            "tcp connect error",
            io(std::io::ErrorKind::ConnectionRefused, "Connection refused"),
        );
        assert_eq!(
            unreachable_message(None, "http://10.0.0.5:50051", &err),
            "cannot connect to the learner at http://10.0.0.5:50051: tcp connect error: \
             Connection refused; is `corvid learner` running and listening at that address?"
        );
        assert_eq!(
            unreachable_message(Some("PolicyInfo"), "http://10.0.0.5:50051", &err),
            "PolicyInfo: cannot reach the learner at http://10.0.0.5:50051: tcp connect error: \
             Connection refused; is `corvid learner` running and listening at that address?"
        );
        let dns = layer("dns error", io(std::io::ErrorKind::Other, "no such host"));
        assert_eq!(
            unreachable_message(None, "http://learner.invalid:1", &dns),
            "cannot connect to the learner at http://learner.invalid:1: dns error: no such host; \
             the host name does not resolve; check the host in the learner URL"
        );
        // A status the learner sent (no transport error under it) reads as before.
        let link = LearnerLink::new("http://10.0.0.5:50051", "s3cret");
        let e = link.status_error("Register", tonic::Status::unauthenticated("wrong token"));
        assert!(
            e.to_string().starts_with("Register: ") && e.to_string().contains("wrong token"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_closed_loopback_port_is_reported_as_refused_naming_the_url() {
        // Nothing listens on loopback port 1.
        let url = "http://127.0.0.1:1";
        let e = LearnerLink::new(url, "s3cret")
            .register("a", "h", 1)
            .await
            .unwrap_err();
        assert!(e.is_retryable(), "{e}");
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("cannot connect to the learner at {url}: ")),
            "{text}"
        );
        assert!(
            text.to_lowercase().contains("connection refused"),
            "the root cause: {text}"
        );
        assert!(
            text.ends_with("; is `corvid learner` running and listening at that address?"),
            "{text}"
        );
        assert!(!text.contains("transport error"), "{text}");
    }

    #[tokio::test]
    async fn a_server_that_drops_connections_is_reported_naming_the_url() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                drop(conn);
            }
        });
        let e = LearnerLink::new(&url, "s3cret")
            .policy_info("")
            .await
            .unwrap_err();
        assert!(e.is_retryable(), "{e}");
        let text = e.to_string();
        assert!(text.contains(&format!("the learner at {url}: ")), "{text}");
        assert!(!text.contains("transport error"), "{text}");
        // "connection error: connection reset" or, by timing, hyper's "operation was
        // canceled: connection closed": either way the closed-connection hint.
        assert!(text.ends_with(NetworkCause::Closed.hint()), "{text}");
    }

    #[tokio::test]
    async fn a_bad_url_or_token_is_permanent_and_an_unreachable_learner_retryable() {
        // Nothing listens on loopback port 1: dialling fails with a transport error.
        let down = LearnerLink::new("http://127.0.0.1:1", "s3cret");
        let e = down.register("a", "h", 1).await.unwrap_err();
        assert!(
            matches!(&e, LinkError::Connect(ConnectError::Connect { .. })),
            "{e:?}"
        );
        assert!(e.is_retryable(), "{e}");

        let e = LearnerLink::new("not a url", "s3cret")
            .register("a", "h", 1)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, LinkError::Connect(ConnectError::Url { .. })),
            "{e:?}"
        );
        assert!(!e.is_retryable(), "{e}");

        // The token is refused as such even though the learner is down too.
        let e = LearnerLink::new("http://127.0.0.1:1", "s3c\u{1}ret")
            .policy_info("")
            .await
            .unwrap_err();
        assert!(
            matches!(&e, LinkError::Connect(ConnectError::Token { index: 3, .. })),
            "{e:?}"
        );
        assert!(!e.is_retryable(), "{e}");

        let link = LearnerLink::new("http://127.0.0.1:1", "s3cret");
        let status = |code| link.status_error("Register", tonic::Status::new(code, "x"));
        assert!(status(Code::Unavailable).is_retryable());
        assert!(!status(Code::Unauthenticated).is_retryable());
        assert!(!status(Code::InvalidArgument).is_retryable());
    }
}
