//! The C argument list of every entry point of the provider, stated once: where each
//! parameter the core may refuse ([`Param`]) sits, so that DAT_INVALID_ARGn and
//! DAT_INVALID_HANDLEn are never written by hand. Each entry point runs under
//! `guard(&CALL, ..)` with its list here; the 1.2 table's lists are in `v12::calls`.
//!
//! The names are the DAT headers' (checked against include/dat2/dat_api.h by the tests
//! below); the IB extension operations, C macros over dat_extension_op, count the EP (or
//! handle) as argument 1 and the operation code as argument 2.

use daplrs::core::error::{DatError, Param};
use dat_abi::DAT_RETURN;

/// One C entry point: its DAT name and its parameters in C order.
pub(crate) struct Call {
    pub(crate) name: &'static str,
    pub(crate) params: &'static [Param],
}

impl Call {
    /// The DAT_RETURN of `e` in this call. An error naming a parameter the call does not
    /// have is the provider's bug: a debug build stops on it (the test suites run those
    /// paths); a release build says so and returns DAT_INTERNAL_ERROR, never some ARGn.
    // Inlined into each entry point: an error that names no parameter (an empty dequeue's)
    // is then a few instructions there, not a call.
    #[inline]
    pub(crate) fn code_of(&self, e: DatError) -> DAT_RETURN {
        match e.code_in(self.params) {
            Ok(code) => code,
            Err(param) => self.foreign_param(param),
        }
    }

    /// An error naming a parameter this call does not have (see `code_of`).
    #[cold]
    fn foreign_param(&self, param: Param) -> DAT_RETURN {
        debug_assert!(
            false,
            "{}: error names `{}`, not an argument of this call",
            self.name,
            param.c_name()
        );
        log::error!(
            "{}: error names `{}`, not an argument of this call",
            self.name,
            param.c_name()
        );
        DatError::internal().code()
    }
}

/// Declares each call as a constant `Call`, and `ALL`, every one of them.
macro_rules! calls {
    ($($konst:ident = $name:ident($($param:ident),* $(,)?);)*) => {
        $(
            // A 1.2 slot that runs its 2.0 entry point answers with the 2.0 list; its own list
            // is then for the tests, which hold the two equal.
            #[allow(dead_code)]
            pub(crate) const $konst: Call = Call {
                name: stringify!($name),
                params: &[$(daplrs::core::error::Param::$param),*],
            };
        )*
        #[cfg(test)]
        pub(crate) const ALL: &[&Call] = &[$(&$konst),*];
    };
}
pub(crate) use calls;

calls! {
    IA_OPEN = dat_ia_open(Name, AsyncEventQlen, AsyncEventHandle, IaHandle);
    IA_CLOSE = dat_ia_close(IaHandle, CloseFlags);
    IA_QUERY = dat_ia_query(
        IaHandle, AsyncEvdHandle, IaAttrMask, IaAttr, ProviderAttrMask, ProviderAttr
    );
    IA_HA_RELATED = dat_ia_ha_related(IaHandle, Provider, Answer);
    SET_CONSUMER_CONTEXT = dat_set_consumer_context(Handle, Context);
    GET_CONSUMER_CONTEXT = dat_get_consumer_context(Handle, Context);
    GET_HANDLE_TYPE = dat_get_handle_type(Handle, HandleType);
    CNO_CREATE = dat_cno_create(IaHandle, Agent, CnoHandle);
    CNO_MODIFY_AGENT = dat_cno_modify_agent(CnoHandle, Agent);
    CNO_QUERY = dat_cno_query(CnoHandle, CnoParamMask, CnoParam);
    CNO_FREE = dat_cno_free(CnoHandle);
    CNO_WAIT = dat_cno_wait(CnoHandle, Timeout, EvdHandle);
    CNO_FD_CREATE = dat_cno_fd_create(IaHandle, Fd, CnoHandle);
    CNO_TRIGGER = dat_cno_trigger(CnoHandle, EvdHandle);
    CR_QUERY = dat_cr_query(CrHandle, CrParamMask, CrParam);
    CR_ACCEPT = dat_cr_accept(CrHandle, EpHandle, PrivateDataSize, PrivateData);
    CR_REJECT = dat_cr_reject(CrHandle, PrivateDataSize, PrivateData);
    CR_HANDOFF = dat_cr_handoff(CrHandle, Handoff);
    EVD_CREATE = dat_evd_create(IaHandle, EvdMinQlen, CnoHandle, EvdFlags, EvdHandle);
    EVD_QUERY = dat_evd_query(EvdHandle, EvdParamMask, EvdParam);
    EVD_MODIFY_CNO = dat_evd_modify_cno(EvdHandle, CnoHandle);
    EVD_ENABLE = dat_evd_enable(EvdHandle);
    EVD_DISABLE = dat_evd_disable(EvdHandle);
    EVD_WAIT = dat_evd_wait(EvdHandle, Timeout, Threshold, Event, Nmore);
    EVD_RESIZE = dat_evd_resize(EvdHandle, EvdQlen);
    EVD_POST_SE = dat_evd_post_se(EvdHandle, Event);
    EVD_DEQUEUE = dat_evd_dequeue(EvdHandle, Event);
    EVD_FREE = dat_evd_free(EvdHandle);
    EVD_SET_UNWAITABLE = dat_evd_set_unwaitable(EvdHandle);
    EVD_CLEAR_UNWAITABLE = dat_evd_clear_unwaitable(EvdHandle);
    EP_CREATE = dat_ep_create(
        IaHandle, PzHandle, RecvEvdHandle, RequestEvdHandle, ConnectEvdHandle, EpAttributes,
        EpHandle,
    );
    EP_CREATE_WITH_SRQ = dat_ep_create_with_srq(
        IaHandle, PzHandle, RecvEvdHandle, RequestEvdHandle, ConnectEvdHandle, SrqHandle,
        EpAttributes, EpHandle,
    );
    EP_QUERY = dat_ep_query(EpHandle, EpParamMask, EpParam);
    EP_MODIFY = dat_ep_modify(EpHandle, EpParamMask, EpParam);
    EP_CONNECT = dat_ep_connect(
        EpHandle, RemoteIaAddress, RemoteConnQual, Timeout, PrivateDataSize, PrivateData, Qos,
        ConnectFlags,
    );
    EP_COMMON_CONNECT = dat_ep_common_connect(
        EpHandle, RemoteIaAddress, Timeout, PrivateDataSize, PrivateData
    );
    EP_DUP_CONNECT = dat_ep_dup_connect(
        EpHandle, EpDupHandle, Timeout, PrivateDataSize, PrivateData, Qos
    );
    EP_DISCONNECT = dat_ep_disconnect(EpHandle, CloseFlags);
    EP_POST_SEND = dat_ep_post_send(EpHandle, NumSegments, LocalIov, UserCookie, CompletionFlags);
    EP_POST_SEND_WITH_INVALIDATE = dat_ep_post_send_with_invalidate(
        EpHandle, NumSegments, LocalIov, UserCookie, CompletionFlags, InvalidateFlag, RmrContext
    );
    EP_POST_RECV = dat_ep_post_recv(EpHandle, NumSegments, LocalIov, UserCookie, CompletionFlags);
    EP_POST_RDMA_READ = dat_ep_post_rdma_read(
        EpHandle, NumSegments, LocalIov, UserCookie, RemoteIov, CompletionFlags
    );
    EP_POST_RDMA_READ_TO_RMR = dat_ep_post_rdma_read_to_rmr(
        EpHandle, LocalIov, UserCookie, RemoteIov, CompletionFlags
    );
    EP_POST_RDMA_WRITE = dat_ep_post_rdma_write(
        EpHandle, NumSegments, LocalIov, UserCookie, RemoteIov, CompletionFlags
    );
    EP_GET_STATUS = dat_ep_get_status(EpHandle, EpState, RecvIdle, RequestIdle);
    EP_FREE = dat_ep_free(EpHandle);
    EP_RESET = dat_ep_reset(EpHandle);
    EP_RECV_QUERY = dat_ep_recv_query(EpHandle, NbufsAllocated, BufsAllocSpan);
    EP_SET_WATERMARK = dat_ep_set_watermark(EpHandle, SoftHighWatermark, HardHighWatermark);
    LMR_CREATE = dat_lmr_create(
        IaHandle, MemType, RegionDescription, Length, PzHandle, Privileges, VaType, LmrHandle,
        LmrContext, RmrContext, RegisteredLength, RegisteredAddress,
    );
    LMR_QUERY = dat_lmr_query(LmrHandle, LmrParamMask, LmrParam);
    LMR_FREE = dat_lmr_free(LmrHandle);
    LMR_SYNC_RDMA_READ = dat_lmr_sync_rdma_read(IaHandle, LocalSegments, NumSegments);
    LMR_SYNC_RDMA_WRITE = dat_lmr_sync_rdma_write(IaHandle, LocalSegments, NumSegments);
    RMR_CREATE = dat_rmr_create(PzHandle, RmrHandle);
    RMR_CREATE_FOR_EP = dat_rmr_create_for_ep(PzHandle, RmrHandle);
    RMR_QUERY = dat_rmr_query(RmrHandle, RmrParamMask, RmrParam);
    RMR_BIND = dat_rmr_bind(
        RmrHandle, LmrHandle, LmrTriplet, MemPriv, VaType, EpHandle, UserCookie, CompletionFlags,
        RmrContext,
    );
    RMR_FREE = dat_rmr_free(RmrHandle);
    PSP_CREATE = dat_psp_create(IaHandle, ConnQual, EvdHandle, PspFlags, PspHandle);
    PSP_CREATE_ANY = dat_psp_create_any(IaHandle, ConnQual, EvdHandle, PspFlags, PspHandle);
    PSP_QUERY = dat_psp_query(PspHandle, PspParamMask, PspParam);
    PSP_FREE = dat_psp_free(PspHandle);
    RSP_CREATE = dat_rsp_create(IaHandle, ConnQual, EpHandle, EvdHandle, RspHandle);
    RSP_QUERY = dat_rsp_query(RspHandle, RspParamMask, RspParam);
    RSP_FREE = dat_rsp_free(RspHandle);
    CSP_CREATE = dat_csp_create(IaHandle, Comm, Address, EvdHandle, CspHandle);
    CSP_QUERY = dat_csp_query(CspHandle, CspParamMask, CspParam);
    CSP_FREE = dat_csp_free(CspHandle);
    PZ_CREATE = dat_pz_create(IaHandle, PzHandle);
    PZ_QUERY = dat_pz_query(PzHandle, PzParamMask, PzParam);
    PZ_FREE = dat_pz_free(PzHandle);
    SRQ_CREATE = dat_srq_create(IaHandle, PzHandle, SrqAttr, SrqHandle);
    SRQ_FREE = dat_srq_free(SrqHandle);
    SRQ_POST_RECV = dat_srq_post_recv(SrqHandle, NumSegments, LocalIov, UserCookie);
    SRQ_QUERY = dat_srq_query(SrqHandle, SrqParamMask, SrqParam);
    SRQ_RESIZE = dat_srq_resize(SrqHandle, SrqMaxRecvDto);
    SRQ_SET_LW = dat_srq_set_lw(SrqHandle, LowWatermark);
    EXTENSION_OP = dat_extension_op(Handle, ExtOp);
    IB_POST_RDMA_WRITE_IMMED = dat_ib_post_rdma_write_immed(
        EpHandle, ExtOp, NumSegments, LocalIov, UserCookie, RemoteIov, ImmediateData,
        CompletionFlags,
    );
    IB_POST_FETCH_AND_ADD = dat_ib_post_fetch_and_add(
        EpHandle, ExtOp, AddValue, LocalIov, UserCookie, RemoteIov, CompletionFlags
    );
    IB_POST_CMP_AND_SWAP = dat_ib_post_cmp_and_swap(
        EpHandle, ExtOp, CompareValue, SwapValue, LocalIov, UserCookie, RemoteIov,
        CompletionFlags,
    );
    IB_POST_SEND_UD = dat_ib_post_send_ud(
        EpHandle, ExtOp, NumSegments, LocalIov, AddressHandle, UserCookie, CompletionFlags
    );
    IB_UD_AH_FREE = dat_ib_ud_ah_free(EpHandle, ExtOp, AddressHandle);
    IB_UD_CM_FREE = dat_ib_ud_cm_free(EpHandle, ExtOp, UdCm);
    IB_QUERY_COUNTERS = dat_ib_query_counters(Handle, ExtOp, Counter, CountersOut, Reset);
    IB_PRINT_COUNTERS = dat_ib_print_counters(Handle, ExtOp, Counter, Reset);
    IB_OPEN_QUERY = dat_ib_open_query(
        Handle, ExtOp, Name, IaHandle, IaAttrMask, IaAttr, ProviderAttrMask, ProviderAttr
    );
    IB_CLOSE_QUERY = dat_ib_close_query(IaHandle, ExtOp);
}

/// The parameter names of each `DAT_RETURN name(...)` prototype in a C header.
#[cfg(test)]
pub(crate) fn header_prototypes(header: &str) -> std::collections::HashMap<String, Vec<String>> {
    let mut text = std::fs::read_to_string(header).expect("header");
    while let Some(start) = text.find("/*") {
        let end = text[start..]
            .find("*/")
            .map_or(text.len(), |e| start + e + 2);
        text.replace_range(start..end, " ");
    }
    let mut out = std::collections::HashMap::new();
    for decl in text.split(';') {
        let Some(at) = decl.find("DAT_RETURN ") else {
            continue;
        };
        let decl = &decl[at + "DAT_RETURN ".len()..];
        let (Some(open), Some(close)) = (decl.find('('), decl.rfind(')')) else {
            continue;
        };
        let name = decl[..open].trim().to_string();
        let params = decl[open + 1..close]
            .split(',')
            .filter_map(|a| {
                a.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .rfind(|w| !w.is_empty())
                    .map(str::to_string)
            })
            .filter(|w| w != "void")
            .collect();
        out.insert(name, params);
    }
    out
}

/// Checks `calls` against the prototypes of `header`: each call the header declares has
/// exactly its parameters, in order; `absent` lists the calls it does not declare.
#[cfg(test)]
pub(crate) fn check_against_header(calls: &[&Call], header: &str, absent: &[&str]) {
    let protos = header_prototypes(header);
    for call in calls {
        let ours: Vec<&str> = call.params.iter().map(|p| p.c_name()).collect();
        match protos.get(call.name) {
            Some(theirs) => assert_eq!(&ours, theirs, "{} in {header}", call.name),
            None => assert!(
                absent.contains(&call.name),
                "{} is not declared in {header}",
                call.name
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots that no prototype of dat_api.h states: dat_ia_open is a macro over dat_ia_openv
    /// (whose first four arguments are the slot's; checked below), the HA query is reached
    /// through the registry, and the IB extensions are macros over dat_extension_op.
    const NOT_IN_DAT_API: &[&str] = &[
        "dat_ia_open",
        "dat_ia_ha_related",
        "dat_ib_post_rdma_write_immed",
        "dat_ib_post_fetch_and_add",
        "dat_ib_post_cmp_and_swap",
        "dat_ib_post_send_ud",
        "dat_ib_ud_ah_free",
        "dat_ib_ud_cm_free",
        "dat_ib_query_counters",
        "dat_ib_print_counters",
        "dat_ib_open_query",
        "dat_ib_close_query",
        "dat_extension_op",
    ];

    fn header(rel: &str) -> String {
        format!("{}/../../{rel}", env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn every_call_matches_its_dat2_prototype() {
        check_against_header(ALL, &header("include/dat2/dat_api.h"), NOT_IN_DAT_API);
        let openv = &header_prototypes(&header("include/dat2/dat_api.h"))["dat_ia_openv"];
        let ours: Vec<&str> = IA_OPEN.params.iter().map(|p| p.c_name()).collect();
        assert_eq!(ours, openv[..ours.len()]);
    }

    #[test]
    fn every_dat2_prototype_has_its_call() {
        let ours: Vec<&str> = ALL.iter().map(|c| c.name).collect();
        let registry_only = [
            "dat_ia_openv",
            "dats_get_ia_handle",
            "dat_registry_add_provider",
            "dat_registry_remove_provider",
            "dat_registry_list_providers",
            "dat_registry_providers_related",
            "dat_strerror",
        ];
        for name in header_prototypes(&header("include/dat2/dat_api.h")).keys() {
            assert!(
                ours.contains(&name.as_str()) || registry_only.contains(&name.as_str()),
                "{name} has no argument list"
            );
        }
    }

    /// The boundary places a named parameter by the call's list, and a parameter the call
    /// lacks is DAT_INTERNAL_ERROR (after the debug assertion, caught by the guard), not an
    /// ARGn.
    #[test]
    fn guard_places_parameters_by_the_calls_list() {
        use crate::boundary::guard;
        use dat_abi::*;
        let code = |call: &Call, e: DatError| guard(call, || Err(e));
        let arg = |n: u32| DAT_CLASS_ERROR | DAT_INVALID_PARAMETER | (DAT_INVALID_ARG1 + n - 1);
        let local_iov = DatError::bad(Param::LocalIov);
        let flags = DatError::bad(Param::CompletionFlags);
        assert_eq!(code(&EP_POST_RDMA_READ, local_iov), arg(3));
        assert_eq!(code(&EP_POST_RDMA_READ_TO_RMR, local_iov), arg(2));
        assert_eq!(code(&EP_POST_RDMA_READ, flags), arg(6));
        assert_eq!(code(&EP_POST_RDMA_READ_TO_RMR, flags), arg(5));
        assert_eq!(code(&RMR_BIND, flags), arg(8));
        assert_eq!(
            code(&EP_DUP_CONNECT, DatError::bad_handle(Param::EpDupHandle)),
            DAT_CLASS_ERROR | DAT_INVALID_HANDLE | DAT_INVALID_HANDLE2
        );
        assert_eq!(
            code(&EP_POST_SEND, DatError::bad(Param::RemoteIov)),
            DatError::internal().code()
        );
        // Beyond DAT's ten argument subtypes there is no code to give.
        assert_eq!(
            code(&LMR_CREATE, DatError::bad(Param::RegisteredAddress)),
            DatError::internal().code()
        );
    }

    #[test]
    fn no_call_names_a_parameter_twice() {
        for call in ALL {
            for (i, p) in call.params.iter().enumerate() {
                assert!(!call.params[i + 1..].contains(p), "{}: {p:?}", call.name);
            }
        }
    }
}
