//! Corvid's toolbox: one WASI preview-1 program that is both a small shell
//! (`toolbox sh -c 'LINE'`) and every command the shell knows
//! (`toolbox grep -n x file`). The host runs it inside wasmtime with the
//! episode workspace preopened at `/workspace`.
//!
//! Exit statuses are conventional (127 for an unknown command). Stock
//! wasmtime-wasi refuses `proc_exit` codes ≥ 126; the Corvid host shadows
//! `proc_exit` and records any code, so the program simply exits with it.

mod cmds;
mod dir;
mod glob;
mod shell;

use std::io::{Read, Write};

/// Most stdin bytes read (the host caps what it hands in anyway).
const MAX_STDIN_BYTES: u64 = 1 << 20;

fn main() {
    // No file/line locations or payload debug text ever reach the model.
    std::panic::set_hook(Box::new(|_| {
        let _ = writeln!(std::io::stderr(), "toolbox: internal error");
    }));
    let _ = std::env::set_current_dir("/workspace");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut stdin = Vec::new();
    let _ = std::io::stdin()
        .take(MAX_STDIN_BYTES)
        .read_to_end(&mut stdin);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(64 << 10, stdout.lock());
    let mut err = std::io::stderr();
    let status = match args.first().map(String::as_str) {
        Some("sh") => match (args.get(1).map(String::as_str), args.get(2)) {
            (Some("-c"), Some(line)) if args.len() == 3 => {
                shell::run_line(line, &stdin, &mut out, &mut err)
            }
            _ => {
                let _ = writeln!(err, "usage: sh -c 'COMMAND LINE'");
                2
            }
        },
        Some(_) => cmds::dispatch(&args, &stdin, &mut out, Some(&mut err)),
        None => {
            let _ = writeln!(
                err,
                "usage: toolbox COMMAND [ARG...] | toolbox sh -c 'LINE'"
            );
            2
        }
    };
    let _ = out.flush();
    drop(out);
    std::process::exit(status);
}
