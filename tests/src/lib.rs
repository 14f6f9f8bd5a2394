//! Corvid multi-process end-to-end tests over loopback.
