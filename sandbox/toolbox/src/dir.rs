//! Directory listing in a few large `fd_readdir` calls, and recursive
//! removal on top of it.
//!
//! wasmtime-wasi's preview-1 `fd_readdir` lists the whole directory on every
//! call (one `getdents` pass and two `stat`s per entry) and then skips to the
//! caller's cookie. std's `read_dir` (wasi-libc `readdir`) asks with a 4 KiB
//! buffer, about 140 short names per call, so walking a directory of n
//! entries costs about n²/70 host `stat`s: 12,000 entries took over 4 s,
//! longer than a call's deadline. Here the buffer starts at
//! [`FIRST_BUF_BYTES`] and grows ×4 whenever it comes back full, so a listing
//! takes O(log n) calls; 12,000 entries fit by the third.
//!
//! Listings are sorted by name (byte order) so every command's output is
//! deterministic whatever order the host filesystem returns.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    fn fd_readdir(fd: u32, buf: *mut u8, buf_len: usize, cookie: u64, used: *mut usize) -> u16;
    fn path_unlink_file(fd: u32, path: *const u8, path_len: usize) -> u16;
}

/// First `fd_readdir` buffer: about 1,000 short names, small enough to stay
/// inside the module's initial memory.
const FIRST_BUF_BYTES: usize = 32 << 10;
/// Largest buffer: about 500,000 short names. A directory that fills it is
/// read on in calls of this size.
const MAX_BUF_BYTES: usize = 16 << 20;
/// Size of a preview-1 `dirent` header: `d_next: u64`, `d_ino: u64`,
/// `d_namlen: u32`, `d_type: u8`, padding.
const DIRENT_BYTES: usize = 24;
/// `filetype::directory` and `filetype::symbolic_link` in preview 1.
const FILETYPE_DIRECTORY: u8 = 3;
const FILETYPE_SYMBOLIC_LINK: u8 = 7;

/// What a directory entry is, as the directory itself reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    Symlink,
    /// Regular files and everything else.
    Other,
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub kind: Kind,
}

/// The entries of directory `path`, without `.` and `..`, sorted by name.
/// Names that are not UTF-8 are skipped (the host refuses them anyway).
pub fn list(path: impl AsRef<Path>) -> io::Result<Vec<Entry>> {
    let dir = fs::File::open(path)?;
    read_fd(raw_fd(&dir)?)
}

/// The names in directory `path` (see [`list`]).
pub fn names(path: impl AsRef<Path>) -> io::Result<Vec<String>> {
    Ok(list(path)?.into_iter().map(|e| e.name).collect())
}

fn raw_fd(f: &fs::File) -> io::Result<u32> {
    u32::try_from(f.as_raw_fd()).map_err(|_| io::ErrorKind::InvalidInput.into())
}

fn errno(e: u16) -> io::Result<()> {
    match e {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(i32::from(e))),
    }
}

/// [`list`] of an open directory.
fn read_fd(fd: u32) -> io::Result<Vec<Entry>> {
    let mut entries = Vec::new();
    let mut cookie = 0u64;
    let mut len = FIRST_BUF_BYTES;
    loop {
        let mut buf = vec![0u8; len];
        let mut used = 0usize;
        // SAFETY: `buf` is valid for `len` writable bytes and `used` for one
        // usize; the host writes at most `len` bytes.
        errno(unsafe { fd_readdir(fd, buf.as_mut_ptr(), len, cookie, &mut used) })?;
        let used = used.min(len);
        let (parsed, next) = parse(&buf[..used], &mut entries);
        if used < len {
            // The host stops short of a full buffer only at the end.
            break;
        }
        if parsed == 0 && len >= MAX_BUF_BYTES {
            return Err(io::Error::other("directory entry larger than the buffer"));
        }
        if let Some(next) = next {
            cookie = next;
        }
        len = (len * 4).min(MAX_BUF_BYTES);
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// Appends the complete entries in `buf` to `out`; returns how many entries
/// were complete (including `.` and `..`) and the cookie after the last one.
fn parse(buf: &[u8], out: &mut Vec<Entry>) -> (usize, Option<u64>) {
    let (mut at, mut n, mut next) = (0usize, 0usize, None);
    while buf.len() - at >= DIRENT_BYTES {
        let head = &buf[at..at + DIRENT_BYTES];
        let d_next = u64::from_le_bytes(head[0..8].try_into().unwrap_or([0; 8]));
        let namlen = u32::from_le_bytes(head[16..20].try_into().unwrap_or([0; 4])) as usize;
        let d_type = head[20];
        let Some(name) = buf.get(at + DIRENT_BYTES..at + DIRENT_BYTES + namlen) else {
            break;
        };
        at += DIRENT_BYTES + namlen;
        n += 1;
        next = Some(d_next);
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        let kind = match d_type {
            FILETYPE_DIRECTORY => Kind::Dir,
            FILETYPE_SYMBOLIC_LINK => Kind::Symlink,
            _ => Kind::Other,
        };
        out.push(Entry {
            name: name.to_string(),
            kind,
        });
    }
    (n, next)
}

/// Removes `path` and, if it is a directory (not a link to one), everything
/// under it. Each directory is listed completely before anything in it is
/// removed; its files are unlinked relative to the open directory (one path
/// component for the host to resolve, not the whole path each time).
/// Iterative, so deep trees cannot overflow the guest stack.
pub fn remove_tree(path: &str) -> io::Result<()> {
    if !fs::symlink_metadata(path)?.is_dir() {
        return fs::remove_file(path);
    }
    // (directory, listed yet); a directory is removed on its second visit.
    let mut stack = vec![(path.trim_end_matches('/').to_string(), false)];
    if stack[0].0.is_empty() {
        stack[0].0 = "/".into();
    }
    while let Some((dir, listed)) = stack.pop() {
        if listed {
            fs::remove_dir(&dir)?;
            continue;
        }
        let handle = fs::File::open(&dir)?;
        let fd = raw_fd(&handle)?;
        let entries = read_fd(fd)?;
        stack.push((dir.clone(), true));
        for e in entries {
            if e.kind == Kind::Dir {
                stack.push((format!("{}/{}", dir.trim_end_matches('/'), e.name), false));
            } else {
                // SAFETY: the pointer and length describe `e.name`'s bytes.
                errno(unsafe { path_unlink_file(fd, e.name.as_ptr(), e.name.len()) })?;
            }
        }
    }
    Ok(())
}
