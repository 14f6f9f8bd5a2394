//! Checkpoints: a policy folder holds the weights as safetensors, under the VarStore's stable
//! names, and the config as `config.json` beside them.
//!
//! - `safetensors` turns weights into safetensors bytes and back through Hugging Face's
//!   `safetensors` crate (the bytes stream to actors), and copies parsed tensors into a
//!   VarStore strictly: every model tensor present with the same shape, extra tensors an
//!   error, each cast to its variable's kind. A bad file gets an error that names the tensor
//!   (or `<header>`) and the problem.
//! - `folder` saves and loads policy folders. Weight files are memory-mapped, never read
//!   whole; a folder may also hold its weights as shards listed by
//!   `model.safetensors.index.json`.

mod folder;
mod safetensors;

pub use self::folder::{
    load, load_config, load_weights, save, stored_kind, CONFIG_FILE, WEIGHTS_FILE,
    WEIGHTS_INDEX_FILE,
};
pub(crate) use self::folder::{with_views, Release};
pub(crate) use self::safetensors::{kind_and_shape, tensors_to_bytes};
pub use self::safetensors::{
    load_weights_from_bytes, policy_to_bytes, read_safetensors, rope_in_bytes, weights_to_bytes,
    ROPE_METADATA_KEY,
};
