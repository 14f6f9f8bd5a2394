//! The MoE policy model (see the model issue).
