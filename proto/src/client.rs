//! An authenticated `Learner` client and the stream of parts for one trajectory.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::auth::{bearer, AUTH_HEADER};
use crate::limits::{HTTP2_CONNECTION_WINDOW, HTTP2_STREAM_WINDOW, MAX_MESSAGE_BYTES};
use crate::pb::{self, learner_client::LearnerClient};
use crate::{Step, TrajectoryFooter, TrajectoryHeader};

/// Adds `authorization: Bearer <token>` to every request.
#[derive(Clone)]
pub struct BearerAuth {
    value: MetadataValue<tonic::metadata::Ascii>,
}

impl BearerAuth {
    /// An interceptor for `token`; fails if the token is not printable ASCII.
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
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL does not parse.
    #[error("learner URL {url:?} is invalid: {source}")]
    Url {
        /// The URL given.
        url: String,
        /// Why.
        #[source]
        source: tonic::transport::Error,
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
    #[error("the token contains characters that cannot be sent as gRPC metadata")]
    Token,
}

/// Connects to the learner at `url` (e.g. `http://127.0.0.1:50051`) with the
/// shared token and Corvid's message-size limits.
pub async fn connect(url: &str, token: &str) -> Result<AuthedClient, ConnectError> {
    let endpoint = Endpoint::from_shared(url.to_owned()).map_err(|source| ConnectError::Url {
        url: url.to_owned(),
        source,
    })?;
    let channel = endpoint
        .initial_stream_window_size(Some(HTTP2_STREAM_WINDOW))
        .initial_connection_window_size(Some(HTTP2_CONNECTION_WINDOW))
        .connect()
        .await
        .map_err(|source| ConnectError::Connect {
            url: url.to_owned(),
            source,
        })?;
    let auth = BearerAuth::new(token).map_err(|_| ConnectError::Token)?;
    Ok(LearnerClient::with_interceptor(channel, auth)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// A boxed stream of trajectory parts, as `SubmitTrajectory` takes it.
pub type PartStream = Pin<Box<dyn Stream<Item = pb::TrajectoryPart> + Send>>;

/// The parts of one trajectory — header, steps with seq 0, 1, …, footer — produced
/// lazily from `steps`, so a long trajectory is never held whole in memory.
pub fn trajectory_parts<I>(
    header: TrajectoryHeader,
    steps: I,
    footer: TrajectoryFooter,
) -> PartStream
where
    I: IntoIterator<Item = Step>,
    I::IntoIter: Send + 'static,
{
    use pb::trajectory_part::Part;
    let head = futures::stream::once(async move {
        pb::TrajectoryPart {
            part: Some(Part::Header(header.into())),
        }
    });
    let body = futures::stream::iter(steps.into_iter().enumerate().map(|(seq, step)| {
        pb::TrajectoryPart {
            part: Some(Part::Step(pb::StepChunk {
                seq: seq as u64,
                step: Some(step.into()),
            })),
        }
    }));
    let tail = futures::stream::once(async move {
        pb::TrajectoryPart {
            part: Some(Part::Footer(footer.into())),
        }
    });
    head.chain(body).chain(tail).boxed()
}
