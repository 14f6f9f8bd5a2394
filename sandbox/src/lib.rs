//! The Corvid tool sandbox (see the sandbox issue).
