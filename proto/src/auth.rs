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

/// The first byte of `token` that gRPC metadata cannot carry in a token, as
/// `(index, byte)`; `None` when every byte is visible ASCII (`!` to `~`, 0x21-0x7E).
///
/// HTTP/2 header values allow visible ASCII, spaces and tabs; a token is one word of
/// visible ASCII, so a space or tab inside it is refused as well (it is almost surely a
/// mistake, and `Bearer <token>` must stay unambiguous).
pub fn first_invalid_token_byte(token: &[u8]) -> Option<(usize, u8)> {
    token
        .iter()
        .position(|b| !b.is_ascii_graphic())
        .map(|i| (i, token[i]))
}

/// Reads a token file: the first line, with surrounding whitespace (and a trailing
/// `\r\n` or `\n`) trimmed. Refuses an empty token and a token with any byte that is
/// not visible ASCII (see [`first_invalid_token_byte`]): such a token could never be sent
/// as gRPC metadata, so no actor could connect. The error names the offending byte's
/// offset in the file; callers name the file (once: this error does not).
pub fn read_token_file(path: &std::path::Path) -> Result<String, std::io::Error> {
    let bytes = std::fs::read(path)?;
    let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    let line = bytes.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let token = line.trim_ascii();
    if token.is_empty() {
        return Err(invalid(
            "the first line holds no token (the file is empty)".into(),
        ));
    }
    // Offset of the token within the file (only leading whitespace precedes it).
    let start = line.len() - line.trim_ascii_start().len();
    if let Some((i, b)) = first_invalid_token_byte(token) {
        return Err(invalid(format!(
            "byte 0x{b:02x} at offset {} (line 1, column {}) is not visible ASCII; \
             a token may only hold the characters ! to ~ (0x21-0x7e), as gRPC metadata \
             can carry them",
            start + i,
            start + i + 1
        )));
    }
    // Visible ASCII is valid UTF-8.
    String::from_utf8(token.to_vec()).map_err(|e| invalid(e.to_string()))
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

    /// A token file with `bytes` in a fresh folder (corvid-proto has no tempfile
    /// dependency); the folder goes when the guard drops.
    struct TokenFile(std::path::PathBuf);

    impl Drop for TokenFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn token_file(bytes: &[u8]) -> (TokenFile, std::path::PathBuf) {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "corvid-proto-token-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, bytes).unwrap();
        (TokenFile(dir), path)
    }

    #[test]
    fn a_token_file_yields_its_first_line_trimmed() {
        for text in [
            &b"s3cret-Tok_en.42~\n"[..],
            b"s3cret-Tok_en.42~",
            b"  s3cret-Tok_en.42~\r\nsecond line is ignored\n",
        ] {
            let (_dir, path) = token_file(text);
            assert_eq!(read_token_file(&path).unwrap(), "s3cret-Tok_en.42~");
        }
    }

    #[test]
    fn a_token_file_with_a_control_byte_is_refused_naming_the_offset() {
        let (_dir, path) = token_file(b"  abc\x01def\n");
        let err = read_token_file(&path).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        let msg = err.to_string();
        // The caller names the file; the error says where in it.
        assert!(!msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.starts_with("byte 0x01 at offset 5"), "{msg}");
        // Whatever the file accepts, the client must be able to send.
        let ok = token_file(b"abc\n");
        assert!(crate::client::BearerAuth::new(&read_token_file(&ok.1).unwrap()).is_ok());
    }

    #[test]
    fn a_token_file_with_spaces_non_ascii_or_nothing_is_refused() {
        for (text, needle) in [
            (&b"two words\n"[..], "byte 0x20 at offset 3"),
            ("caf\u{e9}\n".as_bytes(), "byte 0xc3 at offset 3"),
            (b"\xff\xfe\n", "byte 0xff at offset 0"),
            (b"tok\x7f\n", "byte 0x7f at offset 3"),
            (b"", "holds no token"),
            (b" \n\ntoken-on-line-3\n", "holds no token"),
        ] {
            let (_dir, path) = token_file(text);
            let msg = read_token_file(&path).unwrap_err().to_string();
            assert!(msg.contains(needle), "{text:?}: {msg}");
        }
    }
}
