//! A QP's endpoint and connection: opened (its own endpoint, or a port's),
//! its peer inserted, its handshake link kept, and closed again (abandon,
//! destroy, a graceful disconnect that lets what was posted complete).

use super::*;

impl OfiQp {
    /// Opens the endpoint from `info` (the device's for an active side, the
    /// request's for a passive one), binds the device's EQ and the QP's CQs,
    /// enables it and posts the receives waiting for it.
    pub(crate) fn open_endpoint(
        self: &Arc<Self>,
        dev: &Domain,
        info: &Info,
        passive: bool,
    ) -> Result<()> {
        // Bound to its CQs, an endpoint is progressed by their reads: not
        // before it is enabled (ofi_rxm's opens its own CQ then).
        let asked = std::time::Instant::now();
        let _opening = dev.closing.lock();
        let locked = asked.elapsed();
        let mut inner = self.inner.lock();
        if inner.state != QpState::Init || inner.ep.is_some() || inner.port.is_some() {
            return Err(Error::BadState);
        }
        self.farewell.arm(dev)?;
        self.farewell_done.store(false, Ordering::Release);
        self.leaving.store(false, Ordering::Release);
        let conn = dev.next_conn();
        self.conn.store(conn, Ordering::Release);
        if dev.rdm {
            let key = if self.srq.is_some() {
                PortKey::Own { qp: self.num }
            } else {
                PortKey::Shared {
                    send_cq: daplrs_backend::CompletionQueue::id(&*self.send_cq),
                    recv_cq: daplrs_backend::CompletionQueue::id(&*self.recv_cq),
                    passive,
                }
            };
            let registry = self.registry.upgrade().ok_or(Error::NoDevice)?;
            let port = registry
                .ports
                .attach(dev, key, &self.send_cq, &self.recv_cq)?;
            log::debug!(
                "QP {}: port {key:?} (lock {locked:?}, {:?})",
                self.num,
                asked.elapsed()
            );
            inner.port = Some(port);
            // The tag's low 32 bits name the connection (`eager`).
            let direct = !dev.eager || self.srq.is_some();
            inner.tag = conn as u64 | if direct { DIRECT } else { 0 };
            inner.peer_tag = 0;
            inner.arrived.clear();
            inner.announced = None;
            inner.rx_cap = (self.cap.max_recv_wr.max(1) as usize).min(self.depths.0);
        } else {
            self.open_own(dev, info, &mut inner, locked, asked)?;
        }
        if let Some(r) = self.registry.upgrade() {
            r.bind_conn(conn, self.me.clone());
        }
        inner.state = QpState::Connecting;
        inner.recvs_given = 0;
        inner.sends_given = 0;
        inner.segmented = None;
        inner.messages = 0;
        inner.received = 0;
        inner.receipts_over = false;
        inner.sends.received = 0;
        if let Some(srq) = self.pooled_srq() {
            srq.enroll(self.num, self);
            // Any not posted now are retried (`post_bounces`).
            let _ = self.post_bounces(dev, srq, &mut inner);
            return Ok(());
        }
        self.feed_recvs(&mut inner)
    }

    /// Opens a connected endpoint of the QP's own (FI_EP_MSG) from `info`,
    /// bound to the device's EQ and the QP's CQs, and enabled.
    pub(super) fn open_own(
        self: &Arc<Self>,
        dev: &Domain,
        info: &Info,
        inner: &mut Inner,
        locked: std::time::Duration,
        asked: std::time::Instant,
    ) -> Result<()> {
        let mut ep = null_mut();
        // SAFETY: an open domain and a provider fi_info; `ep` receives the endpoint.
        let rc = unsafe { fi::fi_endpoint(dev.domain.ptr(), info.ptr(), &mut ep, null_mut()) };
        opened(rc, "fi_endpoint", Error::NoResource(Resource::Qp))?;
        let ep = Fid(ep);
        // Connection events come on the EQ.
        opened(
            // SAFETY: the endpoint just opened; the EQ is an open object of its fabric.
            unsafe { fi::fi_ep_bind(ep.ptr(), dev.eq.fid(), 0) },
            "bind EQ",
            Error::Internal,
        )?;
        let feeds = self.bind_cqs(dev, &ep)?;
        // SAFETY: the endpoint, bound to its EQ and CQs.
        let enable = || unsafe { fi::fi_enable(ep.ptr()) };
        let mut rc = enable();
        if rc == -(fi::FI_EBUSY as i32) {
            // shm names an endpoint's memory "<pid>:<uid>:<index>" and
            // refuses a file of that name whose recorded pid is alive, then
            // removes it. A killed process leaves its files behind, and once
            // pids wrap the live pid is ours: the second try creates it anew.
            rc = enable();
        }
        opened(rc, "fi_enable", Error::NoResource(Resource::Qp))?;
        log::debug!(
            "QP {}: endpoint lock {locked:?}, opened in {:?}",
            self.num,
            asked.elapsed()
        );
        if let Some(r) = self.registry.upgrade() {
            r.bind_ep(ep.ptr() as usize, self.num);
        }
        inner.ep = Some(ep);
        inner.feeds = feeds;
        inner.rx_cap = self.depths.0;
        Ok(())
    }

    /// Binds the endpoint to fid_cqs of its own that the QP's CQs read
    /// (`ready`): one for its requests and receives when both CQs are one,
    /// else one each; with an SRQ of the provider's, its shared context and
    /// a fid_cq for its receives (see `srq`).
    pub(super) fn bind_cqs(self: &Arc<Self>, dev: &Domain, ep: &Fid<fi::fid_ep>) -> Result<Feeds> {
        let srx = self.srq.as_ref().and_then(|srq| srq.srx());
        let same = srx.is_none() && Arc::ptr_eq(&self.send_cq, &self.recv_cq);
        let bind = |fid: *mut fi::fid, flags: u64| {
            // SAFETY: the endpoint just opened; `fid` an open object of its domain.
            opened(
                unsafe { fi::fi_ep_bind(ep.ptr(), fid, flags) },
                "bind CQ",
                Error::Internal,
            )
        };
        let tx_flags = fi::FI_TRANSMIT as u64 | if same { fi::FI_RECV as u64 } else { 0 };
        let tx = self.send_cq.seat(dev, None)?;
        bind(tx.cq().fid(), tx_flags)?;
        if same {
            return Ok(Feeds {
                tx: Some(tx),
                rx: None,
            });
        }
        let own = srx.is_some().then(|| {
            let own: Arc<dyn Any + Send + Sync> = self.clone();
            own
        });
        let rx = self.recv_cq.seat(dev, own)?;
        if let Some(srx) = srx {
            bind(srx.fid(), 0)?;
        }
        bind(rx.cq().fid(), fi::FI_RECV as u64)?;
        Ok(Feeds {
            tx: Some(tx),
            rx: Some(rx),
        })
    }

    /// The endpoint's fabric address (`fi_getname`), for the peer's AV.
    pub(crate) fn fabric_name(&self) -> Result<Vec<u8>> {
        let inner = self.inner.lock();
        let port = inner.port.as_ref().ok_or(Error::BadState)?;
        Ok(port.name().to_vec())
    }

    /// Inserts the peer endpoint's fabric address (`name`) into the
    /// endpoint's AV: sends go there.
    /// `name` came from the peer's handshake: its shape is checked against
    /// our own endpoint's name before the provider reads it.
    pub(crate) fn insert_peer(&self, name: &[u8]) -> Result<()> {
        let dev = self.dev.upgrade().ok_or(Error::BadState)?;
        let parks = dev.parks;
        // SAFETY: the device's fi_info.
        let string_format = unsafe { (*dev.info.ptr()).addr_format } == fi::FI_ADDR_STR;
        drop(dev);
        let own = self.fabric_name()?;
        if !peer_name_fits(&own, string_format, name) {
            log::warn!(
                "a peer's fabric address of {} bytes is not of this provider's shape ({} bytes{}): refused",
                name.len(),
                own.len(),
                if string_format { ", a string" } else { "" }
            );
            return Err(Error::NoResource(Resource::Qp));
        }
        let mut inner = self.inner.lock();
        if !inner.dest_name.is_empty() {
            return Err(Error::BadState);
        }
        let port = inner.port.clone().ok_or(Error::BadState)?;
        inner.dest = port.insert(name, parks)?;
        inner.dest_name = name.to_vec();
        Ok(())
    }

    /// Keeps the handshake's connection for a connection being made; returns
    /// its number (Err: this side gave up meanwhile).
    pub(crate) fn attach_link(&self, stream: &std::net::TcpStream) -> Result<u64> {
        let inner = self.inner.lock();
        if inner.state != QpState::Connecting || self.is_leaving() {
            return Err(Error::BadState);
        }
        let stream = stream
            .try_clone()
            .map_err(|_| Error::NoResource(Resource::Host))?;
        let generation = self.links.fetch_add(1, Ordering::AcqRel) + 1;
        *self.link.lock() = Some(crate::wire::Link {
            stream: Arc::new(stream),
            generation,
        });
        Ok(generation)
    }

    /// Whether the QP's connection is still the one numbered `generation`.
    pub(crate) fn is_link(&self, generation: u64) -> bool {
        self.link
            .lock()
            .as_ref()
            .is_some_and(|l| l.generation == generation)
    }

    pub(crate) fn disconnect(&self, abrupt: bool) {
        self.leaving.store(true, Ordering::Release);
        // Graceful: the requests posted complete first (the farewell's
        // completion may come before theirs, and the close would flush them).
        if !abrupt {
            self.drain_requests();
        }
        if self.link.lock().is_some() {
            self.end_link(true);
        } else {
            self.say_farewell();
        }
        let ep = self.endpoint();
        if let Some(ep) = ep {
            // SAFETY: the QP's open endpoint (connected: a port is shared).
            let rc = unsafe { fi::fi_shutdown(ep, 0) };
            if rc != 0 && !abrupt {
                log::debug!("fi_shutdown: {}", fi::strerror(rc));
            }
        }
        if self.end() {
            if let Some(dev) = self.dev.upgrade() {
                dev.emit(daplrs_backend::CmEvent::Disconnected { qp_num: self.num });
            }
        }
    }

    /// A graceful disconnect: the requests posted complete first (while the
    /// connection lives, bounded by DRAIN_LIMIT), so that they are not
    /// flushed by the close and the peer has what we sent before it learns
    /// of it.
    pub(super) fn drain_requests(&self) {
        let deadline = std::time::Instant::now() + DRAIN_LIMIT;
        loop {
            {
                let inner = self.inner.lock();
                // A connection that ended or broke flushes what is left.
                if inner.sends.slots.is_empty() || inner.ended || inner.broke {
                    return;
                }
            }
            if std::time::Instant::now() >= deadline {
                log::warn!(
                    "QP {}: graceful disconnect: requests still outstanding after {DRAIN_LIMIT:?}",
                    self.num
                );
                return;
            }
            self.send_cq.reap_and_notify();
            std::thread::yield_now();
        }
    }

    /// Writes our farewell into the peer's word and waits (bounded) for its
    /// delivery, so that the peer reports a disconnection, not a broken
    /// connection (see `farewell`).
    pub(super) fn say_farewell(&self) {
        let (ep, peer) = {
            let inner = self.inner.lock();
            match (&inner.ep, inner.state) {
                (Some(ep), QpState::Connected) => (ep.ptr(), inner.peer),
                _ => return,
            }
        };
        if !self.farewell.send(ep, &peer, self.context(FAREWELL_TOKEN)) {
            log::debug!("QP {}: no farewell to send", self.num);
            return;
        }
        let deadline = std::time::Instant::now() + FAREWELL_TIMEOUT;
        while !self.farewell_done.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
            self.send_cq.reap_and_notify();
            std::thread::yield_now();
        }
        log::debug!(
            "QP {}: farewell delivered: {}",
            self.num,
            self.farewell_done.load(Ordering::Acquire)
        );
    }

    /// A connect or accept failed after the endpoint opened, before anything
    /// went to the peer: the endpoint closes and the QP is as before (Init).
    /// Receives the endpoint held are flushed (not kept: the provider had
    /// them), so that none is lost silently.
    pub(crate) fn abandon(&self) {
        self.end_link(false);
        self.end();
        self.inner.lock().ended = false;
        let dev = self.dev.upgrade();
        let _closing = dev.as_ref().map(|d| d.closing.lock());
        let feeds = {
            let mut inner = self.inner.lock();
            close_endpoint(
                &self.dev,
                &self.registry,
                &mut inner,
                self.conn.load(Ordering::Acquire),
            );
            inner.state = QpState::Init;
            std::mem::take(&mut inner.feeds)
        };
        drop(feeds);
    }

    pub(crate) fn destroy_now(&self) {
        self.end_link(false);
        self.end();
        let dev = self.dev.upgrade();
        let _closing = dev.as_ref().map(|d| d.closing.lock());
        let feeds = {
            let mut inner = self.inner.lock();
            close_endpoint(
                &self.dev,
                &self.registry,
                &mut inner,
                self.conn.load(Ordering::Acquire),
            );
            std::mem::take(&mut inner.feeds)
        };
        // The endpoint closed first: its CQs may close now.
        drop(feeds);
    }

    /// Reads the QP's CQs (what the provider completed before an event).
    pub(crate) fn reap_completions(&self) {
        self.send_cq.reap_and_notify();
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.recv_cq.reap_and_notify();
        }
    }
}

/// Whether a peer's fabric address, as its handshake carried it, has the
/// shape of `own` (one of our endpoints' names on the same provider):
/// `fi_av_insert` reads as many bytes as the provider's addresses have, or a
/// string format up to its NUL, and trusts them, so a short name from a
/// broken or hostile peer would be read past its end.
fn peer_name_fits(own: &[u8], string_format: bool, name: &[u8]) -> bool {
    if string_format {
        name.contains(&0)
    } else {
        name.len() == own.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_name_must_have_the_shape_of_ours() {
        let own = [7u8; 16];
        assert!(peer_name_fits(&own, false, &[1u8; 16]));
        assert!(!peer_name_fits(&own, false, &[1u8; 3]));
        assert!(!peer_name_fits(&own, false, &[1u8; 17]));
        assert!(!peer_name_fits(&own, false, &[]));
        assert!(peer_name_fits(b"fi_shm://1\0", true, b"fi_shm://22\0"));
        assert!(!peer_name_fits(b"fi_shm://1\0", true, b"no terminator"));
    }
}
