//! Builds the toolbox (`sandbox/toolbox`, a separate Cargo project) for
//! `wasm32-wasip1` from source, into `$OUT_DIR/toolbox-target`, and copies
//! the modules to `$OUT_DIR` where `src/engine.rs` embeds them.
//!
//! The nested cargo runs with a clean environment: the host build's
//! `CARGO_*`, `RUSTFLAGS` and `CARGO_ENCODED_RUSTFLAGS` would otherwise leak
//! host-only flags (linker args, rpaths) into a wasm build. Source paths are
//! remapped so no host path is baked into the guest binary.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip1";

fn main() {
    let manifest_dir =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let toolbox = manifest_dir.join("toolbox");
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_dir = out_dir.join("toolbox-target");
    for p in ["Cargo.toml", "Cargo.lock", "build.rs", "src", "syntax"] {
        println!("cargo:rerun-if-changed={}", toolbox.join(p).display());
    }
    println!("cargo:rerun-if-changed=build.rs");

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    check_target_installed(&rustc);

    let mut cmd = Command::new(&cargo);
    cmd.current_dir(&toolbox)
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            TARGET,
            "--target-dir",
        ])
        .arg(&target_dir)
        .arg("--manifest-path")
        .arg(toolbox.join("Cargo.toml"));
    for (k, _) in env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let inherited_build_var = (k.starts_with("CARGO_") && k != "CARGO_HOME")
            || matches!(
                k.as_str(),
                "RUSTFLAGS"
                    | "RUSTDOCFLAGS"
                    | "RUSTC_WRAPPER"
                    | "RUSTC_WORKSPACE_WRAPPER"
                    | "RUSTC"
                    | "RUSTC_LINKER"
                    | "TARGET"
                    | "HOST"
                    | "OUT_DIR"
                    | "OPT_LEVEL"
                    | "PROFILE"
                    | "DEBUG"
                    | "NUM_JOBS"
            );
        if inherited_build_var {
            cmd.env_remove(&k);
        }
    }
    let mut flags = vec![format!(
        "--remap-path-prefix={}=/toolbox",
        toolbox.display()
    )];
    if let Some(home) = cargo_home() {
        flags.push(format!("--remap-path-prefix={}=/cargo", home.display()));
    }
    cmd.env("CARGO_ENCODED_RUSTFLAGS", flags.join("\u{1f}"));

    let output = match cmd.output() {
        Ok(o) => o,
        Err(e) => panic!("corvid-sandbox: could not run `{cargo}` to build the toolbox: {e}"),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("may not be installed") || stderr.contains("can't find crate for `std`")
        {
            panic!(
                "corvid-sandbox: the {TARGET} standard library is missing; run `rustup target add {TARGET}`\n{stderr}"
            );
        }
        panic!("corvid-sandbox: building the toolbox for {TARGET} failed:\n{stderr}");
    }
    let built = target_dir.join(TARGET).join("release");
    for name in ["toolbox.wasm", "adversary.wasm"] {
        let (from, to) = (built.join(name), out_dir.join(name));
        if let Err(e) = std::fs::copy(&from, &to) {
            panic!(
                "corvid-sandbox: cannot copy {} to {}: {e}",
                from.display(),
                to.display()
            );
        }
    }
    // Tests load the adversarial module from here; the library never does.
    println!(
        "cargo:rustc-env=CORVID_ADVERSARY_WASM={}",
        out_dir.join("adversary.wasm").display()
    );
}

fn check_target_installed(rustc: &str) {
    let Ok(out) = Command::new(rustc).args(["--print", "sysroot"]).output() else {
        return;
    };
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let lib = Path::new(&sysroot).join("lib/rustlib").join(TARGET);
    if !sysroot.is_empty() && !lib.exists() {
        panic!(
            "corvid-sandbox: the {TARGET} target is not installed for {sysroot}; run `rustup target add {TARGET}` \
             (or ./scripts/bootstrap.sh)"
        );
    }
}

fn cargo_home() -> Option<PathBuf> {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
}
