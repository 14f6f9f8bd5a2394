//! Sizes both sides of the protocol enforce.
//!
//! Two layers, so that an over-size chunk gets a message that says what was wrong:
//! the transport refuses any gRPC message above [`MAX_MESSAGE_BYTES`]
//! (RESOURCE_EXHAUSTED, from tonic), and the learner refuses a step chunk whose
//! encoded size is above [`MAX_STEP_CHUNK_BYTES`] (INVALID_ARGUMENT, naming the
//! chunk's seq and size). Actors split long turns well below the chunk limit.

/// Largest encoded step chunk the learner accepts (4 MiB, about 400K tokens).
pub const MAX_STEP_CHUNK_BYTES: usize = 4 << 20;

/// Largest gRPC message either side decodes or encodes (16 MiB). Above the chunk
/// limit so that the learner, not the transport, reports an over-size chunk.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Size of one `PolicyChunk`'s data when weights are streamed (1 MiB).
pub const POLICY_CHUNK_BYTES: usize = 1 << 20;

/// Longest trajectory id, in bytes.
pub const MAX_TRAJECTORY_ID_LEN: usize = 128;

/// Most steps (turns, or pieces of long turns) in one trajectory.
pub const MAX_STEPS_PER_TRAJECTORY: u64 = 1 << 20;

/// How long a client waits for the learner's TCP connection to open. Without it a host that
/// drops packets holds each attempt for the OS's TCP timeout (~2 minutes on Linux) before
/// the caller can say why, or retry.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// HTTP/2 flow-control window per stream, both sides (8 MiB).
pub const HTTP2_STREAM_WINDOW: u32 = 8 << 20;

/// HTTP/2 flow-control window per connection, both sides (32 MiB).
pub const HTTP2_CONNECTION_WINDOW: u32 = 32 << 20;
