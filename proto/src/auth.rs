//! Shared-token authentication carried in gRPC metadata.
//!
//! Actors send `authorization: Bearer <token>`; the learner compares it in constant
//! time with the run's token. Tokens are read from a file, never from a flag, so
//! they do not show in `ps`.

/// The metadata key that carries the token.
pub const AUTH_HEADER: &str = "authorization";

/// The metadata value for `token`.
pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Why a presented token was refused; the text is what the caller sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `authorization` metadata at all.
    #[error("missing `authorization: Bearer <token>` metadata")]
    Missing,
    /// Metadata present but not of the form `Bearer <token>`.
    #[error("`authorization` metadata is not of the form `Bearer <token>`")]
    Malformed,
    /// A well-formed token that is not the run's.
    #[error("wrong token")]
    Wrong,
}

/// Checks the value of the `authorization` metadata (if any) against `expected`.
pub fn check(presented: Option<&[u8]>, expected: &str) -> Result<(), AuthError> {
    let value = presented.ok_or(AuthError::Missing)?;
    let token = value.strip_prefix(b"Bearer ").ok_or(AuthError::Malformed)?;
    if constant_time_eq(token, expected.as_bytes()) {
        Ok(())
    } else {
        Err(AuthError::Wrong)
    }
}

/// Compares without an early exit, so timing does not reveal a matching prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads a token file: the first line, trimmed. Empty tokens are refused.
pub fn read_token_file(path: &std::path::Path) -> Result<String, std::io::Error> {
    let text = std::fs::read_to_string(path)?;
    let token = text.lines().next().unwrap_or("").trim().to_owned();
    if token.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("token file {} is empty", path.display()),
        ));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_the_exact_bearer_token() {
        assert_eq!(check(Some(b"Bearer s3cret"), "s3cret"), Ok(()));
        assert_eq!(check(None, "s3cret"), Err(AuthError::Missing));
        assert_eq!(check(Some(b"s3cret"), "s3cret"), Err(AuthError::Malformed));
        assert_eq!(
            check(Some(b"Bearer s3cre"), "s3cret"),
            Err(AuthError::Wrong)
        );
        assert_eq!(
            check(Some(b"Bearer s3cret "), "s3cret"),
            Err(AuthError::Wrong)
        );
    }
}
