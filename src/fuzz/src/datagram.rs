//! Datagram QPs under fuzzed datagrams: anyone who can reach a datagram QP's UDP port can send
//! it anything. Each input is a few datagrams (a little-endian u16 length, then that many
//! bytes, repeated), sent from a stranger's socket to a live QP with receives posted, then a
//! marker datagram of ours. Checked: no panic, no hang (the marker arrives), what is not one
//! of our datagrams is dropped, each one of ours fills exactly one receive with the GRH area
//! and its message, byte for byte, and the QP keeps working.

use std::net::{Ipv4Addr, UdpSocket};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::class_of;
use daplrs::backend::tcp::{wire, TcpDevice};
use daplrs::backend::{
    access, CompletionQueue, Device, MemoryRegion, QpCap, QpInit, QueuePair, RecvWr, Sge, WcStatus,
    GRH_LEN,
};

const SLOT: usize = 4096;
const SLOTS: usize = 16;
const MAX_DATAGRAMS: usize = 8;
const GUARD: Duration = Duration::from_secs(20);

/// A live datagram QP and a stranger's socket.
pub struct EngineDatagram {
    _dev: Arc<TcpDevice>,
    cq: Arc<dyn CompletionQueue>,
    notified: mpsc::Receiver<()>,
    qp: Arc<dyn QueuePair>,
    mem: Box<[u8]>,
    ptr: *mut u8,
    mr: Arc<dyn MemoryRegion>,
    stranger: UdpSocket,
    next_wr: u64,
    marker: u64,
}

// SAFETY: the buffer is plain memory, read only between inputs once every receive into it
// completed (the marker's completion comes after every earlier datagram's).
unsafe impl Send for EngineDatagram {}

impl Default for EngineDatagram {
    fn default() -> Self {
        Self::new()
    }
}

impl EngineDatagram {
    pub fn new() -> EngineDatagram {
        let dev = TcpDevice::open("127.0.0.1").expect("device");
        let pd = dev.alloc_pd().expect("pd");
        let cq = dev.create_cq(256).expect("cq");
        let (tx, notified) = mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        cq.set_notify(Some(Arc::new(move || {
            let _ = tx.lock().map(|tx| tx.send(()));
        })));
        let qp = dev
            .create_ud_qp(QpInit {
                pd: pd.clone(),
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                srq: None,
                cap: QpCap {
                    max_send_wr: 16,
                    max_recv_wr: SLOTS as u32 * 2,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_rd_atomic: 0,
                    max_inline: 0,
                },
            })
            .expect("datagram qp");
        let mut mem = vec![0u8; SLOT * SLOTS].into_boxed_slice();
        let ptr = mem.as_mut_ptr();
        let mr = pd
            .reg_mr(ptr as u64, mem.len() as u64, access::LOCAL_WRITE)
            .expect("mr");
        let stranger = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        EngineDatagram {
            _dev: dev,
            cq,
            notified,
            qp,
            mem,
            ptr,
            mr,
            stranger,
            next_wr: 0,
            marker: 0,
        }
    }

    /// Posts a receive into the slot its wr_id names.
    fn post(&mut self) {
        let wr_id = self.next_wr;
        self.next_wr += 1;
        let slot = (wr_id as usize) % SLOTS;
        self.qp
            .post_recv(RecvWr {
                wr_id,
                ctx: daplrs::backend::WrContext::NONE,
                sgl: vec![Sge {
                    addr: self.ptr as u64 + (slot * SLOT) as u64,
                    length: SLOT as u32,
                    lkey: self.mr.lkey(),
                }]
                .into(),
            })
            .expect("post recv");
    }

    fn slot(&self, wr_id: u64, len: usize) -> Vec<u8> {
        let off = (wr_id as usize % SLOTS) * SLOT;
        assert!(len <= SLOT && off + SLOT <= self.mem.len());
        let mut out = vec![0u8; len];
        // SAFETY: in bounds of our buffer; the receive into it has completed.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), out.as_mut_ptr(), len) };
        out
    }

    pub fn run(&mut self, data: &[u8]) -> u64 {
        // Receives for every datagram of the input and the marker, in fresh slots.
        let have = self.qp.posted_recvs() as usize;
        for _ in have..MAX_DATAGRAMS + 1 {
            self.post();
        }
        let port = self.qp.local_addr().expect("bound").port();
        let mut rest = data;
        let mut ours = Vec::new();
        while rest.len() >= 2 && ours.len() < MAX_DATAGRAMS {
            let n = (usize::from(u16::from_le_bytes([rest[0], rest[1]]))
                % (SLOT - GRH_LEN as usize))
                .min(rest.len() - 2);
            let d = &rest[2..2 + n];
            rest = &rest[2 + n..];
            if self
                .stranger
                .send_to(d, (Ipv4Addr::LOCALHOST, port))
                .is_err()
            {
                continue;
            }
            if let Some((_, msg)) = wire::ud_parse(d) {
                ours.push(msg.to_vec());
            }
        }
        self.marker += 1;
        let mut m = wire::ud_header(0).to_vec();
        m.extend_from_slice(b"marker");
        m.extend_from_slice(&self.marker.to_le_bytes());
        let marker_msg = m[wire::UD_HEADER_LEN..].to_vec();
        self.stranger
            .send_to(&m, (Ipv4Addr::LOCALHOST, port))
            .expect("send marker");
        ours.push(marker_msg);
        // Completions in order, one per datagram of ours, the marker last.
        let deadline = Instant::now() + GUARD;
        let mut got = 0;
        while got < ours.len() {
            let mut wcs = Vec::new();
            if self.cq.poll(1, &mut wcs) == 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                self.notified
                    .recv_timeout(left)
                    .expect("hang: a datagram (the marker) never completed");
                continue;
            }
            let wc = wcs.remove(0);
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            let want = &ours[got];
            assert_eq!(wc.byte_len as usize, GRH_LEN as usize + want.len());
            let placed = self.slot(wc.wr_id, wc.byte_len as usize);
            assert_eq!(
                &placed[GRH_LEN as usize..],
                &want[..],
                "datagram {got} placed wrong"
            );
            got += 1;
        }
        let mut wcs = Vec::new();
        assert_eq!(self.cq.poll(8, &mut wcs), 0, "extra completions: {wcs:?}");
        class_of((ours.len(), data.len().min(1)))
    }
}
