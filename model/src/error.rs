//! [`ModelError`]: everything that can go wrong building, running or loading the model.

use crate::cuda;

/// Everything that can go wrong building, running or loading the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `ModelConfig::preset` got an unknown name.
    #[error("unknown model preset `{0}` (expected tiny, small, k3-shape or gpu-1b)")]
    UnknownPreset(String),
    /// A config file did not parse.
    #[error("model config does not parse: {0}")]
    ConfigParse(String),
    /// A config field has a bad value.
    #[error("invalid model config: {field} = {value}: {why}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// The rule it breaks.
        why: String,
    },
    /// A Hugging Face `config.json` has a key Corvid does not implement, a value it cannot
    /// run, or a key missing that has no default.
    #[error("{file}: `{key}`: {problem}")]
    HfConfig {
        /// The config file.
        file: String,
        /// The key (dotted for nested keys, e.g. `rope_parameters.factor`).
        key: String,
        /// What is wrong with it, and what would work.
        problem: String,
    },
    /// The config's weights cannot fit the memory of the device it is built on (checked
    /// before anything is allocated, [`ModelConfig::check_fits`](crate::ModelConfig::check_fits)).
    #[error("model config too large for {device}: {detail}")]
    TooLarge {
        /// The device (`cpu`, `cuda:0`).
        device: String,
        /// The config field that drives the size.
        field: &'static str,
        /// The size, the limit, where the limit comes from and the largest part.
        detail: String,
    },
    /// The model's device does not exist.
    #[error("model device: {0}")]
    Device(String),
    /// Bad input to a forward or sampler (shapes, token ids, positions).
    #[error("model input: {0}")]
    Input(String),
    /// A checkpoint tensor is missing, truncated or mismatched.
    #[error("checkpoint tensor `{tensor}`: {problem}")]
    Checkpoint {
        /// The tensor name (or `<header>`).
        tensor: String,
        /// What is wrong.
        problem: String,
    },
    /// Reading or writing a checkpoint file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// libtorch reported an error.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// A custom CUDA kernel could not run (no CUDA, or bad inputs).
    #[error("CUDA kernel: {0}")]
    Cuda(#[from] cuda::CudaError),
}
