//! An authenticated `Learner` client, the learner's health client, and the stream of parts
//! for one trajectory.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tonic::codegen::http::uri::{InvalidUri, Uri};
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_client::HealthClient;

use crate::auth::{bearer, first_invalid_token_byte, AUTH_HEADER};
use crate::encoded::{learner_client::LearnerClient, TrajectoryPart};
use crate::limits::{
    CONNECT_TIMEOUT, HTTP2_CONNECTION_WINDOW, HTTP2_STREAM_WINDOW, MAX_MESSAGE_BYTES,
};
use crate::{Step, TrajectoryFooter, TrajectoryHeader};

/// Adds `authorization: Bearer <token>` to every request.
#[derive(Clone)]
pub struct BearerAuth {
    value: MetadataValue<tonic::metadata::Ascii>,
}

impl BearerAuth {
    /// An interceptor for `token`; fails if `Bearer <token>` is not a valid metadata value
    /// ([`check_token`] is stricter: visible ASCII only).
    pub fn new(token: &str) -> Result<Self, tonic::metadata::errors::InvalidMetadataValue> {
        Ok(Self {
            value: bearer(token).parse()?,
        })
    }
}

impl tonic::service::Interceptor for BearerAuth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert(AUTH_HEADER, self.value.clone());
        Ok(req)
    }
}

/// The client type every Corvid caller uses.
pub type AuthedClient = LearnerClient<InterceptedService<Channel, BearerAuth>>;

/// Errors while connecting.
///
/// [`ConnectError::Url`] and [`ConnectError::Token`] are mistakes in the caller's
/// settings that no retry fixes; only [`ConnectError::Connect`] may go away (the learner
/// is not up yet, or restarting). See [`ConnectError::is_permanent`].
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL does not parse, or is not `http://HOST[:PORT]`.
    #[error("learner URL {url:?} is invalid: {why}")]
    Url {
        /// The URL given.
        url: String,
        /// Why.
        why: String,
    },
    /// Nothing answered.
    #[error("cannot connect to the learner at {url}: {source}")]
    Connect {
        /// The URL given.
        url: String,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// The token cannot be sent as metadata.
    #[error(
        "the token cannot be sent as gRPC metadata: byte 0x{byte:02x} at position {index} is \
         not visible ASCII (a token may only hold the characters ! to ~)"
    )]
    Token {
        /// Position of the first offending byte in the token.
        index: usize,
        /// That byte.
        byte: u8,
    },
}

impl ConnectError {
    /// Whether this error is in the settings (URL, token) rather than in the network:
    /// trying again with the same settings cannot succeed.
    pub fn is_permanent(&self) -> bool {
        matches!(self, ConnectError::Url { .. } | ConnectError::Token { .. })
    }
}

/// Checks a learner URL the way [`connect`] uses it and returns its endpoint. The URL must
/// parse and be `http://HOST[:PORT]`: this build has no TLS, and a URL without a scheme
/// (`127.0.0.1:50051`) would parse but never connect.
pub fn learner_endpoint(url: &str) -> Result<Endpoint, ConnectError> {
    let bad = |why: String| ConnectError::Url {
        url: url.to_owned(),
        why,
    };
    let uri: Uri = url.parse().map_err(|e: InvalidUri| bad(e.to_string()))?;
    match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("http") => {}
        Some(s) if s.eq_ignore_ascii_case("https") => {
            return Err(bad(
                "https is not supported (this build has no TLS); use http://HOST:PORT".into(),
            ))
        }
        Some(s) => {
            return Err(bad(format!(
                "scheme {s:?} is not http; use http://HOST:PORT"
            )))
        }
        None => return Err(bad("it has no scheme; use http://HOST:PORT".into())),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("it names no host; use http://HOST:PORT".into()));
    }
    Ok(Endpoint::from(uri))
}

/// Checks that `token` can be sent as gRPC metadata (visible ASCII only).
pub fn check_token(token: &str) -> Result<(), ConnectError> {
    match first_invalid_token_byte(token.as_bytes()) {
        Some((index, byte)) => Err(ConnectError::Token { index, byte }),
        None => Ok(()),
    }
}

/// Connects to the learner at `url` (e.g. `http://127.0.0.1:50051`) with the
/// shared token and Corvid's message-size limits. The URL and the token are checked
/// before anything is dialled, so a mistake in either shows as such even while the
/// learner is down.
pub async fn connect(url: &str, token: &str) -> Result<AuthedClient, ConnectError> {
    let endpoint = learner_endpoint(url)?;
    check_token(token)?;
    let auth = BearerAuth::new(token).map_err(|_| {
        // check_token refuses everything a metadata value cannot hold; belt and braces.
        ConnectError::Token {
            index: 0,
            byte: token.as_bytes().first().copied().unwrap_or(0),
        }
    })?;
    let channel = dial(url, endpoint).await?;
    Ok(LearnerClient::with_interceptor(channel, auth)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// Connects to the standard health service (`grpc.health.v1`) on the learner's port at
/// `url`; it needs no token. Ask it for `encoded::learner_server::SERVICE_NAME` to learn whether
/// the learner hands out work yet.
pub async fn connect_health(url: &str) -> Result<HealthClient<Channel>, ConnectError> {
    let endpoint = learner_endpoint(url)?;
    Ok(HealthClient::new(dial(url, endpoint).await?))
}

/// A channel to `endpoint` with Corvid's connect timeout and HTTP/2 windows.
async fn dial(url: &str, endpoint: Endpoint) -> Result<Channel, ConnectError> {
    endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .initial_stream_window_size(Some(HTTP2_STREAM_WINDOW))
        .initial_connection_window_size(Some(HTTP2_CONNECTION_WINDOW))
        .connect()
        .await
        .map_err(|source| ConnectError::Connect {
            url: url.to_owned(),
            source,
        })
}

/// A boxed stream of trajectory parts, as `SubmitTrajectory` takes it.
pub type PartStream = Pin<Box<dyn Stream<Item = TrajectoryPart> + Send>>;

/// The parts of one trajectory — header, steps with seq 0, 1, …, footer — produced
/// lazily from `steps`, each step encoded once as it is sent, so a long trajectory is never
/// held whole in memory.
pub fn trajectory_parts<I>(
    header: TrajectoryHeader,
    steps: I,
    footer: TrajectoryFooter,
) -> PartStream
where
    I: IntoIterator<Item = Step>,
    I::IntoIter: Send + 'static,
{
    let head = futures::stream::once(async move { TrajectoryPart::header(header) });
    let body = futures::stream::iter(
        (steps.into_iter().enumerate()).map(|(seq, step)| TrajectoryPart::step(seq as u64, step)),
    );
    let tail = futures::stream::once(async move { TrajectoryPart::footer(footer) });
    head.chain(body).chain(tail).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learner_urls_must_be_http_with_a_host() {
        for ok in [
            "http://127.0.0.1:50051",
            "http://learner.local:50051/",
            "HTTP://10.0.0.5:1",
        ] {
            assert!(learner_endpoint(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("not a url", "invalid uri character"),
            ("127.0.0.1:50051", "no scheme"),
            ("learner", "no scheme"),
            ("https://learner:50051", "no TLS"),
            ("grpc://learner:50051", "is not http"),
            ("", "empty"),
        ] {
            let e = learner_endpoint(bad).unwrap_err();
            assert!(e.is_permanent());
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("{bad:?}")) && msg.contains(why),
                "{msg}"
            );
        }
    }

    #[test]
    fn a_bad_url_or_token_fails_before_dialling() {
        // Port 1 on loopback has no learner: dialling would fail with Connect.
        let e = futures::executor::block_on(connect("not a url", "tok")).err();
        assert!(matches!(e, Some(ConnectError::Url { .. })), "{e:?}");
        let e = futures::executor::block_on(connect("http://127.0.0.1:1", "to\u{1}k")).err();
        assert!(
            matches!(e, Some(ConnectError::Token { index: 2, byte: 1 })),
            "{e:?}"
        );
        assert!(e.is_some_and(|e| e.is_permanent()));
        assert!(check_token("s3cret-Tok_en.42~").is_ok());
    }
}
