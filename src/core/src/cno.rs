//! CNO: a notification object several EVDs can share. A trigger wakes `wait`, marks a pollable
//! fd readable (one end of a socket pair, so no unsafe is needed), and calls the OS wait proxy
//! agent the ffi layer installed, if any.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::consts::TIMEOUT_INFINITE;
use super::error::{DatError, DatResult, SubType};
use super::handle_table::{self, Handle, HandleKind};
use super::ia::Ia;
use super::use_count::UseCount;

/// Called with the triggering EVD's handle; the ffi wraps DAT_OS_WAIT_PROXY_AGENT in one.
pub type ProxyAgent = Arc<dyn Fn(Handle) + Send + Sync>;

#[derive(Default)]
struct CnoState {
    /// The EVD that triggered since the last wait, if any.
    triggered: Option<Handle>,
    waiters: usize,
    agent: Option<ProxyAgent>,
    /// Opaque agent words as given by the consumer, returned by query.
    agent_words: (u64, u64),
    freed: bool,
}

pub struct Cno {
    handle: Handle,
    ia: Arc<Ia>,
    state: Mutex<CnoState>,
    cond: Condvar,
    fd_read: UnixStream,
    fd_write: UnixStream,
    /// EVDs attached to this CNO.
    pub(crate) users: UseCount,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CnoParam {
    pub ia: Handle,
    pub agent_words: (u64, u64),
}

impl Cno {
    /// dat_cno_create.
    pub fn create(
        ia: &Arc<Ia>,
        agent: Option<ProxyAgent>,
        agent_words: (u64, u64),
    ) -> DatResult<Arc<Cno>> {
        ia.check_open()?;
        let (fd_read, fd_write) =
            UnixStream::pair().map_err(|_| DatError::resources(SubType::ResourceMemory))?;
        fd_read
            .set_nonblocking(true)
            .map_err(|_| DatError::internal())?;
        fd_write
            .set_nonblocking(true)
            .map_err(|_| DatError::internal())?;
        let reservation = ia.reserve(HandleKind::Cno);
        let cno = Arc::new(Cno {
            handle: reservation.handle(),
            ia: ia.clone(),
            state: Mutex::new(CnoState {
                agent,
                agent_words,
                ..Default::default()
            }),
            cond: Condvar::new(),
            fd_read,
            fd_write,
            users: UseCount::default(),
        });
        ia.commit(reservation, &cno);
        Ok(cno)
    }

    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// An fd that becomes readable when the CNO triggers (cleared by `wait` or `clear_fd`).
    pub fn fd(&self) -> RawFd {
        self.fd_read.as_raw_fd()
    }

    pub fn query(&self) -> CnoParam {
        CnoParam {
            ia: self.ia.handle(),
            agent_words: self.state.lock().agent_words,
        }
    }

    /// dat_cno_modify_agent.
    pub fn modify_agent(&self, agent: Option<ProxyAgent>, agent_words: (u64, u64)) {
        let mut s = self.state.lock();
        s.agent = agent;
        s.agent_words = agent_words;
    }

    /// Called by an EVD that received an event while enabled and not waited on; also
    /// dat_cno_trigger (with the EVD the consumer names, or NULL).
    pub fn trigger(&self, evd: Handle) {
        let agent = {
            let mut s = self.state.lock();
            if s.freed {
                return;
            }
            s.triggered = Some(evd);
            s.agent.clone()
        };
        self.cond.notify_all();
        // A full socket buffer already means "readable"; nothing is lost by ignoring WouldBlock.
        let _ = (&self.fd_write).write(&[1u8]);
        if let Some(agent) = agent {
            agent(evd);
        }
    }

    /// Drains the readiness fd.
    pub fn clear_fd(&self) {
        let mut buf = [0u8; 64];
        while let Ok(n) = (&self.fd_read).read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    }

    /// dat_cno_wait: returns the EVD that triggered (NULL if the trigger came without one).
    pub fn wait(&self, timeout_us: u32) -> DatResult<Handle> {
        let deadline = deadline_from(timeout_us);
        let mut s = self.state.lock();
        s.waiters += 1;
        let result = loop {
            if s.freed {
                break Err(DatError::invalid_handle(SubType::InvalidHandleCno));
            }
            if let Some(evd) = s.triggered.take() {
                break Ok(evd);
            }
            match deadline {
                None => self.cond.wait(&mut s),
                Some(d) => {
                    if self.cond.wait_until(&mut s, d).timed_out() && s.triggered.is_none() {
                        break Err(DatError::timeout());
                    }
                }
            }
        };
        s.waiters -= 1;
        drop(s);
        if result.is_ok() {
            self.clear_fd();
        }
        result
    }

    /// dat_cno_free: refused while an EVD is attached.
    pub fn free(self: &Arc<Self>) -> DatResult<()> {
        if !handle_table::is_live(self.handle) {
            return Err(HandleKind::Cno.invalid());
        }
        if self.users.retire().is_err() {
            return Err(DatError::invalid_state(SubType::CnoInUse));
        }
        self.ia.remove(self.handle, HandleKind::Cno)?;
        self.destroy();
        Ok(())
    }

    pub(crate) fn destroy(&self) {
        self.users.force_retire();
        self.state.lock().freed = true;
        self.cond.notify_all();
    }
}

/// Converts a DAT_TIMEOUT (microseconds, INFINITE = none) into a deadline.
pub(crate) fn deadline_from(timeout_us: u32) -> Option<Instant> {
    if timeout_us == TIMEOUT_INFINITE {
        None
    } else {
        Some(Instant::now() + Duration::from_micros(u64::from(timeout_us)))
    }
}
