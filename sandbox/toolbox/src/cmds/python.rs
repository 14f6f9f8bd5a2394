//! `python` and `python3`: handed to the host, which runs them as the sandbox's `python` tool
//! (`-c CODE`, `-m MODULE`, a script, or the program on standard input) in this workspace,
//! with this stage's input as standard input. Where the call has no interpreter (a task that
//! does not allow the `python` tool) the command is not found.

use std::io;

use super::{Io, NOT_FOUND};

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "corvid")]
extern "C" {
    /// Runs python with `argv` (NUL-terminated: the working directory, then the arguments
    /// after `python`) and `stdin`;
    /// returns the length of the result `python_result` copies out, or -1 where the host has
    /// no interpreter for this call.
    #[link_name = "python"]
    fn host_python(argv: *const u8, argv_len: u32, stdin: *const u8, stdin_len: u32) -> i32;
    /// Copies the pending result: the exit status and the stdout length as little-endian
    /// `u32`s, then stdout, then stderr.
    #[link_name = "python_result"]
    fn host_python_result(buf: *mut u8, len: u32);
}

/// The host's result for `args` and `input`, or `None` where it has no interpreter.
#[cfg(target_arch = "wasm32")]
fn run_on_host(args: &[String], input: &[u8]) -> Option<Vec<u8>> {
    // NUL-terminated entries: the working directory (a `cd` earlier in the line moved it),
    // then the arguments.
    let cwd = std::env::current_dir()
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "/workspace".into());
    let mut argv = Vec::new();
    for a in std::iter::once(&cwd).chain(args) {
        argv.extend_from_slice(a.as_bytes());
        argv.push(0);
    }
    // SAFETY: both buffers live across the call, and their lengths are theirs.
    let n = unsafe {
        host_python(
            argv.as_ptr(),
            argv.len() as u32,
            input.as_ptr(),
            input.len() as u32,
        )
    };
    let n = usize::try_from(n).ok()?;
    let mut buf = vec![0u8; n];
    // SAFETY: `buf` holds `n` bytes, the length the host announced.
    unsafe { host_python_result(buf.as_mut_ptr(), n as u32) };
    Some(buf)
}

#[cfg(not(target_arch = "wasm32"))]
fn run_on_host(_args: &[String], _input: &[u8]) -> Option<Vec<u8>> {
    None
}

pub(super) fn python(io: &mut Io<'_>, args: &[String]) -> io::Result<i32> {
    let Some(result) = run_on_host(args, io.input) else {
        io.err("not available here (only in tasks that allow the python tool)");
        return Ok(NOT_FOUND);
    };
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(result.get(at..at + 4)?.try_into().ok()?))
    };
    let (Some(status), Some(out_len)) = (word(0), word(4)) else {
        io.err("malformed result from the host");
        return Ok(1);
    };
    let out_end = (8 + out_len as usize).min(result.len());
    io.out.write_all(&result[8..out_end])?;
    let stderr = &result[out_end..];
    match io.err.as_deref_mut() {
        Some(e) => e.write_all(stderr)?,
        None => io.out.write_all(stderr)?,
    }
    Ok(status as i32)
}
