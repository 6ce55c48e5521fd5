//! Datagram address resolution over the handshake (`dgram`): a datagram
//! QP's request to a listener carries its endpoint's fabric address and QP
//! number, the answer the accepting QP's, then the TCP connection closes.
//! The same listener serves connections and datagram requests, as rdma_cm's
//! does over its two port spaces; the simplest mechanism there is, since
//! the entry's handshake already reaches every listener of a peer and
//! carries fields of any length (a datagram address is the provider's:
//! udp's a sockaddr_in, verbs' a GID and QP number).
//!
//! Request (`UD_REQUEST`): magic, the entry's provider, the datagram
//! provider, the endpoint's address, the QP number, the private data.
//! Answer: `UD_ACCEPT` (address, QP number, private data) or `REJECT` (our
//! header and the private data, as for a connection). A listener of a
//! device without datagrams, or of another datagram provider, closes the
//! connection: the requester's resolution fails, not by the peer.

use std::io::Write;
use std::net::{Shutdown, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use daplrs_backend::{CmEvent, Error, Result, UdPeer};

use super::{
    socket_error, start_connect, v4, Conn, Handshakes, Next, Phase, CONNECT_TIMEOUT, WAITING_MAX,
};
use crate::cm::{strip_header, with_header};
use crate::device::OfiDevice;
use crate::dgram::DgramQp;
use crate::wire::{frame, write_frame, ACCEPTING, MAGIC, REJECT, UD_ACCEPT, UD_REQUEST};

/// A datagram request read, not yet answered.
pub(crate) struct UdPending {
    stream: Arc<std::net::TcpStream>,
    /// The requesting endpoint's fabric address and QP number.
    name: Vec<u8>,
    qpn: u32,
}

fn qpn_of(field: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(field.try_into().ok()?))
}

impl OfiDevice {
    /// Starts resolving the datagram QP behind the listener at `remote` for
    /// `qp`; the outcome is said by the handshake thread.
    pub(crate) fn resolve_ud(
        &self,
        qp: &DgramQp,
        remote: SocketAddrV4,
        private_data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<u64> {
        let dg = self.dgram.as_ref().ok_or(Error::Unsupported)?;
        if daplrs_backend::QueuePair::state(qp) != daplrs_backend::QpState::Connected {
            return Err(Error::BadState);
        }
        let hs = self.handshakes()?;
        let (id, num) = (self.dom.next_id(), qp.num());
        let provider = self.target().provider;
        let qpn = num.to_le_bytes();
        let request = frame(
            UD_REQUEST,
            &[
                &MAGIC,
                provider.as_bytes(),
                dg.provider.as_bytes(),
                &qp.name,
                &qpn,
                private_data,
            ],
        );
        let stream = match start_connect(remote) {
            Ok(s) => s,
            Err(e) => {
                log::info!("datagram address resolution {id}: {e}");
                hs.emit_later(unresolved(num, id));
                return Ok(id);
            }
        };
        let until = timeout.map(|t| Instant::now() + t);
        hs.add(Conn {
            stream: Arc::new(stream),
            buf: Vec::new(),
            qp: None,
            generation: 0,
            deadline: Some(until.unwrap_or_else(|| Instant::now() + CONNECT_TIMEOUT)),
            phase: Phase::UdConnecting {
                request,
                until,
                id,
                qp: num,
            },
            watched: false,
        });
        Ok(id)
    }

    /// Answers datagram request `req` with `qp`'s address.
    pub(crate) fn accept_ud(&self, req: u64, qp: &DgramQp, private_data: &[u8]) -> Result<UdPeer> {
        let dg = self.dgram.as_ref().ok_or(Error::Unsupported)?;
        if daplrs_backend::QueuePair::state(qp) != daplrs_backend::QpState::Connected {
            return Err(Error::BadState);
        }
        let pending = self
            .tables
            .lock()
            .ud_requests
            .remove(&req)
            .ok_or(Error::BadState)?;
        let from = *v4(pending.stream.peer_addr()).ip();
        let peer = dg.peer(&pending.name, from, pending.qpn)?;
        let qpn = qp.num().to_le_bytes();
        // The requester gone by now: it learns nothing, we answer nobody.
        write_frame(&pending.stream, UD_ACCEPT, &[&qp.name, &qpn, private_data])
            .map_err(|_| Error::BadState)?;
        let _ = pending.stream.shutdown(Shutdown::Write);
        Ok(peer)
    }

    /// Refuses datagram request `req`; false if there is none.
    pub(crate) fn reject_ud(&self, req: u64, private_data: &[u8]) -> bool {
        let Some(pending) = self.tables.lock().ud_requests.remove(&req) else {
            return false;
        };
        let header = with_header(&self.dom, None, private_data);
        let _ = write_frame(&pending.stream, REJECT, &[&header]);
        let _ = pending.stream.shutdown(Shutdown::Write);
        true
    }
}

/// The event of a resolution that failed not by the peer.
fn unresolved(qp_num: u32, id: u64) -> CmEvent {
    CmEvent::UdFailed {
        qp_num,
        id,
        by_peer: false,
        private_data: Vec::new(),
    }
}

/// A datagram request read on a listener's connection: one of ours, for
/// this entry's provider and datagram provider, becomes a `UdRequest`.
pub(super) fn request(dev: &Arc<OfiDevice>, conn: &Conn, listener: u64, fields: Vec<Vec<u8>>) {
    let ours =
        fields.len() == 6 && fields[0] == MAGIC && fields[1] == dev.target().provider.as_bytes();
    let served = dev
        .dgram
        .as_ref()
        .is_some_and(|d| fields.get(2).is_some_and(|p| p == d.provider.as_bytes()));
    let Some(qpn) = fields
        .get(4)
        .and_then(|f| qpn_of(f))
        .filter(|_| ours && served)
    else {
        // Closed unanswered: the requester's resolution fails.
        return;
    };
    let stream = conn.stream.clone();
    let (remote, local) = (v4(stream.peer_addr()), v4(stream.local_addr()));
    let req = dev.dom.next_id();
    {
        let mut tables = dev.tables.lock();
        if tables.handshakes.len() + tables.ud_requests.len() >= WAITING_MAX {
            drop(tables);
            let _ = write_frame(&stream, REJECT, &[&with_header(&dev.dom, None, &[])]);
            return;
        }
        let name = fields[3].clone();
        tables
            .ud_requests
            .insert(req, UdPending { stream, name, qpn });
    }
    dev.emit(CmEvent::UdRequest {
        listener,
        req,
        private_data: fields[5].clone(),
        remote,
        local,
    });
}

/// The TCP connect of a resolution finished (or timed out): the request goes.
pub(super) fn connected(dev: &Arc<OfiDevice>, conn: &mut Conn, expired: bool) -> Next {
    let Phase::UdConnecting {
        request,
        until,
        id,
        qp,
    } = std::mem::replace(&mut conn.phase, Phase::Linked)
    else {
        return Next::Keep;
    };
    conn.phase = Phase::UdAwaitingAnswer { id, qp };
    let outcome = if expired {
        Err(std::io::Error::from_raw_os_error(libc::ETIMEDOUT))
    } else {
        socket_error(&conn.stream)
    };
    let _ = conn.stream.set_nonblocking(false);
    let _ = conn.stream.set_nodelay(true);
    if let Err(e) = outcome.and_then(|_| (&*conn.stream).write_all(&request)) {
        log::info!("datagram address resolution {id}: {e}");
        dev.emit(unresolved(qp, id));
        return Next::Drop;
    }
    conn.deadline = until;
    Next::Keep
}

/// The answer to a resolution's request.
pub(super) fn answer(dev: &Arc<OfiDevice>, conn: &mut Conn, kind: u8, f: Vec<Vec<u8>>) -> Next {
    let Phase::UdAwaitingAnswer { id, qp } = conn.phase else {
        return Next::Drop;
    };
    let event = match kind {
        ACCEPTING => return Next::Keep,
        UD_ACCEPT if f.len() == 3 => {
            let from = *v4(conn.stream.peer_addr()).ip();
            let peer = qpn_of(&f[1]).and_then(|qpn| {
                let dg = dev.dgram.as_ref()?;
                dg.peer(&f[0], from, qpn).ok()
            });
            match peer {
                Some(peer) => CmEvent::UdResolved {
                    qp_num: qp,
                    id,
                    peer,
                    private_data: f[2].clone(),
                },
                None => unresolved(qp, id),
            }
        }
        REJECT if f.len() == 1 => match strip_header(&f[0]) {
            Some((_, private_data)) => CmEvent::UdFailed {
                qp_num: qp,
                id,
                by_peer: true,
                private_data,
            },
            None => unresolved(qp, id),
        },
        _ => unresolved(qp, id),
    };
    dev.emit(event);
    Next::Drop
}

/// A resolution's connection ended, or its deadline passed, unanswered.
pub(super) fn unanswered(dev: &Arc<OfiDevice>, conn: &Conn) -> Next {
    if let Phase::UdAwaitingAnswer { id, qp } = conn.phase {
        dev.emit(unresolved(qp, id));
    }
    Next::Drop
}

impl Handshakes {
    /// Has the thread say `event` (a resolution that failed at once).
    fn emit_later(&self, event: CmEvent) {
        self.table.lock().emits.push(event);
        self.poke();
    }
}
