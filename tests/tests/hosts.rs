//! The test network itself: an impaired link loses and delays packets as asked, in the
//! way it was impaired on this kernel (`tc netem` or the user-space wire), while a clean
//! link beside it does neither, and a removed impaired host answers no more. The fleet's
//! lossy-link scenario leans on this.
//!
//! Making namespaces needs root; without it the test says so and passes without running.

use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use corvid_e2e::hosts::{Impaired, Network};

/// Datagrams sent over each link.
const DATAGRAMS: u32 = 1000;

/// One TCP round trip from `host` to `to`: how long a connection takes to open.
fn round_trip(net: &Network, host: &str, to: SocketAddr) -> Duration {
    net.run_in(host, move || {
        // The first connection also resolves the address (ARP); the second is one round trip.
        TcpStream::connect_timeout(&to, Duration::from_secs(10)).expect("connect");
        let t = Instant::now();
        TcpStream::connect_timeout(&to, Duration::from_secs(10)).expect("connect");
        t.elapsed()
    })
    .expect("a thread in the host")
}

/// How many of [`DATAGRAMS`] datagrams sent from `host`, one a millisecond, arrive at
/// `rx` (bound in the receiving host), read as they come.
fn delivered(net: &Network, host: &str, rx: &UdpSocket) -> u32 {
    let to = rx.local_addr().expect("bound");
    let rx = rx.try_clone().expect("a second handle");
    rx.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let reader = std::thread::spawn(move || {
        let mut seen = std::collections::HashSet::new();
        let mut buf = [0u8; 16];
        while let Ok(n) = rx.recv(&mut buf) {
            assert_eq!(n, 4, "a datagram as sent");
            seen.insert(u32::from_le_bytes(buf[..4].try_into().expect("4 bytes")));
        }
        seen.len() as u32
    });
    net.run_in(host, move || {
        let tx = UdpSocket::bind("0.0.0.0:0").expect("bind");
        for i in 0..DATAGRAMS {
            tx.send_to(&i.to_le_bytes(), to).expect("send");
            std::thread::sleep(Duration::from_millis(1));
        }
    })
    .expect("a thread in the host");
    reader.join().expect("the reader")
}

#[test]
fn an_impaired_link_loses_and_delays_packets_and_a_clean_one_beside_it_does_not() {
    let mut net = match Network::new(&["server", "clean", "lossy"]) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("skipping the network test: {e} (run the tests as root)");
            return;
        }
    };
    let how = match net.impair("lossy", 5.0, 50) {
        Ok(how) => how,
        Err(e) => {
            eprintln!("skipping the network test: a link cannot be impaired here ({e})");
            return;
        }
    };
    eprintln!("impaired with {how:?}");

    let (tcp, udp_clean, udp_lossy) = net
        .run_in("server", || {
            (
                TcpListener::bind("10.0.0.1:7000").expect("bind tcp"),
                UdpSocket::bind("10.0.0.1:7001").expect("bind udp"),
                UdpSocket::bind("10.0.0.1:7002").expect("bind udp"),
            )
        })
        .expect("a thread in the server");
    let to = "10.0.0.1:7000".parse().expect("an address");

    // 50 ms each way on the lossy link; a SYN lost on the way costs a retransmission.
    let clean_rtt = round_trip(&net, "clean", to);
    let lossy_rtt = round_trip(&net, "lossy", to);
    eprintln!("connect: clean {clean_rtt:?}, lossy {lossy_rtt:?}");
    assert!(
        clean_rtt < Duration::from_millis(50),
        "a clean link adds no delay: {clean_rtt:?}"
    );
    assert!(
        lossy_rtt >= Duration::from_millis(100),
        "the lossy link delays each packet 50 ms each way: {lossy_rtt:?}"
    );

    let clean = delivered(&net, "clean", &udp_clean);
    let lossy = delivered(&net, "lossy", &udp_lossy);
    eprintln!("datagrams delivered of {DATAGRAMS}: clean {clean}, lossy {lossy}");
    assert_eq!(clean, DATAGRAMS, "a clean link loses nothing");
    // Binomial(1000, 0.05) loses 50 ± 6.9: these bounds are seven deviations wide.
    assert!(
        (900..=997).contains(&lossy),
        "the lossy link loses about 5% of datagrams: {lossy} of {DATAGRAMS} arrived"
    );
    if let Impaired::Wire(_) = how {
        let c = net.wire("lossy").expect("the wire").counts();
        eprintln!("wire: {c}");
        assert!(
            c.frames >= u64::from(lossy),
            "every datagram crossed the wire"
        );
    }
    // A removed host is gone, cable and all: nothing answers at its address (a host still
    // up would refuse the connection at once).
    net.remove_host("lossy");
    let gone = net
        .run_in("server", || {
            let to = "10.0.0.3:7000".parse().expect("an address");
            TcpStream::connect_timeout(&to, Duration::from_secs(2)).map(drop)
        })
        .expect("a thread in the server");
    match gone {
        Err(e) if e.kind() != std::io::ErrorKind::ConnectionRefused => {}
        other => panic!("the removed host still answers: {other:?}"),
    }
    // The listener's backlog answered the connections; it lives until here.
    drop(tcp);
}
