//! The listener of the connection manager (`TcpListenerHandle`): a listening socket the
//! progress thread accepts on.

use std::sync::Weak;

use daplrs_backend::Listener;

use crate::shared::Shared;

pub(crate) struct TcpListenerHandle {
    id: u64,
    port: u16,
    shared: Weak<Shared>,
}

impl TcpListenerHandle {
    pub(crate) fn new(id: u64, port: u16, shared: Weak<Shared>) -> TcpListenerHandle {
        TcpListenerHandle { id, port, shared }
    }
}

impl Listener for TcpListenerHandle {
    fn id(&self) -> u64 {
        self.id
    }
    fn port(&self) -> u16 {
        self.port
    }
    fn close(&self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.run(|eng, _| {
                // Dropped here: the port is free on return (ListenerEntry's drop).
                eng.listeners.remove(&self.id);
                eng.wake_needed = true;
            });
        }
    }
}

impl Drop for TcpListenerHandle {
    fn drop(&mut self) {
        self.close();
    }
}
