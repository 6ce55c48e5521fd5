//! Tests of the dead-peer detection options (`liveness::watch_peer`).

use super::*;

#[test]
fn peer_timeout_values() {
    assert_eq!(parse_peer_timeout(None), Some(PEER_TIMEOUT_DEFAULT));
    assert_eq!(parse_peer_timeout(Some("0")), None);
    assert_eq!(
        parse_peer_timeout(Some(" 2500 ")),
        Some(Duration::from_millis(2500))
    );
    for bad in ["", "-1", "1.5", "10s", "86400001", "99999999999999999999"] {
        assert_eq!(
            parse_peer_timeout(Some(bad)),
            Some(PEER_TIMEOUT_DEFAULT),
            "{bad:?}"
        );
    }
}

#[test]
fn keepalive_fits_the_timeout() {
    assert_eq!(keepalive_for(Duration::from_secs(30)), (15, 5, 3));
    assert_eq!(keepalive_for(Duration::from_secs(2)), (1, 1, 1));
    assert_eq!(keepalive_for(Duration::from_millis(100)), (1, 1, 1));
    for s in [1u64, 2, 5, 10, 30, 60, 600, 86_400] {
        let (idle, interval, probes) = keepalive_for(Duration::from_secs(s));
        assert!(idle >= 1 && interval >= 1 && (1..=127).contains(&probes));
        // Kernels without TCP_USER_TIMEOUT give up after idle + interval * probes.
        assert!(
            (idle + interval * probes) as u64 <= s.max(2),
            "{s}: {idle}+{interval}*{probes}"
        );
    }
}

#[test]
fn connections_get_the_options() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let stream = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    tune(&stream);
    let fd = stream.as_raw_fd();
    let get = |level, name| sys::int_option(fd, level, name).expect("getsockopt");
    // The tests run without DAPLRS_PEER_TIMEOUT_MS: the default applies.
    let t = peer_timeout().expect("on by default");
    assert_eq!(
        get(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT) as u128,
        t.as_millis()
    );
    assert_eq!(get(libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
    let (idle, interval, probes) = keepalive_for(t);
    assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), idle);
    assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), interval);
    assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPCNT), probes);
}
