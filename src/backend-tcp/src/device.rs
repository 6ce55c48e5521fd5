//! The TCP device (`TcpDevice`, the `Device` of the backend contract): opens the IA's
//! shared state and its progress thread, makes its objects, and starts connections.

use std::net::Ipv4Addr;
use std::net::{SocketAddrV4, TcpListener, UdpSocket};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use daplrs_backend::netif::resolve_address;
use daplrs_backend::{
    CmHandler, CompletionQueue, ConnRequestId, Device, DeviceAttr, Listener, ProtectionDomain,
    QpInit, QueuePair, SharedReceiveQueue, UdPeer,
};
use daplrs_backend::{Error, Resource, Result};

use crate::cm::TcpListenerHandle;
use crate::completions::Completions;
use crate::cq::TcpCq;
use crate::mem::TcpPd;
use crate::qp::TcpQp;
use crate::receives::SharedReceives;
use crate::shared::Shared;
use crate::srq::TcpSrq;
use crate::{engine, guarded, samehost, sigio, sys, wire, MAX_MESSAGE};

/// A TCP "device": one local IPv4 address and its progress thread.
pub struct TcpDevice {
    /// Also for this crate's tests (src/tests.rs, src/tests/), which reach the engine here.
    pub(crate) shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl TcpDevice {
    /// Opens the device for `target` ("lo", "eth0", "127.0.0.1", ...).
    pub fn open(target: &str) -> Result<Arc<TcpDevice>> {
        // Before the application's own handlers, if it installs any later (guarded.rs).
        guarded::install();
        let addr = resolve_address(target).map_err(|why| {
            log::warn!("tcp device {target}: {why}");
            Error::NoResource(Resource::Device)
        })?;
        let (wake_tx, wake_rx) =
            UnixStream::pair().map_err(|_| Error::NoResource(Resource::Memory))?;
        wake_tx.set_nonblocking(true).map_err(|_| Error::Internal)?;
        wake_rx.set_nonblocking(true).map_err(|_| Error::Internal)?;
        let attr = DeviceAttr {
            max_qp: 4096,
            // Queues are grown as work is posted, never allocated to their maximum: what a
            // program may ask for is bounded by its memory, not a device's (published uDAPL
            // benchmarks post 20,000 receives per EP).
            max_qp_wr: 1 << 18,
            max_sge: 32,
            max_cq: 16384,
            max_cqe: 1 << 20,
            max_mr: 1 << 20,
            max_mr_size: 1 << 40,
            max_pd: 4096,
            max_mw: 1 << 20,
            max_srq: 4096,
            max_srq_wr: 1 << 18,
            max_msg_size: MAX_MESSAGE,
            max_rdma_size: MAX_MESSAGE,
            max_rd_atomic: 128,
            max_private_data: wire::MAX_PRIVATE_DATA,
            // What one datagram carries unfragmented on the interface holding the address
            // (its MTU less the IPv4, UDP and datagram headers; loopback's 65536 is capped at
            // what a UDP datagram holds; 1500 if the MTU cannot be read): the bound of a
            // datagram's message, as an InfiniBand port's MTU bounds a UD message.
            mtu: wire::ud_max_message(sys::interface_mtu(addr).unwrap_or(1500)),
            // Datagram QPs are UDP sockets (engine/datagram.rs).
            ud: true,
            max_rdma_read_sge: 32,
            atomics: true,
            pins_for_write: false,
            pin_limit: None,
            write_imm: true,
            transport: "TCP",
        };
        let max_keys = (attr.max_mr + attr.max_mw) as usize;
        let samehost = samehost::Local::new(samehost::Mode::for_new_device(), max_keys, target);
        let shared = Shared::new(target, addr, attr, (wake_tx, wake_rx), samehost);
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("daplrs-tcp-{target}"))
            .spawn(move || {
                sigio::block_here();
                engine::progress_loop(s2)
            })
            .map_err(|_| Error::NoResource(Resource::Device))?;
        let slot = sigio::register(&shared);
        shared.engine.lock().signal_slot = slot;
        Ok(Arc::new(TcpDevice {
            shared,
            thread: Mutex::new(Some(thread)),
        }))
    }

    fn qp_num_of(&self, qp: &Arc<dyn QueuePair>) -> u32 {
        qp.qp_num()
    }
}

impl Drop for TcpDevice {
    fn drop(&mut self) {
        self.close();
    }
}

impl Device for TcpDevice {
    fn name(&self) -> String {
        self.shared.name.clone()
    }
    fn address(&self) -> Ipv4Addr {
        self.shared.addr
    }
    fn attr(&self) -> DeviceAttr {
        self.shared.attr.clone()
    }

    fn alloc_pd(&self) -> Result<Arc<dyn ProtectionDomain>> {
        let id = self.shared.next_id() as u32;
        Ok(Arc::new(TcpPd::new(id, self.shared.clone())))
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CompletionQueue>> {
        let completions = Arc::new(Completions::new(self.shared.next_id()));
        let weak = Arc::downgrade(&completions);
        self.shared.cqs.lock().insert(completions.id, weak);
        let shared = Arc::downgrade(&self.shared);
        Ok(Arc::new(TcpCq::new(completions, depth, shared)))
    }

    fn create_qp(&self, init: QpInit) -> Result<Arc<dyn QueuePair>> {
        let send_cq = self.shared.cq(&init.send_cq)?;
        let recv_cq = self.shared.cq(&init.recv_cq)?;
        let srq = match &init.srq {
            Some(s) => Some(
                self.shared
                    .srqs
                    .lock()
                    .get(&s.id())
                    .and_then(|w| w.upgrade())
                    .ok_or(Error::Foreign)?,
            ),
            None => None,
        };
        let pd = init.pd.id();
        let (qp_num, lane) = self.shared.run(|eng, _| {
            let n = eng.create_qp(pd, send_cq, recv_cq, srq, init.cap);
            (n, eng.qp_lane(n).unwrap_or_default())
        });
        Ok(Arc::new(TcpQp::new(qp_num, self.shared.clone(), lane)))
    }

    fn create_srq(
        &self,
        pd: &Arc<dyn ProtectionDomain>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<Arc<dyn SharedReceiveQueue>> {
        let receives = Arc::new(SharedReceives::new(self.shared.next_id(), pd.id()));
        let weak = Arc::downgrade(&receives);
        self.shared.srqs.lock().insert(receives.id, weak);
        let shared = Arc::downgrade(&self.shared);
        Ok(Arc::new(TcpSrq::new(receives, max_wr, max_sge, shared)))
    }

    fn set_cm_handler(&self, handler: Option<CmHandler>) {
        *self.shared.cm_handler.lock() = handler;
    }

    fn listen(&self, port: u16) -> Result<Arc<dyn Listener>> {
        let sock = TcpListener::bind(SocketAddrV4::new(self.shared.addr, port)).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                Error::AddrInUse
            } else {
                log::warn!("listen on port {port}: {e}");
                Error::NoResource(Resource::Host)
            }
        })?;
        sock.set_nonblocking(true).map_err(|_| Error::Internal)?;
        let port = sock
            .local_addr()
            .map(|a| a.port())
            .map_err(|_| Error::Internal)?;
        let id = self.shared.next_id();
        self.shared.run(|eng, _| {
            eng.listeners.insert(id, engine::ListenerEntry { sock });
            eng.wake_needed = true;
        });
        Ok(Arc::new(TcpListenerHandle::new(
            id,
            port,
            Arc::downgrade(&self.shared),
        )))
    }

    fn connect(
        &self,
        qp: &Arc<dyn QueuePair>,
        remote: SocketAddrV4,
        private_data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<()> {
        let qp_num = self.qp_num_of(qp);
        let attempt = self
            .shared
            .run(|eng, _| eng.begin_connect(qp_num, remote, private_data.to_vec(), timeout))?;
        // Started here without blocking; the progress thread sees it finish (engine/connection.rs
        // `connect_started`). A thread per connect, as before, cost more than the rest of a
        // connection's setup together.
        let limit = timeout
            .unwrap_or(Duration::from_secs(60))
            .max(Duration::from_millis(1));
        let started = sys::connect_start(remote);
        self.shared
            .run(|eng, _| eng.connect_started(qp_num, attempt, started, Instant::now() + limit));
        Ok(())
    }

    fn accept(
        &self,
        req: ConnRequestId,
        qp: &Arc<dyn QueuePair>,
        private_data: &[u8],
    ) -> Result<()> {
        let qp_num = self.qp_num_of(qp);
        self.shared
            .run(|eng, sh| eng.accept(sh, req, qp_num, private_data))
    }

    fn reject(&self, req: ConnRequestId, private_data: &[u8]) -> Result<()> {
        self.shared.run(|eng, sh| eng.reject(sh, req, private_data))
    }

    fn disconnect(&self, qp: &Arc<dyn QueuePair>, abrupt: bool) -> Result<()> {
        let qp_num = self.qp_num_of(qp);
        self.shared
            .run(|eng, sh| eng.disconnect(sh, qp_num, abrupt))
    }

    fn create_ud_qp(&self, init: QpInit) -> Result<Arc<dyn QueuePair>> {
        if init.srq.is_some() {
            return Err(Error::Invalid);
        }
        let send_cq = self.shared.cq(&init.send_cq)?;
        let recv_cq = self.shared.cq(&init.recv_cq)?;
        let sock = UdpSocket::bind(SocketAddrV4::new(self.shared.addr, 0)).map_err(|e| {
            log::warn!("datagram socket on {}: {e}", self.shared.addr);
            Error::NoResource(Resource::Qp)
        })?;
        sock.set_nonblocking(true).map_err(|_| Error::Internal)?;
        let local = match sock.local_addr() {
            Ok(std::net::SocketAddr::V4(a)) => a,
            _ => return Err(Error::Internal),
        };
        let pd = init.pd.id();
        let qp_num = self
            .shared
            .run(|eng, _| eng.create_ud_qp(sock, local, pd, send_cq, recv_cq, init.cap));
        Ok(Arc::new(TcpQp::new(
            qp_num,
            self.shared.clone(),
            // A datagram QP has no same-host lane: one that is never opened.
            Arc::default(),
        )))
    }

    fn ud_resolve(
        &self,
        qp: &Arc<dyn QueuePair>,
        remote: SocketAddrV4,
        private_data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<u64> {
        let qp_num = self.qp_num_of(qp);
        let id = self
            .shared
            .run(|eng, _| eng.begin_ud_resolve(qp_num, private_data.to_vec(), timeout))?;
        // As for `connect`: a helper thread makes the handshake's TCP connection.
        let weak = Arc::downgrade(&self.shared);
        let limit = timeout
            .unwrap_or(Duration::from_secs(60))
            .max(Duration::from_millis(1));
        std::thread::Builder::new()
            .name("daplrs-ud-resolve".into())
            .spawn(move || {
                sigio::block_here();
                let result = sys::connect_reusable(remote, limit);
                if let Some(shared) = weak.upgrade() {
                    shared.run(|eng, _| {
                        eng.ud_connect_results.push((id, result));
                        eng.wake_needed = true;
                    });
                }
            })
            .map_err(|_| Error::NoResource(Resource::Host))?;
        Ok(id)
    }

    fn ud_accept(
        &self,
        req: ConnRequestId,
        qp: &Arc<dyn QueuePair>,
        private_data: &[u8],
    ) -> Result<UdPeer> {
        let qp_num = self.qp_num_of(qp);
        self.shared
            .run(|eng, _| eng.ud_accept(req, qp_num, private_data))
    }

    fn ud_dropped(&self) -> u64 {
        self.shared.ud_dropped.load(Ordering::Relaxed)
    }

    fn close(&self) {
        if self.shared.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        sigio::unregister(&*self.shared);
        self.shared.run(|eng, sh| eng.shutdown(sh));
        self.shared.wake();
        let handle = self.thread.lock().take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}
