//! A peer killed holding one of shm's region locks (its own, or ours in its
//! post to us) must not stop this process: the device releases the lock
//! (`left_locks`), the connection reads broken, what was posted is flushed,
//! and the device goes on and closes. The peer is this binary run again as a
//! child (`LEFT_LOCKS_ROLE`), which takes the lock and is then killed.

mod common;

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::AtomicI32;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use daplrs_backend::shared_map::SharedMap;
use daplrs_backend::{
    access, CmEvent, CompletionQueue, Device, MemoryRegion, ProtectionDomain, QueuePair, RecvWr,
    SendOp, WcStatus,
};
use daplrs_libfabric::OfiDevice;

use common::{one_device, qp, send_wr, sge};

const ROLE: &str = "LEFT_LOCKS_ROLE";
/// How long the parent waits for each step once the child is dead.
const DEADLINE: Duration = Duration::from_secs(20);
/// The lock in a region of libfabric 1.17's layout (`left_locks::LOCK_AT`).
const LOCK_AT: usize = 24;

/// The child: listens, accepts one connection (posting a receive), says so,
/// and then takes the locks `LEFT_LOCKS_ROLE` names ("own": its endpoints';
/// "parent": its parent's) and waits to be killed; "serve" takes none and
/// says when its receive completed.
#[test]
fn child_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let Side {
        dev,
        rx,
        cq,
        qp: b,
        mut buf,
        mr,
        ..
    } = side(16);
    b.post_recv(RecvWr {
        wr_id: 7,
        ctx: daplrs_backend::WrContext::NONE,
        sgl: vec![sge(&mut buf, 0, 64, mr.lkey())].into(),
    })
    .unwrap();
    let listener = dev.listen(0).unwrap();
    println!("@port {}", listener.port());
    let req = match common::event(&rx) {
        CmEvent::ConnectRequest { req, .. } => req,
        e => panic!("{e:?}"),
    };
    dev.accept(req, &b, b"").unwrap();
    assert!(matches!(common::event(&rx), CmEvent::Established { .. }));
    let owner = match role.as_str() {
        "own" => std::process::id(),
        "parent" => std::os::unix::process::parent_id(),
        _ => {
            let wc = common::completion(&cq);
            println!("@received {:?}", wc.status);
            // Alive until the parent is done: our receipt of its send may still be on its
            // way (it waits for the parent's lock to be released), and our end would flush it.
            let _ = std::io::stdin().read_line(&mut String::new());
            return;
        }
    };
    let regions = regions_of(owner);
    assert!(!regions.is_empty(), "no region of {owner}");
    for word in &regions {
        // SAFETY: the lock word of a region in its mapping (never unmapped).
        assert_eq!(unsafe { libc::pthread_spin_lock(word.as_ptr().cast()) }, 0);
    }
    println!("@locked {}", regions.len());
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// An shm device with a QP and a 64-byte buffer registered: what each side posts from.
struct Side {
    dev: Arc<OfiDevice>,
    rx: Receiver<CmEvent>,
    pd: Arc<dyn ProtectionDomain>,
    cq: Arc<dyn CompletionQueue>,
    qp: Arc<dyn QueuePair>,
    buf: Vec<u8>,
    mr: Arc<dyn MemoryRegion>,
}

fn side(cq_depth: u32) -> Side {
    let (dev, rx) = one_device("shm");
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(cq_depth).unwrap();
    let qp = qp(&dev, &pd, &cq);
    let buf = vec![0u8; 64];
    let mr = pd
        .reg_mr(buf.as_ptr() as u64, 64, access::LOCAL_WRITE)
        .unwrap();
    Side {
        dev,
        rx,
        pd,
        cq,
        qp,
        buf,
        mr,
    }
}

/// The lock words of the regions of process `pid` (files "<pid>:<uid>:<n>"), mapped.
fn regions_of(pid: u32) -> Vec<&'static AtomicI32> {
    let prefix = format!("{pid}:");
    let mut words = Vec::new();
    for entry in std::fs::read_dir("/dev/shm").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(&prefix) {
            continue;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(entry.path())
            .unwrap();
        // Kept mapped for the process's life.
        let map: &'static SharedMap = Box::leak(Box::new(
            SharedMap::map(std::os::fd::AsRawFd::as_raw_fd(&file), 4096).unwrap(),
        ));
        let version = map.read_u8(0);
        assert_eq!(version, 4, "{name}: a layout this test does not know");
        words.push(map.atomic_i32(LOCK_AT));
    }
    words
}

struct Peer {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Peer {
    fn spawn(role: &str) -> Peer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Peer { child, out }
    }

    /// What follows `word` in the child's next line holding it (the others are the harness's).
    fn said(&mut self, word: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert_ne!(self.out.read_line(&mut line).unwrap(), 0, "the child ended");
            // The harness prints "test child_role ... " before the test's first line.
            if let Some(at) = line.find(word) {
                return line[at + word.len()..].trim().to_string();
            }
        }
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects a new QP of `dev` to a new child of `role`.
fn connect(
    dev: &Arc<OfiDevice>,
    rx: &Receiver<CmEvent>,
    a: &Arc<dyn QueuePair>,
    role: &str,
) -> Peer {
    let mut peer = Peer::spawn(role);
    let port: u16 = peer.said("@port").parse().unwrap();
    dev.connect(a, SocketAddrV4::new(Ipv4Addr::LOCALHOST, port), b"", None)
        .unwrap();
    assert!(matches!(common::event(rx), CmEvent::Established { .. }));
    peer
}

fn wait_event(rx: &Receiver<CmEvent>) -> CmEvent {
    rx.recv_timeout(DEADLINE).expect("a connection event")
}

/// Runs `f` on a thread and fails if it takes longer than `DEADLINE`.
fn within_deadline<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(DEADLINE)
        .unwrap_or_else(|_| panic!("{what}: still inside the provider after {DEADLINE:?}"))
}

/// After the child took `role`'s locks and was killed: the connection reads
/// broken, a send posted on it completes flushed, a new connection to a live
/// child carries a message, and the device closes.
fn survives_a_peer_killed_holding(role: &str) {
    let Side {
        dev,
        rx,
        pd,
        cq,
        qp: a,
        mut buf,
        mr,
    } = side(64);
    let msg = sge(&mut buf, 0, 8, mr.lkey());

    let mut peer = connect(&dev, &rx, &a, role);
    eprintln!("{role}: {} locked", peer.said("@locked"));
    // A send now spins on the child's lock ("own") or queues behind ours
    // ("parent"); either way it is inside, or waiting, when the child dies.
    let posting = {
        let a = a.clone();
        std::thread::spawn(move || a.post_send(&send_wr(1, SendOp::Send, vec![msg])))
    };
    std::thread::sleep(Duration::from_millis(100));
    let killed = Instant::now();
    peer.kill();
    match wait_event(&rx) {
        CmEvent::Broken { qp_num } | CmEvent::Disconnected { qp_num } => {
            assert_eq!(qp_num, a.qp_num())
        }
        e => panic!("{e:?}"),
    }
    let posted = within_deadline("the send", move || posting.join().unwrap());
    if posted.is_ok() {
        let cq = cq.clone();
        let wc = within_deadline("the send's completion", move || common::completion(&cq));
        assert_eq!(wc.wr_id, 1);
        assert_ne!(wc.status, WcStatus::Success, "a send to a dead peer");
    }
    eprintln!("{role}: recovered in {:?}", killed.elapsed());

    let b = qp(&dev, &pd, &cq);
    let mut live = connect(&dev, &rx, &b, "serve");
    b.post_send(&send_wr(2, SendOp::Send, vec![msg])).unwrap();
    let cq2 = cq.clone();
    let wc = within_deadline("a send to a live peer", move || common::completion(&cq2));
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    assert_eq!(live.said("@received"), "Success");
    drop(live);
    within_deadline("the close", move || {
        mr.deregister();
        dev.close();
    });
}

/// One test: the "parent" child takes every lock of this process.
#[test]
fn peers_killed_holding_shm_locks() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    survives_a_peer_killed_holding("own");
    survives_a_peer_killed_holding("parent");
}
