//! Helpers shared by the examples (a module, not an example: cargo only builds
//! `examples/*.rs` and `examples/*/main.rs`).
// Each example uses only some of these.
#![allow(dead_code)]

/// Positional argument `i` (1-based), or `default` when it is absent.
pub fn arg(i: usize, default: &str) -> String {
    std::env::args()
        .nth(i)
        .unwrap_or_else(|| default.to_string())
}

/// Process CPU seconds (utime + stime) from /proc/self/stat.
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, s)| s).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields after ')' start at index 0 = state (field 3); utime is field 14, stime 15.
    (tick(11) + tick(12)) / 100.0
}
