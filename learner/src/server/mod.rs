//! The gRPC service.
