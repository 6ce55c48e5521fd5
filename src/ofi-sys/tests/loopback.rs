//! The bindings end to end on libfabric's tcp provider (FI_EP_MSG) over
//! loopback: a passive endpoint, a connection carrying private data, an RDMA
//! write and read with offset addressing (tcp is offset-based: see
//! docs/libfabric.md), and a send into a posted receive.
//!
//! Every libfabric call here checks its return code with `ok`, which panics
//! on a failure: an object the file goes on to use was opened.

use ofi_sys::*;
use std::ffi::CString;
use std::os::raw::c_void;
use std::ptr::{null, null_mut};

fn ok(rc: i64, what: &str) {
    assert!(rc >= 0, "{what}: {} ({rc})", strerror(rc as i32));
}

struct Domain {
    info: *mut fi_info,
    fabric: *mut fid_fabric,
    domain: *mut fid_domain,
    eq: *mut fid_eq,
}

/// Opens a fabric, a domain and an EQ of libfabric's tcp provider for
/// `node`/`service` (FI_SOURCE when `passive`); the caller closes them.
unsafe fn open(node: &str, service: Option<&str>, passive: bool) -> Domain {
    // SAFETY: `hints` is checked non-NULL before its attributes (allocated
    // with it by fi_allocinfo) are written; the strings passed to fi_getinfo
    // are CStrings alive across the call; every object passed on (info,
    // fabric) was returned by the call before it, whose success `ok` checked.
    unsafe {
        let hints = fi_allocinfo();
        assert!(!hints.is_null(), "fi_allocinfo");
        (*hints).caps = (FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_RECV | FI_SEND) as u64
            | (FI_REMOTE_READ | FI_REMOTE_WRITE) as u64;
        (*(*hints).ep_attr).type_ = fi_ep_type_FI_EP_MSG;
        (*(*hints).fabric_attr).prov_name = libc::strdup(c"tcp".as_ptr());
        (*(*hints).domain_attr).mr_mode =
            (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY) as i32;
        let node = CString::new(node).unwrap();
        let service = service.map(|s| CString::new(s).unwrap());
        let mut info = null_mut();
        let flags = if passive { FI_SOURCE } else { 0 };
        ok(
            fi_getinfo(
                API_VERSION,
                node.as_ptr(),
                service.as_ref().map_or(null(), |s| s.as_ptr()),
                flags,
                hints,
                &mut info,
            ) as i64,
            "fi_getinfo",
        );
        fi_freeinfo(hints);
        let mut fabric = null_mut();
        ok(
            fi_fabric((*info).fabric_attr, &mut fabric, null_mut()) as i64,
            "fi_fabric",
        );
        let mut domain = null_mut();
        ok(
            fi_domain(fabric, info, &mut domain, null_mut()) as i64,
            "fi_domain",
        );
        let mut eq_attr = fi_eq_attr {
            wait_obj: fi_wait_obj_FI_WAIT_UNSPEC,
            ..Default::default()
        };
        let mut eq = null_mut();
        ok(
            fi_eq_open(fabric, &mut eq_attr, &mut eq, null_mut()) as i64,
            "fi_eq_open",
        );
        Domain {
            info,
            fabric,
            domain,
            eq,
        }
    }
}

/// # Safety
/// `d` is from `open` and not closed.
unsafe fn cq(d: &Domain) -> *mut fid_cq {
    let mut attr = fi_cq_attr {
        size: 64,
        format: fi_cq_format_FI_CQ_FORMAT_DATA,
        wait_obj: fi_wait_obj_FI_WAIT_UNSPEC,
        ..Default::default()
    };
    let mut cq = null_mut();
    // SAFETY: `d.domain` is live (the caller's contract); `attr` and `cq` are
    // locals the call only reads and writes during the call.
    unsafe {
        ok(
            fi_cq_open(d.domain, &mut attr, &mut cq, null_mut()) as i64,
            "fi_cq_open",
        )
    };
    cq
}

/// # Safety
/// `d` is from `open` and not closed, `info` a live fi_info for its domain
/// (the domain's own, or a connection request's), `cq` from `cq(d)`.
unsafe fn endpoint(d: &Domain, info: *mut fi_info, cq: *mut fid_cq) -> *mut fid_ep {
    // SAFETY: the domain, EQ, info and CQ are live (the caller's contract);
    // `ep` is used only after fi_endpoint succeeded (`ok`).
    unsafe {
        let mut ep = null_mut();
        ok(
            fi_endpoint(d.domain, info, &mut ep, null_mut()) as i64,
            "fi_endpoint",
        );
        ok(fi_ep_bind(ep, &mut (*d.eq).fid, 0) as i64, "bind eq");
        ok(
            fi_ep_bind(ep, &mut (*cq).fid, (FI_TRANSMIT | FI_RECV) as u64) as i64,
            "bind cq",
        );
        ok(fi_enable(ep) as i64, "fi_enable");
        ep
    }
}

/// Waits for one CM event of kind `want`, returning its entry.
///
/// # Safety
/// `d.eq` is live.
unsafe fn cm_event(d: &Domain, want: u32) -> (fi_eq_cm_entry, Vec<u8>) {
    let mut buf = [0u8; 512];
    let mut event = 0u32;
    // SAFETY: `d.eq` is live (the caller's contract); the provider writes at
    // most `buf.len()` bytes into `buf` and the event kind into `event`.
    let n = unsafe {
        fi_eq_sread(
            d.eq,
            &mut event,
            buf.as_mut_ptr().cast(),
            buf.len(),
            5000,
            0,
        )
    };
    ok(n as i64, "fi_eq_sread");
    assert_eq!(event, want, "CM event");
    let hdr = std::mem::size_of::<fi_eq_cm_entry>();
    // SAFETY: the provider wrote an fi_eq_cm_entry followed by the private data.
    let entry = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast::<fi_eq_cm_entry>()) };
    (entry, buf[hdr..n as usize].to_vec())
}

/// Waits for one completion on `cq`. tcp's data progress is driven by the
/// calls of each side (measured: a write with FI_DELIVERY_COMPLETE does not
/// complete while the target makes no call): reading `peer` with a count of
/// 0 lets the target side progress without taking its completions.
///
/// # Safety
/// `cq` and `peer` are live CQs of format FI_CQ_FORMAT_DATA.
unsafe fn one_completion(cq: *mut fid_cq, peer: *mut fid_cq) -> fi_cq_data_entry {
    let mut entry = fi_cq_data_entry::default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let mut none = fi_cq_data_entry::default();
        // SAFETY: `peer` is live (the caller's contract); a count of 0 writes
        // no entry.
        let _ = unsafe { fi_cq_read(peer, (&mut none as *mut fi_cq_data_entry).cast(), 0) };
        // SAFETY: `cq` is live and of the data format (the caller's
        // contract): one entry fits `entry`.
        let n = unsafe { fi_cq_read(cq, (&mut entry as *mut fi_cq_data_entry).cast(), 1) };
        if n == 1 {
            return entry;
        }
        assert_eq!(
            n,
            -(FI_EAGAIN as isize),
            "fi_cq_read: {}",
            strerror(n as i32)
        );
        assert!(std::time::Instant::now() < deadline, "no completion");
    }
}

/// # Safety
/// `d` is from `open` and not closed; `buf` outlives the registration (the
/// caller closes it before the buffer goes) and is not moved meanwhile.
unsafe fn register(d: &Domain, buf: &mut [u8], key: u64) -> *mut fid_mr {
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let attr = fi_mr_attr {
        mr_iov: (&iov as *const libc::iovec).cast(),
        iov_count: 1,
        access: (FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE) as u64,
        requested_key: key,
        ..Default::default()
    };
    let mut mr = null_mut();
    // SAFETY: `d.domain` is live and `buf` outlives the registration (the
    // caller's contract); `attr` and the iovec it points to are read during
    // the call only.
    unsafe {
        ok(
            fi_mr_regattr(d.domain, &attr, 0, &mut mr) as i64,
            "fi_mr_regattr",
        )
    };
    mr
}

#[test]
fn msg_endpoints_connect_and_move_data() {
    // SAFETY: every object is one this test opened (its success checked by
    // `ok`) and closes only at the end, after its last use; the registered
    // buffers `target` and `local` are neither moved nor dropped before
    // their registrations are closed; each posted operation's iovecs,
    // descriptors and messages are locals alive until its completion is
    // read; and `local.add(64/200)`, `target.add(1024)` stay within the
    // 4096-byte buffers with the lengths posted.
    unsafe {
        // Passive side.
        // Port 0: the kernel picks one, read back with fi_getname.
        let server = open("127.0.0.1", Some("0"), true);
        let mut pep = null_mut();
        ok(
            fi_passive_ep(server.fabric, server.info, &mut pep, null_mut()) as i64,
            "fi_passive_ep",
        );
        ok(
            fi_pep_bind(pep, &mut (*server.eq).fid, 0) as i64,
            "pep bind",
        );
        ok(fi_listen(pep) as i64, "fi_listen");

        // Active side connects with private data.
        let mut name = libc::sockaddr_in {
            sin_family: 0,
            sin_port: 0,
            sin_addr: libc::in_addr { s_addr: 0 },
            sin_zero: [0; 8],
        };
        let mut len = std::mem::size_of::<libc::sockaddr_in>();
        ok(
            fi_pep_getname(pep, (&mut name as *mut libc::sockaddr_in).cast(), &mut len) as i64,
            "fi_getname",
        );
        let port = u16::from_be(name.sin_port).to_string();
        let client = open("127.0.0.1", Some(&port), false);
        let ccq = cq(&client);
        let cep = endpoint(&client, client.info, ccq);
        let hello = b"hello from DAT";
        ok(
            fi_connect(
                cep,
                (*client.info).dest_addr,
                hello.as_ptr().cast(),
                hello.len(),
            ) as i64,
            "fi_connect",
        );
        // The provider progresses a connection only while its side reads its
        // EQ: the passive side runs on a thread of its own meanwhile.
        struct Passive(*mut fid_domain, *mut fid_eq, *mut fi_info);
        // SAFETY: the server's domain and EQ are used by the accepting thread
        // alone until the main thread joins it (the main thread touches only
        // the client's objects meanwhile); the Passive sent back is all NULL.
        unsafe impl Send for Passive {}
        let p = Passive(server.domain, server.eq, null_mut());
        let accepting = std::thread::spawn(move || {
            let p = p;
            let server = Domain {
                info: p.2,
                fabric: null_mut(),
                domain: p.0,
                eq: p.1,
            };
            let (req, data) = cm_event(&server, FI_CONNREQ);
            assert_eq!(&data[..hello.len()], hello);
            let scq = cq(&server);
            let sep = endpoint(&server, req.info, scq);
            let yes = b"accepted";
            ok(
                fi_accept(sep, yes.as_ptr().cast(), yes.len()) as i64,
                "fi_accept",
            );
            let _ = cm_event(&server, FI_CONNECTED);
            fi_freeinfo(req.info);
            (
                Passive(null_mut(), null_mut(), null_mut()),
                sep as usize,
                scq as usize,
            )
        });
        let (_, data) = cm_event(&client, FI_CONNECTED);
        assert_eq!(&data[..8], b"accepted");
        let (_, sep, scq) = accepting.join().unwrap();
        let (sep, scq) = (sep as *mut fid_ep, scq as *mut fid_cq);

        // Memory: the server's target, the client's source and sink.
        let mut target = vec![0u8; 4096];
        let mut local = vec![0u8; 4096];
        let tmr = register(&server, &mut target, 7);
        let lmr = register(&client, &mut local, 9);
        let mode = (*(*client.info).domain_attr).mr_mode;
        let virt = mode & FI_MR_VIRT_ADDR as i32 != 0;
        let base = if virt { target.as_ptr() as u64 } else { 0 };

        // RDMA write of 8 bytes at offset 100.
        local[..8].copy_from_slice(b"written!");
        let mut iov = libc::iovec {
            iov_base: local.as_mut_ptr().cast(),
            iov_len: 8,
        };
        let mut desc = fi_mr_desc(lmr);
        let rma = fi_rma_iov {
            addr: base + 100,
            len: 8,
            key: fi_mr_key(tmr),
        };
        let msg = fi_msg_rma {
            msg_iov: (&mut iov as *mut libc::iovec).cast(),
            desc: &mut desc,
            iov_count: 1,
            rma_iov: &rma,
            rma_iov_count: 1,
            context: 0x11 as *mut c_void,
            ..Default::default()
        };
        ok(
            fi_writemsg(
                cep,
                &msg,
                FI_COMPLETION as u64 | FI_DELIVERY_COMPLETE as u64,
            ) as i64,
            "fi_writemsg",
        );
        let wc = one_completion(ccq, scq);
        assert_eq!(wc.op_context as usize, 0x11);
        assert_eq!(&target[100..108], b"written!");

        // RDMA read of those bytes back into local[64..].
        let mut iov = libc::iovec {
            iov_base: local.as_mut_ptr().add(64).cast(),
            iov_len: 8,
        };
        let msg = fi_msg_rma {
            msg_iov: (&mut iov as *mut libc::iovec).cast(),
            context: 0x12 as *mut c_void,
            ..msg
        };
        ok(
            fi_readmsg(cep, &msg, FI_COMPLETION as u64) as i64,
            "fi_readmsg",
        );
        let wc = one_completion(ccq, scq);
        assert_eq!(wc.op_context as usize, 0x12);
        assert_eq!(&local[64..72], b"written!");

        // A send into a posted receive.
        let mut rdesc = fi_mr_desc(tmr);
        let mut riov = libc::iovec {
            iov_base: target.as_mut_ptr().add(1024).cast(),
            iov_len: 64,
        };
        let rmsg = fi_msg {
            msg_iov: (&mut riov as *mut libc::iovec).cast(),
            desc: &mut rdesc,
            iov_count: 1,
            context: 0x21 as *mut c_void,
            ..Default::default()
        };
        ok(
            fi_recvmsg(sep, &rmsg, FI_COMPLETION as u64) as i64,
            "fi_recvmsg",
        );
        local[200..205].copy_from_slice(b"sent!");
        let mut siov = libc::iovec {
            iov_base: local.as_mut_ptr().add(200).cast(),
            iov_len: 5,
        };
        let smsg = fi_msg {
            msg_iov: (&mut siov as *mut libc::iovec).cast(),
            desc: &mut desc,
            iov_count: 1,
            context: 0x22 as *mut c_void,
            ..Default::default()
        };
        ok(
            fi_sendmsg(cep, &smsg, FI_COMPLETION as u64) as i64,
            "fi_sendmsg",
        );
        assert_eq!(one_completion(ccq, scq).op_context as usize, 0x22);
        let rc = one_completion(scq, ccq);
        assert_eq!(rc.op_context as usize, 0x21);
        assert_eq!(rc.len, 5);
        assert_eq!(&target[1024..1029], b"sent!");
        eprintln!("tcp FI_EP_MSG: mr_mode {mode:#x} (VA addressing: {virt})");

        for f in [
            &mut (*cep).fid as *mut fid,
            &mut (*sep).fid,
            &mut (*pep).fid,
            &mut (*lmr).fid,
            &mut (*tmr).fid,
            &mut (*ccq).fid,
            &mut (*scq).fid,
            &mut (*client.eq).fid,
            &mut (*server.eq).fid,
            &mut (*client.domain).fid,
            &mut (*server.domain).fid,
            &mut (*client.fabric).fid,
            &mut (*server.fabric).fid,
        ] {
            ok(fi_close(f) as i64, "fi_close");
        }
        fi_freeinfo(client.info);
        fi_freeinfo(server.info);
    }
}
