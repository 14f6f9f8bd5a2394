//! The one error type of `corvid-rewards`.

use thiserror::Error;

/// Why a reward, advantage or metric could not be computed from its inputs.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RewardsError {
    /// Two slices that must be parallel have different lengths.
    #[error("{what}: expected {expected} entries, got {got}")]
    LengthMismatch {
        /// Which input, e.g. `behaviour_logp`.
        what: &'static str,
        /// Length of the reference slice.
        expected: usize,
        /// Length of the offending slice.
        got: usize,
    },
    /// A parameter is outside its allowed range.
    #[error("{name} = {value} is not allowed: {expected}")]
    InvalidParameter {
        /// Parameter name, e.g. `gamma`.
        name: &'static str,
        /// The offending value, formatted.
        value: String,
        /// What is allowed instead.
        expected: &'static str,
    },
    /// An input value is NaN or infinite.
    #[error("{what}[{index}] is not finite ({value})")]
    NotFinite {
        /// Which input.
        what: &'static str,
        /// Position of the offending value.
        index: usize,
        /// The value.
        value: f64,
    },
}

/// Rejects NaN and infinities in `xs`, naming the input.
pub(crate) fn check_finite(what: &'static str, xs: &[f64]) -> Result<(), RewardsError> {
    match xs.iter().position(|x| !x.is_finite()) {
        Some(index) => Err(RewardsError::NotFinite {
            what,
            index,
            value: xs[index],
        }),
        None => Ok(()),
    }
}

/// Checks `0 <= gamma <= 1`.
pub(crate) fn check_gamma(gamma: f64) -> Result<(), RewardsError> {
    if (0.0..=1.0).contains(&gamma) {
        Ok(())
    } else {
        Err(RewardsError::InvalidParameter {
            name: "gamma",
            value: gamma.to_string(),
            expected: "a discount in [0, 1]",
        })
    }
}
