//! The queue pair (`TcpQp`): its calls run on the engine, and its same-host RDMA reads and
//! writes, and sends placed in the peer's receives, go through its lane (engine/lane.rs).

use std::net::SocketAddrV4;
use std::sync::Arc;

use daplrs_backend::{AddressHandle, QpState, QueuePair, RecvWr, SendWr};
use daplrs_backend::{Error, Result};

use crate::engine::{self, TcpAh};
use crate::shared::Shared;

pub(crate) struct TcpQp {
    qp_num: u32,
    shared: Arc<Shared>,
    /// Its same-host RDMA reads and writes and placed sends, without the engine
    /// (engine/lane.rs).
    lane: Arc<engine::Lane>,
}

impl TcpQp {
    pub(crate) fn new(qp_num: u32, shared: Arc<Shared>, lane: Arc<engine::Lane>) -> TcpQp {
        TcpQp {
            qp_num,
            shared,
            lane,
        }
    }
}

impl QueuePair for TcpQp {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn qp_num(&self) -> u32 {
        self.qp_num
    }
    fn state(&self) -> QpState {
        self.shared.run(|eng, _| eng.qp_state(self.qp_num))
    }
    fn post_send(&self, wr: &SendWr) -> Result<()> {
        if let Some(cq) = self.lane.post(&self.shared, wr) {
            cq.notify();
            return Ok(());
        }
        // The engine keeps the request until it completes.
        self.shared
            .run(|eng, sh| eng.post_send(sh, self.qp_num, wr.clone()))
    }
    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.shared
            .run(|eng, sh| eng.post_recv(sh, self.qp_num, wr))
    }
    fn reset(&self) -> Result<()> {
        self.shared.run(|eng, _| eng.reset_qp(self.qp_num))
    }
    fn posted_recvs(&self) -> u32 {
        self.shared.run(|eng, _| eng.posted_recvs(self.qp_num))
    }
    fn local_addr(&self) -> Option<SocketAddrV4> {
        self.shared.run(|eng, _| eng.qp_addrs(self.qp_num).0)
    }
    fn remote_addr(&self) -> Option<SocketAddrV4> {
        self.shared.run(|eng, _| eng.qp_addrs(self.qp_num).1)
    }
    fn destroy(&self) {
        self.shared.run(|eng, sh| eng.destroy_qp(sh, self.qp_num));
    }
    fn post_send_ud(&self, wr: SendWr, ah: &Arc<dyn AddressHandle>, remote_qpn: u32) -> Result<()> {
        // Our address handles only; the QP number of a datagram QP is its UDP port.
        let addr = ah
            .as_any()
            .downcast_ref::<TcpAh>()
            .map(|a| a.addr)
            .ok_or(Error::Foreign)?;
        let port = u16::try_from(remote_qpn).map_err(|_| Error::Foreign)?;
        let dest = SocketAddrV4::new(addr, port);
        self.shared
            .run(|eng, sh| eng.post_send_ud(sh, self.qp_num, wr, dest))
    }
}

impl Drop for TcpQp {
    fn drop(&mut self) {
        self.destroy();
    }
}
