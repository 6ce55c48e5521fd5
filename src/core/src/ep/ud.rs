//! Datagram EPs: the unreliable datagram service of the IB extension (an EP created with
//! service type DAT_IB_SERVICE_TYPE_UD). The backend moves datagrams and resolves addresses
//! (`Device::create_ud_qp`, `ud_resolve`, `ud_accept`, `QueuePair::post_send_ud`); the rules
//! are here.
//!
//! - States. A datagram EP is UNCONNECTED until its first address resolution completes, then
//!   CONNECTED, and stays so: its QP needs no connection, any number of resolutions may be
//!   made. dat_ep_disconnect (in CONNECTED) makes it DISCONNECTED (posted receives flushed,
//!   DAT_CONNECTION_EVENT_DISCONNECTED); dat_ep_reset makes it UNCONNECTED and ready again.
//!   A resolution ending on a DISCONNECTED (or freed) EP is dropped. No SRQ.
//! - dat_ep_connect (dat_ep_common_connect) to a service point resolves the address of the
//!   datagram EP its consumer accepts with: valid in UNCONNECTED and CONNECTED, any number at
//!   once, the connection EVD required; the state does not change. The outcome comes on the
//!   connection EVD: DAT_IB_UD_CONNECTION_EVENT_ESTABLISHED (extension type
//!   DAT_IB_UD_REMOTE_AH, the accepter's private data), or DAT_IB_UD_CONNECTION_REJECT_EVENT
//!   (the remote consumer rejected: DAT_IB_UD_CONNECT_REJECT, its private data) or
//!   DAT_IB_UD_CONNECTION_ERROR_EVENT (nobody listening, no route, no answer in time, a peer
//!   without datagrams: DAT_IB_UD_CONNECT_ERROR).
//! - The passive side sees DAT_IB_UD_CONNECTION_REQUEST_EVENT (DAT_IB_UD_CONNECT_REQUEST) on
//!   its PSP's CR EVD. dat_cr_accept with a datagram EP in UNCONNECTED or CONNECTED answers it
//!   and posts DAT_IB_UD_CONNECTION_EVENT_ESTABLISHED (DAT_IB_UD_PASSIVE_REMOTE_AH, the
//!   requester's private data) at once. A connection EP cannot accept it, nor a datagram EP a
//!   connection request: DAT_INVALID_HANDLE (DAT_INVALID_HANDLE_EP), as OFED's provider says.
//! - Every datagram connection event carries the remote address handle (DAT_IB_ADDR_HANDLE:
//!   `ah`, a token of ours, the remote QP number, the remote IA address; none for a failure)
//!   and, as `context`, the resolution's record, which owns the event's private data until
//!   dat_ib_ud_cm_free. dat_ib_ud_ah_free releases an address handle. Both name this EP's
//!   (else DAT_INVALID_PARAMETER); what is not freed is freed with the EP.
//! - dat_ib_post_send_ud sends one datagram of at most the transport MTU the IA reports
//!   (DAT_IB_TRANSPORT_MTU; more is DAT_LENGTH_ERROR) to QP `ah->qpn` behind `ah->ah`, in
//!   UNCONNECTED, CONNECTED or DISCONNECTED (flushed). It completes, unless suppressed, as a
//!   DAT_IB_DTO_EVENT (DAT_IB_DTO_SEND_UD, DAT_IB_UD_SEND) once the datagram has left.
//! - dat_ep_post_recv as for a connection EP. A datagram lands whole in the receive posted
//!   first, after a 40-byte GRH area; the completion is a DAT_IB_DTO_EVENT
//!   (DAT_IB_DTO_RECV_UD, DAT_IB_UD_RECV) whose transfered_length counts the 40 bytes. A
//!   datagram that finds no receive is dropped and counted (the IA counter
//!   DCNT_IA_DIAG_ERR_RQ_UDSDPRD, where the backend can count it). Nothing says a datagram
//!   arrived, or in which order.
//! - A failed datagram request (above all a datagram larger than the receive it lands in,
//!   DAT_DTO_ERR_LOCAL_LENGTH) stops the EP, as an InfiniBand UD QP goes to its error state:
//!   everything else posted is flushed, the connection EVD gets DAT_CONNECTION_EVENT_BROKEN,
//!   the EP is DISCONNECTED until dat_ep_reset.
//! - dat_ep_post_send, RDMA reads and writes, atomics, write-with-immediate and RMR binds need
//!   a connection: DAT_INVALID_PARAMETER for the EP argument (`check_request_state`).

use std::collections::HashMap;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::super::consts::{completion_flags, dto_op, ib_ext, mem_priv};
use super::super::counters;
use super::super::error::{from_backend, DatError, DatResult, Param, SubType};
use super::super::evd::{Event, EventData, UdConnExt};
use super::super::pending::PendingDto;
use super::EpState;
use super::{state_error, Ep};
use daplrs_backend::{AddressHandle, QueuePair, SendOp, SendWr, Sge, UdPeer, WrContext};

/// Tokens of address handles ("AH") and resolution records ("CM") as C sees them: opaque,
/// never NULL, never a valid pointer of the consumer's, unique for the life of the process.
const AH_TAG: u64 = 0x4148 << 32;
const CM_TAG: u64 = 0x434d << 32;

fn token(tag: u64) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    tag | (NEXT.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff)
}

/// A datagram EP's address handles and resolution records, by token.
#[derive(Default)]
pub(crate) struct UdTables {
    ahs: HashMap<u64, Arc<dyn AddressHandle>>,
    /// Each record owns the private data its event points to.
    cms: HashMap<u64, Arc<[u8]>>,
}

impl UdTables {
    pub(super) fn clear(&mut self) {
        self.ahs.clear();
        self.cms.clear();
    }
}

/// The operation and extension type a receive of an EP of `service_type` completes with.
pub(super) fn recv_kind(service_type: u32) -> (u32, Option<u32>) {
    if service_type == ib_ext::SERVICE_TYPE_UD {
        (ib_ext::DTO_RECV_UD, Some(ib_ext::TYPE_UD_RECV))
    } else {
        (dto_op::RECEIVE, None)
    }
}

impl Ep {
    /// Whether this is a datagram EP.
    pub fn is_ud(&self) -> bool {
        self.inner.lock().attr.service_type == ib_ext::SERVICE_TYPE_UD
    }

    /// The QP of a datagram EP that may resolve an address now (UNCONNECTED or CONNECTED,
    /// with a connection EVD).
    fn ud_ready_qp(&self) -> DatResult<Arc<dyn QueuePair>> {
        let i = self.inner.lock();
        match i.state {
            EpState::Unconnected | EpState::Connected => {}
            s => return Err(state_error(s)),
        }
        if i.connect_evd.is_none() {
            return Err(DatError::invalid_handle(SubType::InvalidHandleEvdConn));
        }
        i.qp.clone()
            .ok_or(DatError::invalid_state(SubType::EpUnconfigured))
    }

    /// dat_ep_connect of a datagram EP: starts resolving the address of `remote`'s datagram EP.
    pub(super) fn ud_connect(
        &self,
        remote: SocketAddrV4,
        timeout_us: u32,
        private_data: &[u8],
    ) -> DatResult<()> {
        let qp = self.ud_ready_qp()?;
        let timeout = if timeout_us == super::super::consts::TIMEOUT_INFINITE {
            None
        } else {
            Some(Duration::from_micros(u64::from(timeout_us)))
        };
        self.ia
            .device()
            .ud_resolve(&qp, remote, private_data, timeout)?;
        Ok(())
    }

    /// dat_cr_accept's part on a datagram EP: the QP to answer with.
    pub(crate) fn begin_ud_accept(&self) -> DatResult<Arc<dyn QueuePair>> {
        self.ud_ready_qp()
    }

    /// Posts a datagram connection event with a new record owning `private_data`.
    fn post_ud_event(&self, number: u32, private_data: Vec<u8>, mut ext: UdConnExt) {
        let evd = {
            let i = self.inner.lock();
            match i.state {
                EpState::Unconnected | EpState::Connected => {}
                _ => return,
            }
            i.connect_evd.clone()
        };
        let Some(evd) = evd else { return };
        let private_data: Arc<[u8]> = Arc::from(private_data);
        ext.cm = token(CM_TAG);
        self.ud.lock().cms.insert(ext.cm, private_data.clone());
        evd.push_provider(Event {
            number,
            evd: evd.handle(),
            data: EventData::UdConnection {
                ep: self.handle,
                private_data,
                ext,
            },
        });
    }

    /// An address resolution completed: datagrams to the remote EP go to `peer`. `passive`:
    /// we accepted (the private data is the requester's), else we asked (the accepter's).
    pub(crate) fn on_ud_resolved(&self, peer: UdPeer, private_data: Vec<u8>, passive: bool) {
        {
            let mut i = self.inner.lock();
            match i.state {
                EpState::Unconnected => i.state = EpState::Connected,
                EpState::Connected => {}
                _ => return,
            }
        }
        let ah = token(AH_TAG);
        let address = peer.ah.address();
        self.ud.lock().ahs.insert(ah, peer.ah);
        self.post_ud_event(
            ib_ext::UD_CONNECTION_EVENT_ESTABLISHED,
            private_data,
            UdConnExt {
                kind: if passive {
                    ib_ext::TYPE_UD_PASSIVE_REMOTE_AH
                } else {
                    ib_ext::TYPE_UD_REMOTE_AH
                },
                ah,
                qpn: peer.qpn,
                address: Some(address),
                cm: 0,
            },
        );
    }

    /// An address resolution failed: rejected by the remote consumer (`by_peer`) or not
    /// answered at all.
    pub(crate) fn on_ud_failed(&self, by_peer: bool, private_data: Vec<u8>) {
        let (number, kind) = if by_peer {
            (
                ib_ext::UD_CONNECTION_REJECT_EVENT,
                ib_ext::TYPE_UD_CONNECT_REJECT,
            )
        } else {
            (
                ib_ext::UD_CONNECTION_ERROR_EVENT,
                ib_ext::TYPE_UD_CONNECT_ERROR,
            )
        };
        self.post_ud_event(
            number,
            private_data,
            UdConnExt {
                kind,
                ah: 0,
                qpn: 0,
                address: None,
                cm: 0,
            },
        );
    }

    /// The datagram QP stopped: DISCONNECTED, and `number` (DISCONNECTED after
    /// dat_ep_disconnect, BROKEN after a failed request) on the connection EVD.
    pub(crate) fn on_ud_stopped(&self, number: u32) {
        let evd = {
            let mut i = self.inner.lock();
            match i.state {
                EpState::Unconnected | EpState::Connected | EpState::DisconnectPending => {}
                _ => return,
            }
            i.state = EpState::Disconnected;
            i.connect_evd.clone()
        };
        self.post_connection_event(evd, number, Arc::from(Vec::new()));
    }

    /// dat_ib_post_send_ud: one datagram to QP `qpn` behind this EP's address handle `ah`.
    pub fn post_send_ud(
        &self,
        iov: &[Sge],
        ah: u64,
        qpn: u32,
        cookie: u64,
        flags: u32,
    ) -> DatResult<()> {
        let known = completion_flags::SUPPRESS
            | completion_flags::SOLICITED_WAIT
            | completion_flags::UNSIGNALLED
            | completion_flags::BARRIER_FENCE
            | completion_flags::EVD_THRESHOLD;
        if flags & !known != 0 {
            return Err(DatError::bad(Param::CompletionFlags));
        }
        let (state, attr, pz, qp) = {
            let i = self.inner.lock();
            (i.state, i.attr, i.pz.clone(), i.qp.clone())
        };
        if attr.service_type != ib_ext::SERVICE_TYPE_UD {
            return Err(DatError::bad(Param::EpHandle));
        }
        self.check_request_flags(flags)?;
        match state {
            EpState::Unconnected | EpState::Connected | EpState::Disconnected => {}
            s => return Err(state_error(s)),
        }
        let pz = pz.ok_or(DatError::invalid_state(SubType::EpUnconfigured))?;
        let qp = qp.ok_or(DatError::invalid_state(SubType::EpUnconfigured))?;
        if iov.len() > attr.max_request_iov as usize {
            return Err(DatError::bad(Param::NumSegments));
        }
        let ah = self
            .ud
            .lock()
            .ahs
            .get(&ah)
            .cloned()
            .ok_or(DatError::bad(Param::AddressHandle))?;
        let (sgl, total) =
            self.ia
                .lmrs
                .check_iov(Arc::as_ptr(&pz) as usize, iov, mem_priv::LOCAL_READ)?;
        if total > u64::from(self.ia.device().attr().mtu) {
            return Err(DatError::length());
        }
        let report = Self::report_success(flags);
        let wr_id = self.ia.track(
            self.handle,
            PendingDto {
                ep: self.handle,
                cookie,
                op: ib_ext::DTO_SEND_UD,
                report_success: report,
                rmr: None,
                ext: Some(ib_ext::TYPE_UD_SEND),
            },
        )?;
        let wr = SendWr {
            wr_id,
            ctx: WrContext::NONE,
            op: SendOp::Send,
            sgl,
            signaled: report,
            solicited: flags & completion_flags::SOLICITED_WAIT != 0,
            fence: false,
        };
        if let Err(e) = qp.post_send_ud(wr, &ah, qpn) {
            self.ia.untrack(wr_id);
            // What the backend refuses is the IOV's segments.
            return Err(from_backend(e, Some(Param::NumSegments)));
        }
        self.count_post(counters::ep::POST_SEND_UD, total);
        Ok(())
    }

    /// dat_ib_ud_ah_free: releases an address handle a connection event of this EP handed
    /// out.
    pub fn ud_ah_free(&self, ah: u64) -> DatResult<()> {
        self.ud
            .lock()
            .ahs
            .remove(&ah)
            .map(|_| ())
            .ok_or(DatError::bad(Param::AddressHandle))
    }

    /// dat_ib_ud_cm_free: releases the record of a resolution (the `context` of its event),
    /// and with it the event's private data.
    pub fn ud_cm_free(&self, cm: u64) -> DatResult<()> {
        self.ud
            .lock()
            .cms
            .remove(&cm)
            .map(|_| ())
            .ok_or(DatError::bad(Param::UdCm))
    }
}
