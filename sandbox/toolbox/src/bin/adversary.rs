//! A hostile WASI preview-1 program for the sandbox's adversarial tests.
//! `adversary CASE [ARG...]`; each case tries one way out of the box and
//! prints what happened. It is never registered outside tests.

use std::fs;
use std::io::{Read, Write};

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    fn path_open(
        fd: u32,
        dirflags: u32,
        path: *const u8,
        path_len: usize,
        oflags: u16,
        rights_base: u64,
        rights_inheriting: u64,
        fdflags: u16,
        opened_fd: *mut u32,
    ) -> u16;
    fn path_filestat_set_times(
        fd: u32,
        flags: u32,
        path: *const u8,
        path_len: usize,
        atim: u64,
        mtim: u64,
        fst: u16,
    ) -> u16;
    fn path_link(
        old_fd: u32,
        old_flags: u32,
        old: *const u8,
        old_len: usize,
        new_fd: u32,
        new: *const u8,
        new_len: usize,
    ) -> u16;
    fn path_rename(
        fd: u32,
        old: *const u8,
        old_len: usize,
        new_fd: u32,
        new: *const u8,
        new_len: usize,
    ) -> u16;
    fn path_symlink(old: *const u8, old_len: usize, fd: u32, new: *const u8, new_len: usize)
        -> u16;
    fn random_get(buf: *mut u8, len: usize) -> u16;
    fn poll_oneoff(inp: *const u8, out: *mut u8, n: usize, nevents: *mut usize) -> u16;
    fn fd_prestat_dir_name(fd: u32, path: *mut u8, len: usize) -> u16;
    fn sock_accept(fd: u32, flags: u16, out: *mut u32) -> u16;
}

/// Finds the preopen fd whose guest name is `name`.
fn preopen(name: &str) -> u32 {
    for fd in 3..16u32 {
        let mut buf = [0u8; 64];
        let e = unsafe { fd_prestat_dir_name(fd, buf.as_mut_ptr(), name.len()) };
        if e == 0 && &buf[..name.len()] == name.as_bytes() {
            return fd;
        }
    }
    u32::MAX
}

/// Every rights bit WASI preview 1 defines.
const ALL_RIGHTS: u64 = 0x1FFF_FFFF;

fn report(label: &str, errno: u16) {
    println!(
        "{label}: {}",
        if errno == 0 {
            "ok".to_string()
        } else {
            format!("errno {errno}")
        }
    );
}

/// Recursion that lives on the wasm stack only (no shadow-stack frame).
#[inline(never)]
fn recurse(n: u64) -> u64 {
    if std::hint::black_box(n) == u64::MAX {
        return 0;
    }
    recurse(n + 1).wrapping_mul(3).wrapping_add(n)
}

/// Recursion with big locals: overflows Rust's shadow stack in linear memory.
#[inline(never)]
#[allow(unconditional_recursion)]
fn recurse_shadow(n: u64, buf: &mut [u8; 256]) -> u64 {
    buf[(n % 256) as usize] = n as u8;
    let mut local = [0u8; 256];
    local[0] = buf[0];
    recurse_shadow(n + 1, &mut local) + local[(n % 7) as usize] as u64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let case = args.get(1).map(String::as_str).unwrap_or("");
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    match case {
        "loop" => {
            let mut x: u64 = 0;
            loop {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        "memfill" => {
            // Bulk memory ops on a bounded heap, forever.
            let mut v = vec![0u8; 32 << 20];
            let mut i: u8 = 0;
            loop {
                i = i.wrapping_add(1);
                std::hint::black_box(&mut v).fill(i);
                let (a, b) = v.split_at_mut(16 << 20);
                a.copy_from_slice(b);
            }
        }
        "grow" => {
            let mut keep: Vec<Vec<u8>> = Vec::new();
            loop {
                keep.push(vec![1u8; 16 << 20]);
                std::hint::black_box(&keep);
            }
        }
        "grow-small" => {
            let mut keep: Vec<Vec<u8>> = Vec::new();
            loop {
                keep.push(vec![1u8; 64 << 10]);
                std::hint::black_box(&keep);
            }
        }
        "recurse" => println!("{}", recurse(0)),
        "recurse-shadow" => {
            let mut b = [0u8; 256];
            println!("{}", recurse_shadow(0, &mut b));
        }
        "spew" => {
            let chunk = vec![b'x'; 1 << 16];
            let mut out = std::io::stdout();
            let mut written: u64 = 0;
            while written < (1u64 << 30) {
                if out.write_all(&chunk).is_err() {
                    eprintln!("stdout closed after {written} bytes");
                    std::process::exit(3);
                }
                written += chunk.len() as u64;
            }
        }
        "spew-err" => {
            let chunk = vec![b'e'; 1 << 16];
            let mut err = std::io::stderr();
            for _ in 0..(1 << 14) {
                if err.write_all(&chunk).is_err() {
                    std::process::exit(3);
                }
            }
        }
        "bigfile" => {
            // Write up to ARG MiB into one file.
            let mib: usize = arg(2).parse().unwrap_or(1024);
            let chunk = vec![b'z'; 1 << 20];
            let Ok(mut f) = fs::File::create("/workspace/big.bin") else {
                std::process::exit(4)
            };
            for i in 0..mib {
                if f.write_all(&chunk).is_err() {
                    println!("write failed after {i} MiB");
                    std::process::exit(5);
                }
            }
        }
        "manyfiles" => {
            let n: usize = arg(2).parse().unwrap_or(100_000);
            let _ = fs::create_dir("/workspace/many");
            for i in 0..n {
                if fs::write(format!("/workspace/many/f{i}"), b"").is_err() {
                    println!("create failed after {i}");
                    std::process::exit(5);
                }
            }
        }
        "random" => {
            let len: usize = arg(2).parse().unwrap_or(1 << 30);
            let mut buf = vec![0u8; len.min(8 << 20)];
            let e = unsafe { random_get(buf.as_mut_ptr(), len) };
            report("random_get", e);
        }
        "random-print" => {
            let mut buf = [0u8; 16];
            let e = unsafe { random_get(buf.as_mut_ptr(), 16) };
            report("random_get", e);
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let m = std::time::Instant::now();
            println!("{buf:?} {t} {:?}", m.elapsed());
        }
        "sleep" => {
            // A raw clock subscription: 3600 s relative.
            let mut sub = [0u8; 48];
            sub[8] = 0; // tag = clock
            sub[24..32].copy_from_slice(&3_600_000_000_000u64.to_le_bytes());
            let mut evt = [0u8; 32];
            let mut n: usize = 0;
            let e = unsafe { poll_oneoff(sub.as_ptr(), evt.as_mut_ptr(), 1, &mut n) };
            report("poll_oneoff", e);
        }
        "std-sleep" => {
            std::thread::sleep(std::time::Duration::from_secs(3600));
            println!("slept");
        }
        "fds" => {
            let n: usize = arg(2).parse().unwrap_or(10_000);
            let _ = fs::write("/workspace/fd.txt", b"x");
            let mut keep = Vec::new();
            for i in 0..n {
                match fs::File::open("/workspace/fd.txt") {
                    Ok(f) => keep.push(f),
                    Err(_) => {
                        println!("open failed after {i}");
                        return;
                    }
                }
            }
            println!("opened {}", keep.len());
        }
        "env" => {
            for (k, v) in std::env::vars() {
                println!("{k}={v}");
            }
            for a in std::env::args() {
                println!("arg {a}");
            }
        }
        "read" => {
            // Try to read each path; print what came back.
            for p in &args[2..] {
                match fs::read(p) {
                    Ok(b) => println!("{p}: read {} bytes", b.len()),
                    Err(e) => println!("{p}: error {:?}", e.kind()),
                }
            }
        }
        "readdir" => {
            for p in &args[2..] {
                match fs::read_dir(p) {
                    Ok(rd) => {
                        let mut names: Vec<String> = rd
                            .filter_map(|e| e.ok())
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .collect();
                        names.sort();
                        println!("{p}: {}", names.join(","));
                    }
                    Err(e) => println!("{p}: error {:?}", e.kind()),
                }
            }
        }
        "write" => {
            for p in &args[2..] {
                match fs::write(p, b"pwned") {
                    Ok(()) => println!("{p}: wrote"),
                    Err(e) => println!("{p}: error {:?}", e.kind()),
                }
            }
        }
        "symlink" => {
            // symlink TARGET NAME inside /workspace
            let ws = preopen("/workspace");
            let (t, n) = (arg(2), arg(3));
            let e = unsafe { path_symlink(t.as_ptr(), t.len(), ws, n.as_ptr(), n.len()) };
            report("symlink", e);
        }
        "ro-attacks" => {
            // ARG: path of a read-only file relative to the /data preopen.
            let ro = preopen("/data");
            let ws = preopen("/workspace");
            let p = arg(2);
            let mut fd = 0u32;
            // O_TRUNC (oflags bit 3) with write rights.
            let e = unsafe {
                path_open(
                    ro,
                    0,
                    p.as_ptr(),
                    p.len(),
                    8,
                    ALL_RIGHTS,
                    ALL_RIGHTS,
                    0,
                    &mut fd,
                )
            };
            report("open_trunc", e);
            let e = unsafe {
                path_open(
                    ro,
                    0,
                    p.as_ptr(),
                    p.len(),
                    0,
                    ALL_RIGHTS,
                    ALL_RIGHTS,
                    0,
                    &mut fd,
                )
            };
            report("open_rw", e);
            let e = unsafe { path_filestat_set_times(ro, 0, p.as_ptr(), p.len(), 0, 0, 0b1010) };
            report("set_times", e);
            let dst = "stolen-link";
            let e = unsafe { path_link(ro, 0, p.as_ptr(), p.len(), ws, dst.as_ptr(), dst.len()) };
            report("link_ro_to_rw", e);
            let dst2 = "stolen-rename";
            let e = unsafe { path_rename(ro, p.as_ptr(), p.len(), ws, dst2.as_ptr(), dst2.len()) };
            report("rename_ro_to_rw", e);
            let e = unsafe { path_rename(ro, p.as_ptr(), p.len(), ro, dst2.as_ptr(), dst2.len()) };
            report("rename_within_ro", e);
            match fs::remove_file(format!("/data/{p}")) {
                Ok(()) => println!("unlink: ok"),
                Err(e) => println!("unlink: error {:?}", e.kind()),
            }
            match fs::write(format!("/data/{p}"), b"pwned") {
                Ok(()) => println!("write: ok"),
                Err(e) => println!("write: error {:?}", e.kind()),
            }
            match fs::write("/data/new-file", b"pwned") {
                Ok(()) => println!("create: ok"),
                Err(e) => println!("create: error {:?}", e.kind()),
            }
        }
        "times" => {
            let ws = preopen("/workspace");
            let p = arg(2);
            for (a, m) in [
                (u64::MAX, u64::MAX),
                (i64::MAX as u64, 0),
                (1u64 << 63, 1u64 << 63),
            ] {
                let e =
                    unsafe { path_filestat_set_times(ws, 0, p.as_ptr(), p.len(), a, m, 0b0101) };
                report("set_times", e);
            }
            match fs::metadata(format!("/workspace/{p}")).and_then(|m| m.modified()) {
                Ok(t) => println!(
                    "stat ok: {}",
                    t.duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0)
                ),
                Err(e) => println!("stat error {:?}", e.kind()),
            }
        }
        "secret-write" => {
            // Leave a secret in linear memory and in a static, then exit.
            let mut v = vec![0u8; 1 << 20];
            for (i, b) in b"SECRET-EPISODE-A".iter().cycle().take(v.len()).enumerate() {
                v[i] = *b;
            }
            std::hint::black_box(&v);
            std::mem::forget(v);
            println!("planted");
        }
        "secret-scan" => {
            // Read every byte of memory the instance can see, looking for the secret.
            let pages = core::arch::wasm32::memory_size(0);
            let len = pages * 65536;
            let mut found = false;
            let needle = b"SECRET-EPISODE-A";
            for addr in (0..len - needle.len()).step_by(4096) {
                let s =
                    unsafe { std::slice::from_raw_parts(addr as *const u8, 4096.min(len - addr)) };
                if s.windows(needle.len()).any(|w| w == needle)
                    && !std::ptr::eq(s.as_ptr(), needle.as_ptr())
                {
                    // The needle literal itself lives in the data segment; skip that page.
                    let lit = needle.as_ptr() as usize;
                    if !(addr..addr + 4096).contains(&lit) {
                        found = true;
                    }
                }
            }
            // Fresh allocation must be zeroed as well.
            let v = vec![0u8; 1 << 20];
            let dirty = v.iter().any(|b| *b != 0);
            println!("found={found} dirty={dirty}");
        }
        "exit" => {
            let code: i32 = arg(2).parse().unwrap_or(0);
            std::process::exit(code);
        }
        "panic" => {
            let v: Vec<u8> = Vec::new();
            let i = args.len() + 100;
            println!("{}", v[i]);
        }
        "stdin" => {
            let mut s = String::new();
            let _ = std::io::stdin().read_to_string(&mut s);
            print!("{}", s.to_uppercase());
        }
        "sock" => {
            let mut fd = 0u32;
            for f in 0..8u32 {
                let e = unsafe { sock_accept(f, 0, &mut fd) };
                report(&format!("sock_accept fd {f}"), e);
            }
        }
        "ansi" => {
            print!("\x1b[2J\x1b]0;title\x07red\x1b[31m text\x1b[0m");
        }
        _ => {
            eprintln!("unknown case");
            std::process::exit(2);
        }
    }
}
