//! Dead-peer detection: TCP keepalive and TCP_USER_TIMEOUT on every connection, from
//! `DAPLRS_PEER_TIMEOUT_MS`, so that a peer that stops answering without closing breaks the
//! connection within that time.

use super::*;

/// Environment variable that sets the dead-peer detection time in milliseconds (see
/// `watch_peer`); 0 turns the detection off (the kernel's defaults: about 15 minutes with data
/// in flight, never on an idle connection).
pub(crate) const PEER_TIMEOUT_ENV: &str = "DAPLRS_PEER_TIMEOUT_MS";
/// The detection time when the variable is unset or unreadable.
pub(crate) const PEER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// The detection time in effect: `DAPLRS_PEER_TIMEOUT_MS`, read once per process. None: off.
pub(crate) fn peer_timeout() -> Option<Duration> {
    static TIMEOUT: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *TIMEOUT.get_or_init(|| parse_peer_timeout(std::env::var(PEER_TIMEOUT_ENV).ok().as_deref()))
}

/// `DAPLRS_PEER_TIMEOUT_MS`'s value: a whole number of milliseconds, 0 for off, at most one
/// day; anything else gives the default (with a warning).
pub(crate) fn parse_peer_timeout(value: Option<&str>) -> Option<Duration> {
    let Some(v) = value else {
        return Some(PEER_TIMEOUT_DEFAULT);
    };
    match v.trim().parse::<u64>() {
        Ok(0) => None,
        Ok(ms) if ms <= 86_400_000 => Some(Duration::from_millis(ms)),
        _ => {
            log::warn!(
                "{PEER_TIMEOUT_ENV}={v:?} is not a number of milliseconds (0..=86400000); using {} ms",
                PEER_TIMEOUT_DEFAULT.as_millis()
            );
            Some(PEER_TIMEOUT_DEFAULT)
        }
    }
}

/// The keepalive settings for detection time `t`: (idle seconds, interval seconds, probes).
/// The first probe goes out after `t`/2 of silence, the next ones every `t`/6 (at least a
/// second each, the kernel's unit); with TCP_USER_TIMEOUT set the kernel gives up once `t` has
/// passed since the peer was last heard and a probe is unanswered, so the probe count only
/// matters to kernels without it.
pub(crate) fn keepalive_for(t: Duration) -> (i32, i32, i32) {
    let ms = t.as_millis().min(i32::MAX as u128) as i32;
    let idle = (ms / 2 / 1000).max(1);
    let interval = (ms / 6 / 1000).max(1);
    let probes = ((ms / 1000 - idle) / interval).clamp(1, 127);
    (idle, interval, probes)
}

/// Dead-peer detection on a connection's socket, so that a peer which stops answering (host
/// gone, link down, cable cut: nothing closes the connection) breaks it within the detection
/// time instead of the kernel's 15 minutes of retransmissions, or never when the connection is
/// idle:
///
/// * TCP_USER_TIMEOUT: data we sent (a request, an answer, a zero-window probe) unacknowledged
///   for that long ends the connection with ETIMEDOUT;
/// * SO_KEEPALIVE with TCP_KEEPIDLE/KEEPINTVL/KEEPCNT: an idle connection is probed, and
///   ended when the peer's kernel stops answering.
///
/// Both watch the peer's kernel, not its process: a stopped (SIGSTOP) or busy peer still
/// acknowledges, so its connection stays up and DTOs wait for it; only once its receive window
/// stays shut for the detection time with our data queued does the kernel give up (Linux 5.11
/// and later). The engine sees the error as any other socket error: BROKEN, DTOs flushed.
/// Failures to set an option are logged, not fatal (the connection works, detection is slower).
pub(super) fn watch_peer(stream: &TcpStream) {
    let Some(t) = peer_timeout() else {
        return;
    };
    let fd = stream.as_raw_fd();
    let (idle, interval, probes) = keepalive_for(t);
    let user_timeout = t.as_millis().min(i32::MAX as u128) as i32;
    let options = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1, "SO_KEEPALIVE"),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle, "TCP_KEEPIDLE"),
        (
            libc::IPPROTO_TCP,
            libc::TCP_KEEPINTVL,
            interval,
            "TCP_KEEPINTVL",
        ),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, probes, "TCP_KEEPCNT"),
        (
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            user_timeout,
            "TCP_USER_TIMEOUT",
        ),
    ];
    for (level, name, value, what) in options {
        if let Err(e) = sys::set_int_option(fd, level, name, value) {
            log::warn!("{what}={value} on a connection: {e}");
        }
    }
}

/// A process of ours that ends (exit, crash, kill) resets its connections instead of closing
/// them, as an RDMA device's connection manager tells the peer at once when the process
/// owning a queue pair goes. A plain close puts the end of stream behind the data still
/// queued, and a target holding the connection's input back (its receives not posted) would
/// never see it: its kernel keeps the peer's data outside a shut window, the peer's kernel
/// keeps the end behind that data. Our own closes are graceful as before: a closing
/// connection flushes and ends its stream first (`Conn::begin_close`), and a device closing
/// clears the option on each connection before it drops them (`Engine::shutdown`).
pub(super) fn reset_on_exit(stream: &TcpStream) {
    if let Err(e) = sys::set_abortive_close(stream.as_raw_fd(), true) {
        log::warn!("SO_LINGER on a connection: {e}");
    }
}

#[cfg(test)]
#[path = "liveness_tests.rs"]
mod liveness_tests;
