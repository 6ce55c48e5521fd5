//! A peer that opens handshake connections to a reliable-datagram listener
//! and sends nothing holds at most 256 of them (a socket each):
//! each one past that ends the oldest at once, instead of all of them being
//! held until their 5 s request timeout. A legitimate connection made during
//! such a flood still connects.

mod common;

use std::io::{ErrorKind, Read};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

use common::{connect_via, one_device, qp};
use daplrs_backend::Device;

/// Whether the other side ended `s`: EOF or a reset, not "nothing yet".
fn ended(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

/// An idle connection, when it was opened and when we saw it ended.
struct Idle {
    s: TcpStream,
    opened: Instant,
    ended: Option<Instant>,
}

impl Idle {
    fn look(&mut self) {
        if self.ended.is_none() && ended(&mut self.s) {
            self.ended = Some(Instant::now());
        }
    }
}

#[test]
fn idle_connections_past_the_bound_end_the_oldest() {
    const KEPT: usize = 256;
    const PAST: usize = 20;
    let (dev, rx) = one_device("tcp;ofi_rxm");
    let listener = dev.listen(0).unwrap();
    let at = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.port());
    let mut idle: Vec<Idle> = Vec::new();
    for _ in 0..KEPT + PAST {
        let s = TcpStream::connect(at).unwrap();
        s.set_nonblocking(true).unwrap();
        idle.push(Idle {
            s,
            opened: Instant::now(),
            ended: None,
        });
        let early = idle.len().min(PAST);
        idle[..early].iter_mut().for_each(Idle::look);
    }

    // A legitimate connection behind them: accepted after all of them.
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let (a, b) = (qp(&dev, &pd, &cq), qp(&dev, &pd, &cq));
    connect_via(&dev, &rx, at, &a, &b);

    // The oldest PAST were ended as newer ones came (the listener accepts in
    // order and ends the oldest before it reads the next), each well before
    // the 5 s a connection that sends nothing is otherwise given.
    let guard = Instant::now() + Duration::from_secs(20);
    while idle[..PAST].iter().any(|i| i.ended.is_none()) {
        assert!(Instant::now() < guard, "the oldest connections stay open");
        idle[..PAST].iter_mut().for_each(Idle::look);
        std::thread::sleep(Duration::from_millis(2));
    }
    for (n, i) in idle[..PAST].iter().enumerate() {
        let age = i.ended.unwrap() - i.opened;
        assert!(
            age < Duration::from_millis(4500),
            "connection {n} ended after {age:?}"
        );
    }
    drop(idle);
    a.destroy();
    b.destroy();
    listener.close();
    dev.close();
}
