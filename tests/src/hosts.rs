//! Network hosts on one machine: Linux network namespaces joined by veth pairs to a bridge.
//!
//! A [`Network`] is a switch (a namespace holding a bridge) and hosts (a namespace each,
//! with `eth0` at `10.0.0.<n>/24` cabled to a bridge port). Processes start inside a host
//! with [`Network::command`] and see only that host's interfaces; files are shared as usual.
//! What a test does to the network is what an operator's network does to it:
//! - [`Network::link`] takes a host's cable out (its bridge port down) and puts it back;
//! - [`Network::remove_host`] kills every process in a host and deletes its namespace;
//! - [`Network::impair`] makes a host's link lossy and slow: with `tc netem` where the
//!   kernel has it, else by recabling the host through a user-space [`Wire`] that does the
//!   same to every frame.
//!
//! Everything made is removed when the `Network` drops, also when a test panics; names
//! carry the test process's id, and a `Network` made later removes what a killed test
//! process left behind. Making namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN):
//! [`Network::new`] says why it cannot instead of failing half-way.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::wire::{Impairment, Wire};

/// A host of a [`Network`].
#[derive(Debug, Clone)]
pub struct Host {
    /// The name the test gave it.
    pub name: String,
    /// Its namespace.
    pub netns: String,
    /// Its address on the network.
    pub addr: Ipv4Addr,
    /// Its cable's bridge port, in the switch namespace.
    port: String,
}

/// Hosts on a bridge; see the module docs.
#[derive(Debug)]
pub struct Network {
    switch: String,
    hosts: Vec<Host>,
    removed: Vec<String>,
    /// The user-space cables of impaired hosts, by host name.
    wires: Vec<(String, Wire)>,
}

/// How [`Network::impair`] impaired a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Impaired {
    /// `tc netem` on both ends of the host's cable.
    Netem,
    /// A user-space [`Wire`] in place of the cable, because netem could not be used (why).
    Wire(String),
}

/// Why a network cannot be made on this machine.
#[derive(Debug)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "network namespaces cannot be made here: {}", self.0)
    }
}

impl std::error::Error for Unavailable {}

/// The prefix of every namespace a test process makes.
const PREFIX: &str = "cvh";

/// Runs `ip`/`tc` with `args`; `Err` carries the command and what it printed.
fn sh(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `ip -n <ns> <args>`: a command inside namespace `ns`.
fn ip(ns: &str, args: &[&str]) -> Result<(), String> {
    sh("ip", &[&["-n", ns], args].concat())
}

/// Deletes namespace `ns` after SIGKILLing every process in it.
fn delete_netns(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
    }
    let _ = sh("ip", &["netns", "del", ns]);
}

/// Namespaces left by test processes that are gone (a SIGKILLed `cargo test`).
fn remove_orphans() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(ns) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = ns
            .strip_prefix(PREFIX)
            .and_then(|r| r.split('n').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            delete_netns(ns);
        }
    }
}

impl Network {
    /// A switch and one host per name, `names[i]` at `10.0.0.{i+1}`.
    pub fn new(names: &[&str]) -> Result<Self, Unavailable> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        remove_orphans();
        let id = format!(
            "{PREFIX}{}n{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let switch = format!("{id}sw");
        sh("ip", &["netns", "add", &switch]).map_err(Unavailable)?;
        let mut net = Network {
            switch,
            hosts: Vec::new(),
            removed: Vec::new(),
            wires: Vec::new(),
        };
        let sw = net.switch.clone();
        let setup = || -> Result<Vec<Host>, String> {
            ip(&sw, &["link", "set", "lo", "up"])?;
            ip(&sw, &["link", "add", "br0", "type", "bridge"])?;
            ip(&sw, &["link", "set", "br0", "up"])?;
            let mut hosts = Vec::new();
            for (i, name) in names.iter().enumerate() {
                let netns = format!("{id}h{i}");
                let addr = Ipv4Addr::new(10, 0, 0, i as u8 + 1);
                // Made in the host's namespace, so the names never meet another test's.
                sh("ip", &["netns", "add", &netns])?;
                let port = format!("p{i}");
                ip(
                    &netns,
                    &[
                        "link", "add", "eth0", "type", "veth", "peer", "name", &port, "netns", &sw,
                    ],
                )?;
                ip(&sw, &["link", "set", &port, "master", "br0"])?;
                ip(&sw, &["link", "set", &port, "up"])?;
                ip(&netns, &["link", "set", "lo", "up"])?;
                let cidr = format!("{addr}/24");
                ip(&netns, &["addr", "add", &cidr, "dev", "eth0"])?;
                ip(&netns, &["link", "set", "eth0", "up"])?;
                hosts.push(Host {
                    name: (*name).to_owned(),
                    netns,
                    addr,
                    port,
                });
            }
            Ok(hosts)
        };
        match setup() {
            Ok(hosts) => {
                net.hosts = hosts;
                Ok(net)
            }
            Err(e) => {
                // The host namespaces made so far; dropping `net` removes the switch.
                for i in 0..names.len() {
                    delete_netns(&format!("{id}h{i}"));
                }
                Err(Unavailable(e))
            }
        }
    }

    /// The host named `name`.
    ///
    /// # Panics
    /// If there is none: a mistake in the test.
    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name:?} in this network"))
    }

    /// A command that runs `program` inside `host` (add its arguments and spawn it).
    pub fn command(&self, host: &str, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.host(host).netns])
            .arg(program)
            .stdin(Stdio::null());
        c
    }

    /// Runs `f` inside `host` on a thread of this process and returns what it returns:
    /// sockets it makes belong to that host. `Err` if the host's namespace is gone.
    pub fn run_in<T: Send + 'static>(
        &self,
        host: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<T> {
        crate::netns::in_netns(&self.host(host).netns, f)
    }

    /// Puts `host`'s cable in (`up`) or takes it out: its bridge port goes down, so its
    /// packets go nowhere, as when a link drops (the host sees no carrier, except through
    /// a [`Wire`], which keeps carrier as a cable to a dead switch port does).
    pub fn link(&self, host: &str, up: bool) -> Result<(), String> {
        let port = &self.host(host).port;
        ip(
            &self.switch,
            &["link", "set", port, if up { "up" } else { "down" }],
        )
    }

    /// Kills every process of `host` and deletes its namespace: the machine is gone.
    pub fn remove_host(&mut self, host: &str) {
        let ns = self.host(host).netns.clone();
        // A TAP device's open file holds its namespace: the cable goes first, or the
        // host's `eth0` would outlive the deletion and go on answering.
        self.wires.retain(|(h, _)| h != host);
        delete_netns(&ns);
        self.removed.push(ns);
    }

    /// Makes `host`'s link lose `loss_pct` percent of packets and delay each by
    /// `delay_ms`, in both directions: `tc netem` on both ends of its cable where the
    /// kernel has netem (`CONFIG_NET_SCH_NETEM`), else a user-space [`Wire`] in place of
    /// the cable (the host keeps its address; its `eth0` becomes a TAP device). Call it
    /// before starting the host's processes: recabling drops its connections.
    pub fn impair(&mut self, host: &str, loss_pct: f64, delay_ms: u32) -> Result<Impaired, String> {
        let h = self.host(host).clone();
        let (loss, delay) = (format!("{loss_pct}%"), format!("{delay_ms}ms"));
        let netem = |ns: &str, dev: &str| {
            sh(
                "tc",
                &[
                    "-n", ns, "qdisc", "add", "dev", dev, "root", "netem", "loss", &loss, "delay",
                    &delay,
                ],
            )
        };
        let why_not = match netem(&h.netns, "eth0") {
            Ok(()) => match netem(&self.switch, &h.port) {
                Ok(()) => return Ok(Impaired::Netem),
                Err(e) => {
                    // Half a netem cable is no use: the wire replaces the cable instead.
                    sh(
                        "tc",
                        &["-n", &h.netns, "qdisc", "del", "dev", "eth0", "root"],
                    )?;
                    e
                }
            },
            Err(e) => e,
        };
        let imp = Impairment {
            loss: loss_pct / 100.0,
            delay: Duration::from_millis(u64::from(delay_ms)),
        };
        // The TAP devices are made under other names first, so a machine without TAP
        // support leaves the host's cable as it was.
        let (host_tap, port_tap) = ("wire0", format!("w{}", h.port));
        let seed = u64::from(u32::from(h.addr));
        let wire = Wire::connect((&h.netns, host_tap), (&self.switch, &port_tap), imp, seed)
            .map_err(|e| format!("a user-space cable for {host}: {e}"))?;
        // Deleting one end of a veth pair deletes both: the bridge port goes with it.
        ip(&h.netns, &["link", "del", "eth0"])?;
        self.wires.push((host.to_owned(), wire));
        let cidr = format!("{}/24", h.addr);
        ip(&h.netns, &["link", "set", host_tap, "name", "eth0"])?;
        ip(&self.switch, &["link", "set", &port_tap, "name", &h.port])?;
        ip(&self.switch, &["link", "set", &h.port, "master", "br0"])?;
        ip(&self.switch, &["link", "set", &h.port, "up"])?;
        ip(&h.netns, &["addr", "add", &cidr, "dev", "eth0"])?;
        ip(&h.netns, &["link", "set", "eth0", "up"])?;
        Ok(Impaired::Wire(why_not))
    }

    /// The user-space cable of `host`, if [`Network::impair`] put one in.
    pub fn wire(&self, host: &str) -> Option<&Wire> {
        self.wires.iter().find(|(h, _)| h == host).map(|(_, w)| w)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // The cables first: their devices go with them, before their namespaces do.
        self.wires.clear();
        for h in &self.hosts {
            if !self.removed.contains(&h.netns) {
                delete_netns(&h.netns);
            }
        }
        delete_netns(&self.switch);
    }
}
