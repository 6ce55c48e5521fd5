//! What an IA keeps of its rdma_cm ids (`CmState`): what each id is for (its context is a
//! token: a listener, a request not yet accepted, a QP's connection, a datagram address
//! resolution), the requests and resolutions under way, and the connects' deadlines. cm.rs
//! acts on it; the IA's `Shared` holds it, beside the channel the ids are on.
//!
//! Plain data, below the QPs: a resolution keeps its QP as the trait object the core named it
//! by (cm.rs reads it back as ours), so that the IA's state names no QP.

use std::collections::HashMap;
use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::Instant;

use rdma_sys::rdma_cm_id;

use super::sys::Ptr;
use daplrs_backend::QueuePair;

#[derive(Default)]
pub(super) struct CmState {
    pub(super) owners: HashMap<u64, Owner>,
    pub(super) requests: HashMap<u64, Request>,
    pub(super) listeners: HashMap<u64, Ptr<rdma_cm_id>>,
    /// Connects with a timeout: qp_num -> when they give up.
    pub(super) deadlines: HashMap<u32, Instant>,
    /// The UDP port space ids of the listeners, by the listener's token.
    pub(super) ud_listeners: HashMap<u64, Ptr<rdma_cm_id>>,
    /// Datagram address resolutions under way, by token (also their id's context).
    pub(super) ud: HashMap<u64, UdResolution>,
}

/// What an id's token stands for (`CmState::owners`).
pub(super) enum Owner {
    Listener,
    Request,
    Qp(u32),
    /// A datagram address resolution (`CmState::ud`).
    Ud,
}

/// A connection request the consumer has not answered yet.
pub(super) struct Request {
    pub(super) id: Ptr<rdma_cm_id>,
    pub(super) listener: u64,
    /// What the requester offered: our accept may not ask for more.
    pub(super) responder_resources: u8,
    pub(super) initiator_depth: u8,
    /// A datagram QP's request: where it is.
    pub(super) ud: Option<UdRequester>,
}

/// Where a datagram QP that asked is, as its request's header says (cm.rs
/// `ud_request_data`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct UdRequester {
    pub(super) qpn: u32,
    pub(super) lid: u16,
    pub(super) gid: [u8; 16],
}

/// A datagram address resolution under way.
pub(super) struct UdResolution {
    pub(super) id: Ptr<rdma_cm_id>,
    /// The datagram QP it resolves for (a `VerbsQp`), kept until it ends.
    pub(super) qp: Arc<dyn QueuePair>,
    pub(super) remote: SocketAddrV4,
    pub(super) private_data: Vec<u8>,
    pub(super) deadline: Option<Instant>,
}
