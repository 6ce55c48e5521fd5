//! Why a backend operation failed, in verbs and transport terms.
//!
//! A backend knows devices, queue pairs, memory keys and sockets; it does not know which DAT
//! call it is serving, which argument of it a refused input came from, or which DAT_RETURN
//! the consumer should see. The core maps an `Error` to the DAT code in one function (its
//! `error::from_backend`), naming the argument where the call has one a backend may refuse.

use std::fmt;

/// What a backend ran out of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    /// Memory and kernel objects behind a CQ or a device's channels (verbs: ibv_create_cq,
    /// ibv_resize_cq refused; the TCP device's wake-up socket pair).
    Memory,
    /// The device itself: its channels, its progress thread, its connection manager ids.
    Device,
    /// A queue pair or room in one (verbs: ibv_create_qp, ibv_modify_qp, ibv_post_send
    /// refused; the TCP backend's datagram socket).
    Qp,
    /// A shared receive queue or room in one.
    Srq,
    /// A protection domain (ibv_alloc_pd refused).
    Pd,
    /// Memory keys: for a region or a window.
    Key,
    /// Room in a QP's send or receive queue of the TCP backend (grown as work is posted, up
    /// to the depth asked).
    WorkQueue,
    /// The host's threads and sockets (a helper thread that makes a TCP connection, a
    /// listening socket).
    Host,
}

/// A backend operation's failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Error {
    /// Out of resources of a kind.
    NoResource(Resource),
    /// No such device, or not usable (no such port, port not active, no context).
    NoDevice,
    /// The object is not in a state for this: a QP not idle for connect or accept, not
    /// connected for a datagram answer, a connection request already gone.
    BadState,
    /// A send on a QP that is not connected (verbs: not in RTS).
    NotConnected,
    /// More scatter-gather entries than the queue takes.
    TooLong,
    /// An object or number this device does not know: a CQ, SRQ or address handle of
    /// another device, a remote QP number out of range.
    Foreign,
    /// A request the QP cannot take: an SRQ for a datagram QP, an operation other than a
    /// send on a datagram QP.
    Invalid,
    /// Memory that is not there or not accessible as asked (EFAULT), or a range that is
    /// empty or wraps.
    BadAddress,
    /// The device does not do this at all (no memory windows, no datagram QPs).
    Unsupported,
    /// The local address or port is in use (EADDRINUSE).
    AddrInUse,
    /// The backend's own failure: a socket option refused, an object not its own.
    Internal,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoResource(r) => write!(f, "out of resources: {r:?}"),
            Error::NoDevice => write!(f, "no such device"),
            Error::BadState => write!(f, "not in a state for this"),
            Error::NotConnected => write!(f, "queue pair not connected"),
            Error::TooLong => write!(f, "more entries than the queue takes"),
            Error::Foreign => write!(f, "object of another device"),
            Error::Invalid => write!(f, "request the queue pair cannot take"),
            Error::BadAddress => write!(f, "bad address"),
            Error::Unsupported => write!(f, "not supported by the device"),
            Error::AddrInUse => write!(f, "address in use"),
            Error::Internal => write!(f, "backend internal error"),
        }
    }
}

impl std::error::Error for Error {}
