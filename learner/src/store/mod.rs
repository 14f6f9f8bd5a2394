//! The durable trajectory store (sled).
