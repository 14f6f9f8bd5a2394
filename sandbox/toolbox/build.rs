//! Link-time layout of the `toolbox` module.
//!
//! A Rust wasm command starts with 1 MiB of stack and its data, and leaves
//! ~64 KiB for the heap in its initial memory; the first allocation of any
//! size (the 64 KiB stdout buffer, a file read) then calls `memory.grow`.
//! For the host, every grow of a pooled memory slot is an `mprotect`, and the
//! grown tail is shrunk again (another `mprotect`, plus an `madvise`) when the
//! slot is reset for the next call. Declaring 2 MiB of initial memory lets
//! ordinary commands run without growing at all, so a reused slot needs no
//! page-table changes (measured: docs/bench/log.md, 2026-11-30 "Sandbox").
fn main() {
    println!(
        "cargo:rustc-link-arg-bin=toolbox=--initial-memory={}",
        2 << 20
    );
    println!("cargo:rerun-if-changed=build.rs");
}
