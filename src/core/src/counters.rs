//! Operation counters of the IB extension (dat_query_counters / dat_print_counters): one array
//! per IA, EP and EVD, indexed as OFED's DCNT_IA_*, DCNT_EP_* and DCNT_EVD_* enums number them,
//! so `dat_query_counters(handle, DCNT_*_ALL_COUNTERS, array, reset)` copies ours as they are.
//! Counters we do not keep stay 0. Relaxed atomics: they are statistics, not synchronisation.

use std::sync::atomic::{AtomicU64, Ordering};

pub struct Counters(Box<[AtomicU64]>);

impl Counters {
    pub fn new(len: usize) -> Counters {
        Counters((0..len).map(|_| AtomicU64::new(0)).collect())
    }

    pub fn inc(&self, index: usize) {
        self.add(index, 1);
    }

    pub fn add(&self, index: usize, n: u64) {
        if let Some(c) = self.0.get(index) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The counter values; with `reset`, each is zeroed as it is read.
    pub fn snapshot(&self, reset: bool) -> Vec<u64> {
        self.0
            .iter()
            .map(|c| {
                if reset {
                    c.swap(0, Ordering::Relaxed)
                } else {
                    c.load(Ordering::Relaxed)
                }
            })
            .collect()
    }
}

/// DCNT_IA_* indices (the ones we count) and the array length.
pub mod ia {
    pub const PZ_CREATE: usize = 0;
    pub const PZ_FREE: usize = 1;
    pub const LMR_CREATE: usize = 2;
    pub const LMR_FREE: usize = 3;
    pub const RMR_CREATE: usize = 4;
    pub const RMR_FREE: usize = 5;
    pub const PSP_CREATE: usize = 6;
    pub const PSP_FREE: usize = 8;
    pub const RSP_CREATE: usize = 9;
    pub const RSP_FREE: usize = 10;
    pub const EVD_CREATE: usize = 11;
    pub const EVD_FREE: usize = 12;
    pub const EP_CREATE: usize = 13;
    pub const EP_FREE: usize = 14;
    pub const SRQ_CREATE: usize = 15;
    pub const SRQ_FREE: usize = 16;
    pub const SP_CR: usize = 17;
    pub const SP_CR_ACCEPTED: usize = 18;
    pub const SP_CR_REJECTED: usize = 19;
    pub const ASYNC_ERROR: usize = 23;
    /// Datagrams dropped on arrival for lack of a posted receive (the device's count).
    pub const DIAG_ERR_RQ_UDSDPRD: usize = 79;
    pub const ALL: usize = 85;
}

/// DCNT_EP_* indices and the array length.
pub mod ep {
    pub const CONNECT: usize = 0;
    pub const DISCONNECT: usize = 1;
    pub const POST_SEND: usize = 2;
    pub const POST_SEND_DATA: usize = 3;
    pub const POST_SEND_UD: usize = 4;
    pub const POST_RECV: usize = 6;
    pub const POST_RECV_DATA: usize = 7;
    pub const POST_WRITE: usize = 8;
    pub const POST_WRITE_DATA: usize = 9;
    pub const POST_WRITE_IMM: usize = 10;
    pub const POST_WRITE_IMM_DATA: usize = 11;
    pub const POST_READ: usize = 12;
    pub const POST_READ_DATA: usize = 13;
    pub const POST_CMP_SWAP: usize = 14;
    pub const POST_FETCH_ADD: usize = 15;
    pub const RECV: usize = 16;
    pub const RECV_DATA: usize = 17;
    pub const RECV_UD: usize = 18;
    pub const RECV_RDMA_IMM: usize = 22;
    pub const RECV_RDMA_IMM_DATA: usize = 23;
    pub const ALL: usize = 24;
}

/// DCNT_EVD_* indices and the array length.
pub mod evd {
    pub const WAIT: usize = 0;
    pub const WAIT_BLOCKED: usize = 1;
    /// Not counted itself: read as DEQUEUE_FOUND + DEQUEUE_NOT_FOUND (`ext::query_counters`).
    pub const DEQUEUE: usize = 3;
    pub const DEQUEUE_FOUND: usize = 4;
    pub const DEQUEUE_NOT_FOUND: usize = 5;
    pub const ALL: usize = 10;
}
