//! The events an EVD queues: what every object that reports something builds (EPs, service
//! points, the IA's async errors, a work completion's conversion), below the EVD itself.

use std::net::Ipv4Addr;
use std::sync::Arc;

use super::handle_table::Handle;

/// The payload of an event; handles are the values C sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventData {
    Dto {
        ep: Handle,
        cookie: u64,
        status: u32,
        transferred: u32,
        op: u32,
        rmr_context: u32,
        /// The IB extension's data of a DAT_IB_DTO_EVENT.
        ext: Option<DtoExt>,
    },
    RmrBind {
        rmr: Handle,
        cookie: u64,
        status: u32,
    },
    CrArrival {
        sp: Handle,
        local_addr: Ipv4Addr,
        conn_qual: u64,
        cr: Handle,
    },
    /// The private data stays owned by the EP (see `Ep::peer_private_data`) for as long as the
    /// ffi layer needs a stable pointer to it.
    Connection {
        ep: Handle,
        private_data: Arc<[u8]>,
    },
    /// A datagram EP's address resolution ended (DAT_IB_UD_CONNECTION_EVENT_ESTABLISHED,
    /// _REJECT_EVENT, _ERROR_EVENT; see `ep::ud`). The private data is owned by the
    /// resolution's record (`ext.cm`) until dat_ib_ud_cm_free.
    UdConnection {
        ep: Handle,
        private_data: Arc<[u8]>,
        ext: UdConnExt,
    },
    Async {
        handle: Handle,
        reason: u32,
    },
    Software {
        pointer: u64,
    },
}

/// What a datagram EP's connection event adds (DAT_IB_EXTENSION_EVENT_DATA): the extension
/// type, the remote address handle (DAT_IB_ADDR_HANDLE: our token for it, the remote QP
/// number and IA address) and the resolution's record (its `context`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdConnExt {
    /// DAT_IB_EXT_TYPE: DAT_IB_UD_REMOTE_AH, _PASSIVE_REMOTE_AH, _CONNECT_REJECT, _ERROR.
    pub kind: u32,
    /// The address handle's token (0: none, for a failure).
    pub ah: u64,
    pub qpn: u32,
    pub address: Option<Ipv4Addr>,
    /// The record's token, for dat_ib_ud_cm_free.
    pub cm: u64,
}

/// What a DAT_IB_DTO_EVENT adds to a DTO completion (DAT_IB_EXTENSION_EVENT_DATA).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DtoExt {
    /// DAT_IB_EXT_TYPE.
    pub kind: u32,
    /// The immediate data of a write-with-immediate, for the receive it consumed.
    pub imm: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub number: u32,
    pub evd: Handle,
    pub data: EventData,
}

/// Where a dequeue or a wait puts the event it returns (`Evd::dequeue_into`,
/// `Evd::wait_into`): once, where the drain makes it. The boundary's slot is the caller's
/// `DAT_EVENT`, so a completion becomes the C event with no `Event` kept in between (kept in
/// an `Option` and converted after the call, it was moved once more: 20 instructions a
/// blocking verbs read).
pub trait EventSlot {
    /// Takes the event the call returns: at most once, and only when the call succeeds.
    fn put(&mut self, event: Event);
    /// Whether `put` was called.
    fn is_filled(&self) -> bool;
}

impl EventSlot for Option<Event> {
    #[inline(always)]
    fn put(&mut self, event: Event) {
        *self = Some(event);
    }
    #[inline(always)]
    fn is_filled(&self) -> bool {
        self.is_some()
    }
}
