//! Datagram EPs (DAT_IB_SERVICE_TYPE_UD) through the core's API, over every device with
//! datagrams (`over_datagram_devices!`): the TCP backend's UDP sockets, and libfabric's udp
//! beside reliable datagrams (`dgram=udp` with tcp;ofi_rxm and with shm). An address resolved
//! through a PSP with private data both ways, a datagram each way after its GRH area, a drop
//! counted, a receive too small stopping the EP (BROKEN) until its reset, a reject.

use super::*;
use crate::core::consts::ib_ext;
use crate::core::ep::EpAttr;
use crate::core::evd::UdConnExt;
use crate::core::ia::Ia;
use crate::core::lmr::{Lmr, LmrRegion};
use crate::core::pz::Pz;

const GRH: u32 = crate::backend::GRH_LEN;

/// An IA with a datagram EP on its own EVDs and a registered buffer.
struct UdSide {
    ia: Arc<Ia>,
    dto: Arc<Evd>,
    conn: Arc<Evd>,
    cr: Arc<Evd>,
    ep: Arc<Ep>,
    buf: Buffer,
    lmr: Arc<Lmr>,
}

impl UdSide {
    fn on(dev: &TestDevice, name: &str) -> UdSide {
        let ia = dev.open_ia(name);
        let attr = ia.device().attr();
        assert!(attr.ud, "{dev:?} has datagram EPs");
        let pz = Pz::create(&ia).expect("pz");
        let dto = Evd::create(&ia, 64, None, evd_flags::DTO).expect("dto evd");
        let conn = Evd::create(&ia, 16, None, evd_flags::CONNECTION).expect("conn evd");
        let cr = Evd::create(&ia, 16, None, evd_flags::CR).expect("cr evd");
        let ud = EpAttr {
            service_type: ib_ext::SERVICE_TYPE_UD,
            ..EpAttr::defaults(&attr)
        };
        let (d, c) = (Some(dto.clone()), Some(conn.clone()));
        let ep = Ep::create(&ia, Some(pz.clone()), d.clone(), d, c, None, Some(ud)).expect("ud ep");
        let buf = Buffer::new(8192);
        let region = LmrRegion::Virtual {
            address: buf.addr(),
            length: buf.len() as u64,
        };
        let lmr = Lmr::create(&ia, region, &pz, mem_priv::ALL, VA_TYPE_VA).expect("lmr");
        UdSide {
            ia,
            dto,
            conn,
            cr,
            ep,
            buf,
            lmr,
        }
    }

    fn seg(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.buf.addr() + off as u64,
            length: len,
            lkey: self.lmr.lmr_context(),
        }
    }

    /// The next datagram connection event of this EP: its number, extension and private data.
    fn ud_event(&self) -> (u32, UdConnExt, Vec<u8>) {
        let ev = next(&self.conn);
        match ev.data {
            EventData::UdConnection {
                ep,
                private_data,
                ext,
            } => {
                assert_eq!(ep, self.ep.handle());
                (ev.number, ext, private_data.to_vec())
            }
            other => panic!("not a datagram connection event: {other:?}"),
        }
    }

    fn dropped(&self) -> u64 {
        self.ia.device().ud_dropped()
    }
}

/// `a` resolves `b`'s datagram EP through a PSP of `b`'s: the address handles each gets.
fn resolve(a: &UdSide, b: &UdSide) -> (UdConnExt, UdConnExt) {
    let (_psp, port) = Sp::create_psp_any(&b.ia, &b.cr, 0).expect("psp");
    let to = b.ia.device().address();
    a.ep.connect(to, port, GUARD_US, b"where", 0, 0)
        .expect("resolve");
    let ev = next(&b.cr);
    assert_eq!(ev.number, ib_ext::UD_CONNECTION_REQUEST_EVENT);
    let EventData::CrArrival { cr, .. } = ev.data else {
        panic!("not a CR: {ev:?}")
    };
    let cr = handle::cr(cr).expect("live CR");
    assert_eq!(&cr.query().private_data[..], b"where");
    cr.accept(Some(&b.ep), b"here").expect("accept");
    let (number, at_b, pdata) = b.ud_event();
    assert_eq!(number, ib_ext::UD_CONNECTION_EVENT_ESTABLISHED);
    assert_eq!(
        (at_b.kind, &pdata[..]),
        (ib_ext::TYPE_UD_PASSIVE_REMOTE_AH, &b"where"[..])
    );
    let (number, at_a, pdata) = a.ud_event();
    assert_eq!(number, ib_ext::UD_CONNECTION_EVENT_ESTABLISHED);
    assert_eq!(
        (at_a.kind, &pdata[..]),
        (ib_ext::TYPE_UD_REMOTE_AH, &b"here"[..])
    );
    assert_eq!(at_a.address, Some(to));
    assert_eq!(at_b.address, Some(a.ia.device().address()));
    assert_eq!(a.ep.state(), EpState::Connected);
    (at_a, at_b)
}

fn send(from: &UdSide, to: &UdConnExt, off: usize, len: u32, cookie: u64) {
    from.ep
        .post_send_ud(&[from.seg(off, len)], to.ah, to.qpn, cookie, 0)
        .expect("post datagram");
    let (c, status, n, op) = dto(&next(&from.dto));
    assert_eq!(
        (c, status, n, op),
        (cookie, dto_status::SUCCESS, len, ib_ext::DTO_SEND_UD)
    );
}

/// A datagram each way lands after a 40-byte GRH area; one without a receive is dropped and
/// counted; one larger than its receive fails it, flushes the rest and stops the EP (BROKEN)
/// until dat_ep_reset.
pub(super) fn datagram_eps_resolve_and_carry_datagrams(dev: &TestDevice) {
    let (a, b) = (UdSide::on(dev, "uda"), UdSide::on(dev, "udb"));
    let (to_b, to_a) = resolve(&a, &b);
    a.buf.write(0, b"to b");
    b.ep.post_recv(&[b.seg(1024, 256)], 1, 0).expect("recv");
    send(&a, &to_b, 0, 4, 2);
    let (c, status, n, op) = dto(&next(&b.dto));
    assert_eq!(
        (c, status, n, op),
        (1, dto_status::SUCCESS, GRH + 4, ib_ext::DTO_RECV_UD)
    );
    assert_eq!(b.buf.read(1024 + GRH as usize, 4), b"to b");
    b.buf.write(0, b"to a!");
    a.ep.post_recv(&[a.seg(1024, 256)], 3, 0).expect("recv");
    send(&b, &to_a, 0, 5, 4);
    assert_eq!(
        dto(&next(&a.dto)),
        (3, dto_status::SUCCESS, GRH + 5, ib_ext::DTO_RECV_UD)
    );
    assert_eq!(a.buf.read(1024 + GRH as usize, 5), b"to a!");

    // No receive posted at b: dropped, counted; the next one arrives.
    let before = b.dropped();
    send(&a, &to_b, 0, 4, 5);
    let end = std::time::Instant::now() + std::time::Duration::from_micros(GUARD_US.into());
    while b.dropped() == before {
        assert!(
            std::time::Instant::now() < end,
            "the datagram was never dropped"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(b.dropped(), before + 1);
    b.ep.post_recv(&[b.seg(1024, 256)], 6, 0).expect("recv");
    send(&a, &to_b, 0, 4, 7);
    assert_eq!(dto(&next(&b.dto)).0, 6);

    // Too large for its receive: LOCAL_LENGTH, the rest flushed, BROKEN, then a reset.
    b.ep.post_recv(&[b.seg(0, GRH + 8)], 8, 0).expect("recv");
    b.ep.post_recv(&[b.seg(1024, 256)], 9, 0).expect("recv");
    send(&a, &to_b, 0, 100, 10);
    assert_eq!(dto(&next(&b.dto)).1, dto_status::LOCAL_LENGTH);
    assert_eq!(dto(&next(&b.dto)).1, dto_status::FLUSHED);
    assert_eq!(next(&b.conn).number, event_number::CONNECTION_BROKEN);
    assert_eq!(b.ep.state(), EpState::Disconnected);
    b.ep.reset().expect("reset");
    b.ep.post_recv(&[b.seg(1024, 256)], 11, 0).expect("recv");
    send(&a, &to_b, 0, 4, 12);
    assert_eq!(dto(&next(&b.dto)).0, 11);
    for s in [&a, &b] {
        s.ia.close(close_flags::ABRUPT).expect("close IA");
    }
}

/// A resolution the remote consumer rejects ends with DAT_IB_UD_CONNECTION_REJECT_EVENT and
/// the reject's private data; the EP stays as it was.
pub(super) fn a_rejected_resolution_says_so(dev: &TestDevice) {
    let (a, b) = (UdSide::on(dev, "uda"), UdSide::on(dev, "udb"));
    let (_psp, port) = Sp::create_psp_any(&b.ia, &b.cr, 0).expect("psp");
    a.ep.connect(b.ia.device().address(), port, GUARD_US, b"may I", 0, 0)
        .expect("resolve");
    let ev = next(&b.cr);
    assert_eq!(ev.number, ib_ext::UD_CONNECTION_REQUEST_EVENT);
    let EventData::CrArrival { cr, .. } = ev.data else {
        panic!("not a CR: {ev:?}")
    };
    handle::cr(cr)
        .expect("live CR")
        .reject(b"no")
        .expect("reject");
    let (number, ext, pdata) = a.ud_event();
    assert_eq!(number, ib_ext::UD_CONNECTION_REJECT_EVENT);
    assert_eq!(
        (ext.kind, &pdata[..]),
        (ib_ext::TYPE_UD_CONNECT_REJECT, &b"no"[..])
    );
    assert_eq!(a.ep.state(), EpState::Unconnected);
    for s in [&a, &b] {
        s.ia.close(close_flags::ABRUPT).expect("close IA");
    }
}
