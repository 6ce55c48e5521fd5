//! A datagram QP: an `FI_EP_DGRAM` endpoint with a completion queue of its
//! own, bound to the datagram domain's address vector, and a slab of
//! buffers of ours: receive buffers always posted to the provider, and send
//! buffers a datagram is gathered into.
//!
//! The provider never sees the consumer's receives. A datagram lands in a
//! buffer of ours and is copied into the receive posted first, after a GRH
//! area (`daplrs_backend::software_grh`); one that finds no receive is dropped and counted, one
//! larger than its receive fails it (LocalLength) and stops the QP: Error,
//! the rest flushed, `CmEvent::Broken`, as an InfiniBand UD QP. So the
//! trait's semantics hold whatever the provider does with a datagram that
//! comes before a receive (libfabric's udp leaves it in the socket for the
//! next one). Cost: a copy each way (at most a datagram, 1,472 bytes on
//! udp).
//!
//! The QP's CQ is read by the device's progress thread and by every read
//! of the QP's DAT CQs (`OfiCq::datagrams`), one reader at a time.

use std::any::Any;
use std::collections::VecDeque;
use std::net::SocketAddrV4;
use std::ptr::null_mut;
use std::sync::{Arc, Weak};

use daplrs_backend::{
    AddressHandle, CmEvent, Error, QpCap, QpInit, QpState, QueuePair, RecvWr, Resource, Result,
    SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion, WrContext, GRH_LEN,
};
use ofi_sys as fi;
use parking_lot::Mutex;

use super::{header, parse_header, register, Dgram, OfiAh, HEADER};
use crate::cq::{drain, Done, OfiCq};
use crate::domain::Domain;
use crate::{opened, Fid};

/// Receive buffers kept posted, and send buffers (at most the provider's
/// depths).
const RECV_BUFFERS: usize = 32;
const SEND_BUFFERS: usize = 32;
/// A context's kind (high half) and buffer (low half).
const SEND: u64 = 1 << 32;
const RECV: u64 = 2 << 32;
/// Passes over the CQ in one read (udp completes one arrival a pass).
const READ_PASSES: usize = 64;

/// Memory of ours the provider reads and writes behind Rust's back.
struct Slab {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: plain memory; who touches which buffer is the QP's to say (a
// buffer is the provider's while posted, ours after its completion).
unsafe impl Send for Slab {}
// SAFETY: as above.
unsafe impl Sync for Slab {}

impl Slab {
    fn new(len: usize) -> Result<Slab> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 64)
            .map_err(|_| Error::NoResource(Resource::Memory))?;
        // SAFETY: a layout of non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(ptr).ok_or(Error::NoResource(Resource::Memory))?;
        Ok(Slab { ptr, layout })
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

pub(crate) struct DgramQp {
    num: u32,
    dom: Weak<Domain>,
    /// The endpoint's fabric address (`fi_getname`), what peers insert.
    pub(crate) name: Vec<u8>,
    local: Option<SocketAddrV4>,
    cap: QpCap,
    send_cq: Arc<OfiCq>,
    recv_cq: Arc<OfiCq>,
    /// Buffer size (the provider's prefix, our header, the MTU), counts.
    buf_len: usize,
    recv_bufs: usize,
    send_bufs: usize,
    inner: Mutex<Inner>,
    /// Held while the CQ is read (one reader: arrivals and sends in order).
    reading: Mutex<()>,
    /// An event a consumer's read found, for the progress thread to say.
    pending: Mutex<Option<CmEvent>>,
    /// Closed in this order (fields drop in order): the endpoint, its CQ,
    /// the registration, the memory, then the datagram domain.
    ep: Fid<fi::fid_ep>,
    cq: Fid<fi::fid_cq>,
    mr: Option<Fid<fi::fid_mr>>,
    slab: Slab,
    /// The AV and domain the endpoint was opened on: dropped after it.
    dg: Arc<Dgram>,
}

struct Inner {
    state: QpState,
    /// The consumer's receives, oldest first.
    recvs: VecDeque<RecvWr>,
    /// Send buffers free.
    free: Vec<usize>,
    /// A send buffer's request: its wr_id and payload length.
    sending: Vec<Option<(u64, WrContext, u32)>>,
}

/// What a read of the CQ hands the DAT CQs.
#[derive(Default)]
struct Out {
    sent: Vec<WorkCompletion>,
    received: Vec<WorkCompletion>,
    event: Option<CmEvent>,
}

impl DgramQp {
    pub(crate) fn open(dg: &Arc<Dgram>, dom: &Arc<Domain>, init: QpInit) -> Result<Arc<DgramQp>> {
        let send_cq = crate::qp::ofi_cq(&init.send_cq)?;
        let recv_cq = crate::qp::ofi_cq(&init.recv_cq)?;
        let (max_msg, prefix, rx_depth, tx_depth) = dg.ep_limits();
        let buf_len = prefix + (dg.mtu() as usize + HEADER).min(max_msg);
        let recv_bufs = RECV_BUFFERS.min(rx_depth);
        let send_bufs = SEND_BUFFERS.min(tx_depth);
        let slab = Slab::new(buf_len * (recv_bufs + send_bufs))?;
        let mr = if dg.local_descs() {
            Some(register(dg, slab.ptr.as_ptr(), slab.layout.size())?)
        } else {
            None
        };
        let cq = open_cq(dg, recv_bufs + send_bufs)?;
        let ep = open_ep(dg, &cq)?;
        let name = fabric_name(&ep)?;
        // SAFETY: the name came from fi_getname: `name.len()` readable bytes.
        let local = unsafe { crate::sockaddr_v4(name.as_ptr().cast(), name.len()) };
        let qp = Arc::new(DgramQp {
            num: dom.next_qp_num(),
            dg: dg.clone(),
            dom: Arc::downgrade(dom),
            name,
            local,
            cap: init.cap,
            send_cq,
            recv_cq,
            buf_len,
            recv_bufs,
            send_bufs,
            inner: Mutex::new(Inner {
                state: QpState::Connected,
                recvs: VecDeque::new(),
                free: (0..send_bufs).rev().collect(),
                sending: vec![None; send_bufs],
            }),
            reading: Mutex::new(()),
            pending: Mutex::new(None),
            ep,
            cq,
            mr,
            slab,
        });
        for i in 0..recv_bufs {
            qp.post_buffer(i)?;
        }
        let me: Arc<dyn Any + Send + Sync> = qp.clone();
        qp.send_cq.add_datagram_qp(Arc::downgrade(&me));
        qp.recv_cq.add_datagram_qp(Arc::downgrade(&me));
        Ok(qp)
    }

    pub(crate) fn of(qp: &Arc<dyn QueuePair>) -> Option<&DgramQp> {
        qp.as_any().downcast_ref::<DgramQp>()
    }

    pub(crate) fn num(&self) -> u32 {
        self.num
    }

    /// Buffer `i`: receive buffers first, then send buffers.
    fn buffer(&self, i: usize) -> *mut u8 {
        debug_assert!(i < self.recv_bufs + self.send_bufs);
        // SAFETY: within the slab (i below the buffer count).
        unsafe { self.slab.ptr.as_ptr().add(i * self.buf_len) }
    }

    fn desc(&self) -> *mut libc::c_void {
        self.mr.as_ref().map_or(null_mut(), |mr| {
            // SAFETY: an open registration.
            unsafe { fi::fi_mr_desc(mr.ptr()) }
        })
    }

    /// Gives receive buffer `i` to the provider.
    fn post_buffer(&self, i: usize) -> Result<()> {
        let iov = fi::iovec {
            iov_base: self.buffer(i).cast(),
            iov_len: self.buf_len,
        };
        let mut desc = self.desc();
        let msg = fi::fi_msg {
            msg_iov: &iov,
            desc: &mut desc,
            iov_count: 1,
            addr: crate::FI_ADDR_UNSPEC,
            context: (RECV | i as u64) as *mut libc::c_void,
            data: 0,
        };
        // SAFETY: an enabled endpoint; the buffer is ours and stays until
        // the endpoint closes (the slab is freed after it).
        let rc = unsafe { fi::fi_recvmsg(self.ep.ptr(), &msg, fi::FI_COMPLETION as u64) };
        crate::check(rc, "datagrams: fi_recvmsg", Error::Internal).map(|_| ())
    }

    /// Pushes what a read or a post produced to the DAT CQs, then its event.
    fn deliver(&self, out: Out) {
        self.send_cq.push(out.sent);
        self.recv_cq.push(out.received);
        if let Some(event) = out.event {
            if let Some(dom) = self.dom.upgrade() {
                dom.emit(event);
            }
        }
    }

    /// Moves to Error: the consumer's receives are flushed into `out`;
    /// `event` (if any) is said after them.
    fn stop(&self, inner: &mut Inner, out: &mut Out, event: Option<CmEvent>) {
        inner.state = QpState::Error;
        out.received
            .extend(inner.recvs.drain(..).map(|wr| wr.flushed(self.num)));
        out.event = event;
    }

    /// A request failed with `status`: it completes so, and the QP stops
    /// (Broken), as a verbs UD QP does.
    /// `request`: the wr_id and context of the request or receive that failed.
    fn failed(
        &self,
        inner: &mut Inner,
        out: &mut Out,
        request: (u64, WrContext),
        status: WcStatus,
        send: bool,
    ) {
        let (wr_id, ctx) = request;
        let (op, list) = if send {
            (WcOpcode::Send, &mut out.sent)
        } else {
            (WcOpcode::Recv, &mut out.received)
        };
        list.push(WorkCompletion::new(wr_id, status, op, 0, self.num).with_ctx(ctx));
        let broken = CmEvent::Broken { qp_num: self.num };
        self.stop(inner, out, Some(broken));
    }

    /// `disconnect`: Error, receives flushed, Disconnected.
    pub(crate) fn disconnect(&self) {
        let mut out = Out::default();
        {
            let mut inner = self.inner.lock();
            if inner.state == QpState::Error {
                return;
            }
            let event = CmEvent::Disconnected { qp_num: self.num };
            self.stop(&mut inner, &mut out, Some(event));
        }
        self.deliver(out);
    }

    /// Reads the QP's CQ: sends done, datagrams arrived. Returns whether
    /// anything completed. `polled`: the DAT CQ a consumer polls, holding
    /// its EVD's lock: read only where both of the QP's CQs are that one,
    /// whose queue then takes the completions without a notification (the
    /// consumer reads it next), and an event waits for the progress thread.
    pub(crate) fn progress(&self, polled: Option<&OfiCq>) -> bool {
        if let Some(cq) = polled {
            let mine = |c: &Arc<OfiCq>| std::ptr::eq(Arc::as_ptr(c), cq);
            if !mine(&self.send_cq) || !mine(&self.recv_cq) {
                return false;
            }
        }
        let Some(_reading) = self.reading.try_lock() else {
            return false;
        };
        let mut out = Out::default();
        for _ in 0..READ_PASSES {
            let mut any = false;
            drain(self.cq.ptr(), false, false, |done| {
                any = true;
                self.completed(done, &mut out);
            });
            if !any {
                break;
            }
        }
        let added = !out.sent.is_empty() || !out.received.is_empty();
        match polled {
            Some(cq) => self.deliver_quietly(cq, out),
            None => {
                out.event = out.event.or_else(|| self.pending.lock().take());
                self.deliver(out);
            }
        }
        added
    }

    /// `deliver` for a consumer's poll of `cq` (see `progress`).
    fn deliver_quietly(&self, cq: &OfiCq, out: Out) {
        let mut q = cq.queue.lock();
        q.extend(out.sent);
        q.extend(out.received);
        drop(q);
        if let Some(event) = out.event {
            *self.pending.lock() = Some(event);
            if let Some(dom) = self.dom.upgrade() {
                dom.waiter.wake();
            }
        }
    }

    fn completed(&self, done: Done, out: &mut Out) {
        let i = (done.context & 0xffff_ffff) as usize;
        match done.context & !0xffff_ffff {
            SEND => self.sent(i, done.result, out),
            RECV if i < self.recv_bufs => {
                if let Ok(len) = done.result {
                    self.arrived(i, len as usize, out);
                }
                // A buffer cancelled at close is not posted again.
                if done.result != Err(WcStatus::Flushed) {
                    if let Err(e) = self.post_buffer(i) {
                        log::warn!(
                            "datagram QP {}: buffer {i} not posted again: {e:?}",
                            self.num
                        );
                    }
                }
            }
            _ => log::debug!("datagram QP {}: unknown completion", self.num),
        }
    }

    fn sent(&self, i: usize, result: std::result::Result<u32, WcStatus>, out: &mut Out) {
        let mut inner = self.inner.lock();
        let Some((wr_id, ctx, len)) = inner.sending.get_mut(i).and_then(Option::take) else {
            return;
        };
        inner.free.push(i);
        match result {
            Ok(_) => out.sent.push(
                WorkCompletion::new(wr_id, WcStatus::Success, WcOpcode::Send, len, self.num)
                    .with_ctx(ctx),
            ),
            Err(status) if inner.state == QpState::Error => {
                out.sent.push(
                    WorkCompletion::new(wr_id, status, WcOpcode::Send, 0, self.num).with_ctx(ctx),
                );
            }
            Err(status) => self.failed(&mut inner, out, (wr_id, ctx), status, true),
        }
    }

    /// A datagram of `len` bytes (the provider's prefix included) landed in
    /// receive buffer `i`: copied into the oldest receive, after a GRH.
    fn arrived(&self, i: usize, len: usize, out: &mut Out) {
        let (_, prefix, _, _) = self.dg.ep_limits();
        let len = len.min(self.buf_len);
        // SAFETY: buffer `i` is ours again (its receive completed) and holds
        // `len` bytes the provider wrote.
        let bytes = unsafe { std::slice::from_raw_parts(self.buffer(i), len) };
        let Some((from, solicited)) = bytes.get(prefix..).and_then(parse_header) else {
            log::debug!("datagram QP {}: not a datagram of ours, dropped", self.num);
            return;
        };
        let payload = &bytes[prefix + HEADER..];
        let mut inner = self.inner.lock();
        if inner.state != QpState::Connected {
            return;
        }
        let Some(wr) = inner.recvs.pop_front() else {
            self.dg.count_drop();
            log::debug!("datagram QP {}: dropped, no receive posted", self.num);
            return;
        };
        let mut data = Vec::with_capacity(GRH_LEN as usize + payload.len());
        data.extend_from_slice(&daplrs_backend::software_grh(
            from,
            self.dg.address,
            payload.len(),
        ));
        data.extend_from_slice(payload);
        match crate::srq::copy_into(&wr, &data) {
            Ok(n) => out.received.push(WorkCompletion {
                solicited,
                ..wr.completion(WcStatus::Success, WcOpcode::Recv, n, self.num)
            }),
            Err(status) => self.failed(&mut inner, out, (wr.wr_id, wr.ctx), status, false),
        }
    }

    /// Sends `wr`'s message as one datagram to `fi_addr` (None: a QP no
    /// resolution named, where it goes nowhere, as on a fabric).
    fn send_to(&self, wr: &SendWr, fi_addr: Option<u64>) -> Result<()> {
        let len: u64 = wr.sgl.iter().map(|s| u64::from(s.length)).sum();
        let mut out = Out::default();
        let mut inner = self.inner.lock();
        if inner.state == QpState::Error {
            let flushed = WorkCompletion::flushed(wr.wr_id, WcOpcode::Send, self.num);
            out.sent.push(flushed);
        } else if len > u64::from(self.dg.mtu()) {
            self.failed(
                &mut inner,
                &mut out,
                (wr.wr_id, wr.ctx),
                WcStatus::LocalLength,
                true,
            );
        } else if let Some(fi_addr) = fi_addr {
            let i = inner
                .free
                .pop()
                .ok_or(Error::NoResource(Resource::WorkQueue))?;
            if let Err(e) = self.post_datagram(i, wr, len as usize, fi_addr) {
                inner.free.push(i);
                return Err(e);
            }
            inner.sending[i] = Some((wr.wr_id, wr.ctx, len as u32));
        } else {
            log::debug!("datagram QP {}: send to a QP no resolution named", self.num);
            let wc = WorkCompletion::new(
                wr.wr_id,
                WcStatus::Success,
                WcOpcode::Send,
                len as u32,
                self.num,
            );
            out.sent.push(wc.with_ctx(wr.ctx));
        }
        drop(inner);
        self.deliver(out);
        Ok(())
    }

    /// Gathers `wr`'s message behind our header into send buffer `i` and
    /// hands it to the provider.
    fn post_datagram(&self, i: usize, wr: &SendWr, len: usize, fi_addr: u64) -> Result<()> {
        let prefix = self.dg.tx_prefix();
        let at = self.recv_bufs + i;
        let buf = self.buffer(at);
        let h = header(self.dg.address, wr.solicited);
        // SAFETY: send buffer `i` is ours (free until posted) and holds
        // `buf_len` >= prefix + HEADER + len bytes; the segments are the
        // consumer's registered memory, checked by the core at post.
        unsafe {
            std::ptr::copy_nonoverlapping(h.as_ptr(), buf.add(prefix), HEADER);
            let mut at = prefix + HEADER;
            for s in wr.sgl.iter() {
                std::ptr::copy_nonoverlapping(s.addr as *const u8, buf.add(at), s.length as usize);
                at += s.length as usize;
            }
        }
        let iov = fi::iovec {
            iov_base: buf.cast(),
            iov_len: prefix + HEADER + len,
        };
        let mut desc = self.desc();
        let msg = fi::fi_msg {
            msg_iov: &iov,
            desc: &mut desc,
            iov_count: 1,
            addr: fi_addr,
            context: (SEND | i as u64) as *mut libc::c_void,
            data: 0,
        };
        // SAFETY: an enabled endpoint; the buffer stays ours until the send completes.
        let rc = unsafe { fi::fi_sendmsg(self.ep.ptr(), &msg, fi::FI_COMPLETION as u64) };
        crate::check(
            rc,
            "datagrams: fi_sendmsg",
            Error::NoResource(Resource::WorkQueue),
        )
        .map(|_| ())
    }

    /// Where a datagram for QP `qpn` behind `ah` goes.
    fn destination(&self, ah: &Arc<dyn AddressHandle>, qpn: u32) -> Result<Option<u64>> {
        let ah = ah.as_any().downcast_ref::<OfiAh>().ok_or(Error::Invalid)?;
        if ah.qpn == qpn {
            return Ok(Some(ah.fi_addr));
        }
        Ok(self.dg.lookup(ah.addr, qpn))
    }
}

/// The QP's CQ: room for every buffer's completion.
fn open_cq(dg: &Dgram, entries: usize) -> Result<Fid<fi::fid_cq>> {
    let mut attr = fi::fi_cq_attr {
        size: entries.max(64),
        format: fi::fi_cq_format_FI_CQ_FORMAT_DATA,
        wait_obj: fi::fi_wait_obj_FI_WAIT_NONE,
        ..Default::default()
    };
    let mut cq = null_mut();
    // SAFETY: an open domain; `cq` receives the new object.
    let rc = unsafe { fi::fi_cq_open(dg.domain.ptr(), &mut attr, &mut cq, null_mut()) };
    opened(
        rc,
        "datagrams: fi_cq_open",
        Error::NoResource(Resource::Memory),
    )?;
    Ok(Fid(cq))
}

/// An endpoint bound to the domain's AV and to `cq` both ways, enabled.
fn open_ep(dg: &Dgram, cq: &Fid<fi::fid_cq>) -> Result<Fid<fi::fid_ep>> {
    let mut ep = null_mut();
    // SAFETY: an open domain and its provider's fi_info; `ep` receives the endpoint.
    let rc = unsafe { fi::fi_endpoint(dg.domain.ptr(), dg.info.ptr(), &mut ep, null_mut()) };
    opened(
        rc,
        "datagrams: fi_endpoint",
        Error::NoResource(Resource::Qp),
    )?;
    let ep = Fid(ep);
    let both = (fi::FI_TRANSMIT | fi::FI_RECV) as u64;
    // SAFETY: the endpoint just opened; the AV and CQ are open objects of its domain.
    unsafe {
        let rc = fi::fi_ep_bind(ep.ptr(), dg.av().fid(), 0);
        opened(rc, "datagrams: bind AV", Error::Internal)?;
        let rc = fi::fi_ep_bind(ep.ptr(), cq.fid(), both);
        opened(rc, "datagrams: bind CQ", Error::Internal)?;
        let rc = fi::fi_enable(ep.ptr());
        opened(rc, "datagrams: fi_enable", Error::NoResource(Resource::Qp))?;
    }
    Ok(ep)
}

fn fabric_name(ep: &Fid<fi::fid_ep>) -> Result<Vec<u8>> {
    let mut name = vec![0u8; super::NAME_BYTES];
    let mut len = name.len();
    // SAFETY: an enabled endpoint; `name` has `len` writable bytes.
    let rc = unsafe { fi::fi_getname(ep.ptr(), name.as_mut_ptr().cast(), &mut len) };
    opened(rc, "datagrams: fi_getname", Error::Internal)?;
    name.truncate(len);
    Ok(name)
}

impl QueuePair for DgramQp {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn qp_num(&self) -> u32 {
        self.num
    }

    fn state(&self) -> QpState {
        self.inner.lock().state
    }

    fn post_send(&self, _wr: &SendWr) -> Result<()> {
        // A datagram goes with `post_send_ud`, naming where.
        Err(Error::BadState)
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        if wr.sgl.len() > self.cap.max_recv_sge.max(1) as usize {
            return Err(Error::TooLong);
        }
        let mut inner = self.inner.lock();
        if inner.state == QpState::Error {
            drop(inner);
            let flushed = wr.flushed(self.num);
            self.recv_cq.push([flushed]);
            return Ok(());
        }
        if inner.recvs.len() >= self.cap.max_recv_wr.max(1) as usize {
            return Err(Error::NoResource(Resource::WorkQueue));
        }
        inner.recvs.push_back(wr);
        Ok(())
    }

    fn reset(&self) -> Result<()> {
        let mut out = Out::default();
        {
            let mut inner = self.inner.lock();
            if inner.state == QpState::Connected {
                return Ok(());
            }
            self.stop(&mut inner, &mut out, None);
            inner.state = QpState::Connected;
        }
        self.deliver(out);
        Ok(())
    }

    fn posted_recvs(&self) -> u32 {
        self.inner.lock().recvs.len() as u32
    }

    fn local_addr(&self) -> Option<SocketAddrV4> {
        self.local
    }

    fn remote_addr(&self) -> Option<SocketAddrV4> {
        None
    }

    fn destroy(&self) {
        let mut out = Out::default();
        {
            let mut inner = self.inner.lock();
            self.stop(&mut inner, &mut out, None);
        }
        self.deliver(out);
    }

    fn post_send_ud(&self, wr: SendWr, ah: &Arc<dyn AddressHandle>, remote_qpn: u32) -> Result<()> {
        if !matches!(wr.op, SendOp::Send) {
            return Err(Error::Invalid);
        }
        if wr.sgl.len() > self.cap.max_send_sge.max(1) as usize {
            return Err(Error::TooLong);
        }
        let to = self.destination(ah, remote_qpn)?;
        self.send_to(&wr, to)
    }
}
