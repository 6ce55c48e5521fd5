//! The device: a libfabric domain (`domain`) and the thread that moves the
//! provider forward (libfabric 1.17's tcp provider moves nothing while nobody
//! calls it: docs/libfabric.md, Progress), on top of everything: its loop
//! reads the connection events (`cm`) and the CQs (`reap`), and does the
//! work the objects below leave it (`Domain::retry_later`,
//! `Registry::defer_broken`, `Ports::retry`).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use daplrs_backend::{
    CmHandler, CompletionQueue, Device, DeviceAttr, Error, ProtectionDomain, QpInit, QueuePair,
    Resource, Result, SharedReceiveQueue,
};
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::cm::Request;
use crate::cq::{OfiCq, Reader};
use crate::domain::{Domain, OpenFailure};
use crate::keymap::Nap;
use crate::mem::OfiPd;
use crate::qp::{OfiQp, Registry};
use crate::wait::Woken;

/// What the device's connection management finds its objects by (the QPs'
/// and ports' are the `Registry`'s).
#[derive(Default)]
pub(crate) struct Tables {
    pub cqs: Vec<Weak<OfiCq>>,
    /// A passive endpoint's address -> its listener.
    pub listeners: HashMap<usize, Weak<crate::cm::OfiListener>>,
    pub requests: HashMap<u64, Request>,
    /// RDM connection requests not yet accepted or rejected (see `rdm`).
    pub handshakes: HashMap<u64, crate::rdm::Pending>,
    /// Datagram address requests not yet answered (see `rdm::ud`).
    pub ud_requests: HashMap<u64, crate::rdm::UdPending>,
    /// The datagram QPs (destroyed at close).
    pub dgram_qps: Vec<Weak<crate::dgram::DgramQp>>,
}

pub struct OfiDevice {
    pub(crate) me: Weak<OfiDevice>,
    /// The fabric, domain and EQ, and what every object shares of them.
    pub(crate) dom: Arc<Domain>,
    /// The QPs, their connections and endpoints, and the ports.
    pub(crate) registry: Arc<Registry>,
    pub(crate) tables: Mutex<Tables>,
    /// Reliable datagrams: the thread reading the handshakes' connections
    /// (`rdm::Handshakes`), started at the first listen or connect.
    pub(crate) handshakes: Mutex<Option<Arc<crate::rdm::Handshakes>>>,
    /// The consumer's share of a connection message: what the provider's
    /// connection data holds beside our header (`cm::with_header`).
    private_data_max: u32,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Some object has no wait descriptor: the progress thread then looks at
    /// everything each millisecond instead of sleeping.
    polled: AtomicBool,
    /// The datagram side (`dgram=<provider>` in the entry), if any.
    pub(crate) dgram: Option<Arc<crate::dgram::Dgram>>,
}

/// The deepest DAT queue an EP may have (uDAPL benchmarks ask for 20,000).
const MAX_QUEUE_DEPTH: u32 = 1 << 16;
/// The QPs of a reliable-datagram device (they share its endpoints).
const MAX_RDM_QPS: u32 = 1 << 16;
impl OfiDevice {
    /// Opens "ofi <provider> [where]".
    pub fn open(provider: &str, place: Option<&str>) -> Result<Arc<OfiDevice>> {
        Self::open_with(provider, place, None)
    }

    /// Opens "ofi <provider> [where] [dgram=<datagram provider>]".
    pub fn open_with(
        provider: &str,
        place: Option<&str>,
        dgram: Option<&str>,
    ) -> Result<Arc<OfiDevice>> {
        Self::open_described(provider, place, dgram).map_err(|e| {
            log::warn!("{}", e.why);
            // libfabric's calls fail in many ways when the process has no file
            // descriptor left (often as "no data"): that is a lack of
            // resources, not a missing provider, as DAT tells them apart.
            if e.out_of_descriptors {
                Error::NoResource(Resource::Device)
            } else {
                Error::NoDevice
            }
        })
    }

    /// Why "ofi <provider> [where]" cannot open, in words (None when it can).
    pub fn diagnose(provider: &str, place: Option<&str>) -> Option<String> {
        Self::diagnose_with(provider, place, None)
    }

    /// As `diagnose`, with a datagram provider.
    pub fn diagnose_with(
        provider: &str,
        place: Option<&str>,
        dgram: Option<&str>,
    ) -> Option<String> {
        Self::open_described(provider, place, dgram)
            .map(|d| d.close())
            .err()
            .map(|e| e.why)
    }

    fn open_described(
        provider: &str,
        place: Option<&str>,
        dgram: Option<&str>,
    ) -> Result<Arc<OfiDevice>, OpenFailure> {
        let (dom, polled) = Domain::open(provider, place)?;
        let dgram = match dgram {
            None => None,
            // The datagram addresses travel in our handshake (`rdm::ud`).
            Some(p) if !dom.rdm => {
                return Err(format!(
                    "dgram={p}: datagrams need an entry of reliable datagrams (FI_EP_RDM), \
                     whose handshake of ours carries their addresses; '{provider}' connects"
                )
                .into())
            }
            Some(p) => Some(Arc::new(crate::dgram::Dgram::open(p, dom.address)?)),
        };
        let private_data_max = dom.cm_data.map_or(crate::cm::MAX_PRIVATE_DATA, |size| {
            let left = size.saturating_sub(crate::cm::header_bytes(&dom));
            crate::cm::MAX_PRIVATE_DATA.min(left as u32)
        });
        let dev = Arc::new_cyclic(|me| OfiDevice {
            me: me.clone(),
            registry: Registry::new(dom.waiter.clone()),
            dom,
            tables: Mutex::new(Tables::default()),
            handshakes: Mutex::new(None),
            private_data_max,
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            polled: AtomicBool::new(polled),
            dgram,
        });
        dev.start_progress()
            .map_err(|e| format!("progress thread: {e}"))?;
        Ok(dev)
    }

    /// Whether RDMA addresses given to this device are offsets from the start
    /// of the target's registration (the provider's MR mode has no
    /// FI_MR_VIRT_ADDR) rather than virtual addresses.
    pub fn addresses_by_offset(&self) -> bool {
        !self.dom.virt_addr
    }

    fn start_progress(self: &Arc<Self>) -> std::io::Result<()> {
        let me = Arc::downgrade(self);
        let waiter = self.dom.waiter.clone();
        let handle = std::thread::Builder::new()
            .name("daplrs-ofi".into())
            .spawn(move || progress_loop(me, waiter))?;
        *self.thread.lock() = Some(handle);
        Ok(())
    }

    /// A new CQ's wait descriptor joins the progress thread's set; a CQ
    /// without one makes the thread poll. The thread is woken either way: the
    /// provider arms a descriptor only in `fi_trywait`, which the sleeping
    /// thread made before this CQ existed.
    fn watch_cq(&self, cq: &OfiCq) {
        if !self.dom.rdm {
            if let Err(e) = self.dom.waiter.watch(cq.ready.fd()) {
                log::warn!("CQ {}: ready set not watched ({e}): polled", cq.ready.fd());
                self.polled.store(true, Ordering::Release);
            }
        }
        self.watch_fd(cq.wait_fd);
    }

    /// As `watch_cq`, for a wait descriptor of another CQ (an SRQ QP's own).
    pub(crate) fn watch_fd(&self, fd: Option<std::os::fd::RawFd>) {
        let watched = fd.is_some_and(|fd| self.dom.waiter.watch(fd).is_ok());
        if !watched {
            self.polled.store(true, Ordering::Release);
        }
        self.dom.waiter.wake();
    }

    /// One turn of the progress thread: connection events, then every CQ read
    /// (which is what moves the provider's transfers). Returns the CQs read,
    /// for `fi_trywait` before the thread sleeps.
    /// `eq_wait_ms`: how long the EQ's read may wait (the polled tick).
    fn progress_once(&self, eq_wait_ms: i32) -> Vec<Arc<OfiCq>> {
        for qp in self.registry.take_deferred() {
            qp.broken();
        }
        for port in self.registry.ports.take_retries() {
            port.repost();
        }
        for qp in self
            .dom
            .take_retries()
            .into_iter()
            .filter_map(|n| self.qp(n))
        {
            qp.retry_held();
        }
        self.dom.arenas.serve(&self.dom);
        // Polling at the idle pace, the EQ's timed read is the thread's tick.
        self.handle_cm_events(eq_wait_ms);
        let cqs: Vec<Arc<OfiCq>> = {
            let mut t = self.tables.lock();
            t.cqs.retain(|w| w.strong_count() > 0);
            t.cqs.iter().filter_map(Weak::upgrade).collect()
        };
        for cq in &cqs {
            cq.reap_and_notify();
        }
        cqs
    }

    pub(crate) fn qp(&self, qp_num: u32) -> Option<Arc<OfiQp>> {
        self.registry.qp(qp_num)
    }

    pub(crate) fn emit(&self, event: daplrs_backend::CmEvent) {
        self.dom.emit(event);
    }

    fn attributes(&self) -> DeviceAttr {
        // SAFETY: the attribute structs of our fi_info, read only.
        let (ep, tx, rx, dom) = unsafe {
            let i = &*self.dom.info.ptr();
            (&*i.ep_attr, &*i.tx_attr, &*i.rx_attr, &*i.domain_attr)
        };
        let clamp = |v: usize| v.min(u32::MAX as usize) as u32;
        DeviceAttr {
            // Over reliable datagrams QPs share the provider's endpoints
            // (`port`): how many is ours to say.
            max_qp: if self.dom.rdm {
                MAX_RDM_QPS
            } else {
                clamp(dom.ep_cnt)
            },
            // Deeper than the provider's queues: the QP holds what they cannot
            // take and feeds it as they complete (`qp`).
            max_qp_wr: MAX_QUEUE_DEPTH,
            max_sge: clamp(tx.iov_limit.min(rx.iov_limit).max(1)),
            max_cq: clamp(dom.cq_cnt),
            max_cqe: 65536,
            max_mr: clamp(dom.mr_cnt.max(1 << 16)),
            // libfabric states no bound.
            max_mr_size: daplrs_backend::MAX_REGION_BYTES,
            max_pd: 1 << 16,
            // A bind's context is announced before the bind registers
            // (`MemoryWindow::next_rkey`): a key of ours, which the key table
            // maps to the provider's.
            max_mw: 1 << 16,
            // libfabric bounds the endpoints per shared context
            // (max_ep_srx_ctx), not how many contexts a domain has; without
            // them an SRQ is a pool of ours (`srq`), bounded by memory alone.
            max_srq: 1 << 16,
            max_srq_wr: MAX_QUEUE_DEPTH,
            max_msg_size: clamp(ep.max_msg_size),
            max_rdma_size: clamp(ep.max_msg_size),
            // libfabric bounds RDMA reads in flight only by the transmit queue.
            max_rd_atomic: clamp(tx.size),
            max_private_data: self.private_data_max,
            // A datagram's payload where the entry has them.
            mtu: self.dgram.as_ref().map_or(4096, |d| d.mtu()),
            ud: self.dgram.is_some(),
            max_rdma_read_sge: clamp(tx.rma_iov_limit.max(1)).min(clamp(tx.iov_limit.max(1))),
            atomics: self.dom.atomics,
            pins_for_write: false,
            pin_limit: None,
            write_imm: self.dom.write_imm(),
            transport: "libfabric",
        }
    }
}

/// How often the progress thread turns on a provider it must poll (some
/// object without a wait descriptor: shm, ofi_rxm). Idle, once a millisecond
/// (the EQ's timed read). For `HOT` after a post, every `HOT_NAP`: a peer's
/// RDMA write or send reaches a DAT program spinning on its memory only when
/// some turn reads the provider (that program calls nothing that would), and
/// after a post the answer is due soon; then the naps double back to the
/// millisecond. Measured in docs/libfabric.md ("The polled pace").
#[derive(Default)]
struct Cadence {
    hot_until: Option<std::time::Instant>,
    nap: std::time::Duration,
}

impl Cadence {
    const HOT: std::time::Duration = std::time::Duration::from_millis(2);
    const HOT_NAP: std::time::Duration = std::time::Duration::from_micros(25);
    const IDLE: std::time::Duration = std::time::Duration::from_millis(1);

    /// The nap before the next turn, or None at the idle pace (the EQ's read
    /// waits then). `posted`: something was posted since the last turn.
    fn next(&mut self, posted: bool) -> Option<std::time::Duration> {
        self.next_at(posted, std::time::Instant::now())
    }

    fn next_at(&mut self, posted: bool, now: std::time::Instant) -> Option<std::time::Duration> {
        if posted {
            self.hot_until = Some(now + Self::HOT);
            self.nap = Self::HOT_NAP;
        }
        let until = self.hot_until?;
        if now >= until {
            self.nap *= 2;
            if self.nap >= Self::IDLE {
                self.hot_until = None;
                return None;
            }
        }
        Some(self.nap)
    }
}

/// Reads the EQ and CQs, then sleeps on their descriptors until one is ready.
/// While a consumer polls, it moves the provider itself: the thread naps
/// instead, on its eventfd alone, until one full turn every `FULL_TURN` for
/// what nobody polls (the EQ, other CQs) or until woken (a connection to
/// break, a new CQ, the stop). Naps to the next turn, not to the end of the
/// poller's window: a timer every 100 us took the pollers' CPUs (A/B in
/// docs/libfabric.md, Progress).
fn progress_loop(me: Weak<OfiDevice>, waiter: Arc<crate::wait::Waiter>) {
    const FULL_TURN: std::time::Duration = std::time::Duration::from_millis(1);
    waiter.precise_naps();
    // Held while this thread runs: its end, or the process's, tells peers (keymap).
    let _alive = me.upgrade().map(|dev| dev.dom.keys.hold_alive());
    let mut cadence = Cadence::default();
    let mut napping_since: Option<std::time::Instant> = None;
    // Woken from a nap: a connection to break, a new CQ or the stop.
    let mut woken = false;
    // Woken from the idle pace's nap (a peer's doorbell among the reasons): turn quickly.
    let mut rung = false;
    loop {
        let Some(dev) = me.upgrade() else { return };
        if dev.stop.load(Ordering::Acquire) {
            return;
        }
        if !woken && waiter.consumer_polling() {
            let since = *napping_since.get_or_insert_with(std::time::Instant::now);
            let left = FULL_TURN.saturating_sub(since.elapsed());
            // Peers on this host ring once the consumer stops polling (`Nap::ForPoller`).
            // Said before the last look, so a consumer that stopped after it is rung for.
            dev.dom.keys.set_nap(Nap::ForPoller);
            if !left.is_zero() && waiter.consumer_polling() {
                drop(dev);
                // A peer's ring is answered by the consumer if it polls still: the loop's
                // next look says.
                woken = waiter.nap(left) == Woken::Wake;
                if let Some(dev) = me.upgrade() {
                    dev.dom.keys.set_nap(Nap::Awake);
                }
                continue;
            }
            dev.dom.keys.set_nap(Nap::Awake);
        }
        napping_since = None;
        woken = false;
        if dev.polled.load(Ordering::Acquire) {
            let nap = cadence
                .next(waiter.take_posted() || rung)
                .unwrap_or(FULL_TURN);
            // Peers on this host ring while we nap (keymap) rather than wait for the next
            // turn. Said before the last look, so a request posted after it finds us napping.
            dev.dom.keys.set_nap(Nap::IdlePace);
            let cqs = dev.progress_once(0);
            drop((cqs, dev));
            rung = waiter.nap(nap) != Woken::No;
            woken = rung;
            if let Some(dev) = me.upgrade() {
                dev.dom.keys.set_nap(Nap::Awake);
            }
            continue;
        }
        let cqs = dev.progress_once(0);
        if dev.dom.retries_waiting() || dev.registry.ports.retries_waiting() {
            // A busy provider is read and tried again soon, not slept on.
            drop((cqs, dev));
            std::thread::sleep(std::time::Duration::from_micros(100));
            continue;
        }
        // A feed marked from now on wakes the thread (`Ready::mark`); one
        // marked since the turn is read first.
        waiter.going_to_sleep();
        if cqs.iter().any(|cq| cq.ready.has_marked()) {
            waiter.awake();
            continue;
        }
        let mut fids: Vec<*mut fi::fid> = Vec::with_capacity(cqs.len() + 1);
        fids.push(dev.dom.eq.fid());
        fids.extend(cqs.iter().map(|cq| cq.cq.fid()));
        // On tcp the connected endpoints' fid_cqs are not asked (asking
        // walks their endpoints): their descriptors are in the CQs' ready
        // sets, watched; those read at every look (SRQ QPs' own) are.
        let feeds: Vec<_> = cqs
            .iter()
            .flat_map(|cq| cq.feeds(!dev.dom.level_waits))
            .collect();
        fids.extend(feeds.iter().map(|f| f.cq.fid()));
        // Armed with the device and CQs held (their objects stay open); the
        // sleep holds neither, so that they can be dropped (a drop wakes us).
        let sleep = waiter.may_sleep(dev.dom.fabric.ptr(), &mut fids);
        drop((feeds, cqs));
        drop(dev);
        if sleep {
            waiter.sleep();
        }
        waiter.awake();
    }
}

impl Device for OfiDevice {
    fn name(&self) -> String {
        self.dom.name.clone()
    }

    fn address(&self) -> Ipv4Addr {
        self.dom.address
    }

    fn attr(&self) -> DeviceAttr {
        self.attributes()
    }

    fn alloc_pd(&self) -> Result<Arc<dyn ProtectionDomain>> {
        Ok(OfiPd::new(&self.dom))
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CompletionQueue>> {
        let reader: Weak<dyn Reader> = Arc::downgrade(&self.registry) as Weak<Registry>;
        let cq = OfiCq::open(&self.dom, reader, depth)?;
        self.tables.lock().cqs.push(Arc::downgrade(&cq));
        self.watch_cq(&cq);
        Ok(cq)
    }

    fn create_qp(&self, init: QpInit) -> Result<Arc<dyn QueuePair>> {
        let qp = OfiQp::new(&self.dom, &self.registry, init)?;
        self.registry.insert(&qp);
        Ok(qp)
    }

    fn create_srq(
        &self,
        _pd: &Arc<dyn ProtectionDomain>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<Arc<dyn SharedReceiveQueue>> {
        Ok(crate::srq::OfiSrq::open(&self.dom, max_wr, max_sge)?)
    }

    fn set_cm_handler(&self, handler: Option<CmHandler>) {
        *self.dom.cm_handler.lock() = handler;
    }

    fn listen(&self, port: u16) -> Result<Arc<dyn daplrs_backend::Listener>> {
        if self.dom.rdm {
            return Ok(self.listen_rdm(port)?);
        }
        Ok(self.listen_on(port)?)
    }

    fn connect(
        &self,
        qp: &Arc<dyn QueuePair>,
        remote: std::net::SocketAddrV4,
        private_data: &[u8],
        timeout: Option<std::time::Duration>,
    ) -> Result<()> {
        if self.dom.rdm {
            return self.connect_rdm(OfiQp::of(qp)?, remote, private_data, timeout);
        }
        self.connect_qp(OfiQp::of(qp)?, remote, private_data)
    }

    fn accept(&self, req: u64, qp: &Arc<dyn QueuePair>, private_data: &[u8]) -> Result<()> {
        if self.dom.rdm {
            return self.accept_rdm(req, OfiQp::of(qp)?, private_data);
        }
        self.accept_request(req, OfiQp::of(qp)?, private_data)
    }

    fn reject(&self, req: u64, private_data: &[u8]) -> Result<()> {
        if self.dom.rdm {
            return self.reject_rdm(req, private_data);
        }
        self.reject_request(req, private_data)
    }

    fn disconnect(&self, qp: &Arc<dyn QueuePair>, abrupt: bool) -> Result<()> {
        if let Some(d) = crate::dgram::DgramQp::of(qp) {
            d.disconnect();
            return Ok(());
        }
        OfiQp::of(qp)?.disconnect(abrupt);
        Ok(())
    }

    fn create_ud_qp(&self, init: QpInit) -> Result<Arc<dyn QueuePair>> {
        let dg = self.dgram.as_ref().ok_or(Error::Unsupported)?;
        let qp = crate::dgram::DgramQp::open(dg, &self.dom, init)?;
        // Its CQ has no wait object: read at the polled pace and by the
        // consumers' reads of its DAT CQs.
        self.polled.store(true, Ordering::Release);
        let mut t = self.tables.lock();
        t.dgram_qps.retain(|w| w.strong_count() > 0);
        t.dgram_qps.push(Arc::downgrade(&qp));
        drop(t);
        self.dom.waiter.wake();
        Ok(qp)
    }

    fn ud_resolve(
        &self,
        qp: &Arc<dyn QueuePair>,
        remote: std::net::SocketAddrV4,
        private_data: &[u8],
        timeout: Option<std::time::Duration>,
    ) -> Result<u64> {
        let qp = crate::dgram::DgramQp::of(qp).ok_or(Error::Foreign)?;
        self.resolve_ud(qp, remote, private_data, timeout)
    }

    fn ud_accept(
        &self,
        req: u64,
        qp: &Arc<dyn QueuePair>,
        private_data: &[u8],
    ) -> Result<daplrs_backend::UdPeer> {
        let qp = crate::dgram::DgramQp::of(qp).ok_or(Error::Foreign)?;
        self.accept_ud(req, qp, private_data)
    }

    fn ud_dropped(&self) -> u64 {
        self.dgram.as_ref().map_or(0, |d| d.dropped())
    }

    fn close(&self) {
        self.stop.store(true, Ordering::Release);
        self.dom.waiter.wake();
        let thread = self.thread.lock().take();
        if let Some(t) = thread {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        for qp in self.registry.all() {
            qp.destroy_now();
        }
        let dgram_qps = std::mem::take(&mut self.tables.lock().dgram_qps);
        for qp in dgram_qps.iter().filter_map(Weak::upgrade) {
            qp.destroy();
        }
        let handshakes = self.handshakes.lock().take();
        if let Some(hs) = handshakes {
            hs.stop();
        }
        self.dom.left_locks.stop();
    }
}

impl Drop for OfiDevice {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.dom.waiter.wake();
        if let Some(hs) = self.handshakes.get_mut().take() {
            hs.stop();
        }
        let mut tables = self.tables.lock();
        tables.requests.clear();
        tables.handshakes.clear();
        tables.ud_requests.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::Cadence;
    use std::time::{Duration, Instant};

    #[test]
    fn the_polled_pace_quickens_after_a_post_and_slows_back_to_the_tick() {
        let mut c = Cadence::default();
        let t0 = Instant::now();
        assert_eq!(
            c.next_at(false, t0),
            None,
            "idle: the EQ's millisecond read"
        );
        assert_eq!(c.next_at(true, t0), Some(Cadence::HOT_NAP));
        let inside = t0 + Cadence::HOT - Duration::from_micros(1);
        assert_eq!(c.next_at(false, inside), Some(Cadence::HOT_NAP));
        // Past the hot window the naps double until they reach the tick.
        let after = t0 + Cadence::HOT;
        let mut naps = Vec::new();
        while let Some(nap) = c.next_at(false, after) {
            naps.push(nap);
        }
        assert_eq!(naps.first(), Some(&(Cadence::HOT_NAP * 2)));
        assert!(naps.windows(2).all(|w| w[1] == w[0] * 2));
        assert!(naps.len() < 8 && *naps.last().unwrap() < Cadence::IDLE);
        assert_eq!(c.next_at(false, after), None);
        // A post brings the quick pace back at once.
        assert_eq!(c.next_at(true, after), Some(Cadence::HOT_NAP));
    }
}
