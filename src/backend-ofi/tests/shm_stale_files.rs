//! shm names an endpoint's shared memory "<pid>:<uid>:<index>" in /dev/shm,
//! and a killed process leaves its files behind. Once pids wrap (32,768 by
//! default), a new process can be given the pid of such a file, which shm
//! then refuses as in use by a live process: itself. An IA opened in that
//! state must still connect and transfer. Its own binary: the endpoint
//! indexes count from 0 per process.

mod common;

use std::io::Write;

/// The first bytes of a shm region as libfabric 1.17 writes them: version
/// 4, flags, and the pid that made it (here ours, as after a wrap).
fn stale_region(pid: u32) -> Vec<u8> {
    let mut head = vec![4u8, 0, 1, 0];
    head.extend_from_slice(&pid.to_ne_bytes());
    head.resize(4096, 0);
    head
}

#[test]
fn an_ia_opens_over_files_left_at_our_pid() {
    let pid = std::process::id();
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let names: Vec<String> = (0..16)
        .map(|i| format!("/dev/shm/{pid}:{uid}:{i}"))
        .collect();
    for name in &names {
        let mut f = std::fs::File::create(name).unwrap();
        f.write_all(&stale_region(pid)).unwrap();
    }
    let rig = common::connect_transfer_reject_disconnect("shm");
    drop(rig);
    for name in &names {
        let _ = std::fs::remove_file(name);
    }
}
