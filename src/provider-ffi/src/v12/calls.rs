//! The C argument list of every slot of the 1.2 provider table, stated once (as `crate::calls`
//! for 2.0, and checked against include/dat/dat_api.h). Slots that run a 2.0 entry point
//! unchanged are answered with that entry point's 2.0 list: the tests below hold each such
//! 1.2 list equal to its 2.0 one.

use crate::calls::{calls, Call};

calls! {
    IA_OPEN = dat_ia_open(Name, AsyncEvdQlen, AsyncEvdHandle, IaHandle);
    IA_CLOSE = dat_ia_close(IaHandle, CloseFlags);
    IA_QUERY = dat_ia_query(
        IaHandle, AsyncEvdHandle, IaAttrMask, IaAttr, ProviderAttrMask, ProviderAttr
    );
    SET_CONSUMER_CONTEXT = dat_set_consumer_context(Handle, Context);
    GET_CONSUMER_CONTEXT = dat_get_consumer_context(Handle, Context);
    GET_HANDLE_TYPE = dat_get_handle_type(Handle, HandleType);
    CNO_CREATE = dat_cno_create(IaHandle, Agent, CnoHandle);
    CNO_MODIFY_AGENT = dat_cno_modify_agent(CnoHandle, Agent);
    CNO_QUERY = dat_cno_query(CnoHandle, CnoParamMask, CnoParam);
    CNO_FREE = dat_cno_free(CnoHandle);
    CNO_WAIT = dat_cno_wait(CnoHandle, Timeout, EvdHandle);
    CR_QUERY = dat_cr_query(CrHandle, CrParamMask, CrParam);
    CR_ACCEPT = dat_cr_accept(CrHandle, EpHandle, PrivateDataSize, PrivateData);
    CR_REJECT = dat_cr_reject(CrHandle);
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
    EP_DUP_CONNECT = dat_ep_dup_connect(
        EpHandle, EpDupHandle, Timeout, PrivateDataSize, PrivateData, Qos
    );
    EP_DISCONNECT = dat_ep_disconnect(EpHandle, CloseFlags);
    EP_POST_SEND = dat_ep_post_send(EpHandle, NumSegments, LocalIov, UserCookie, CompletionFlags);
    EP_POST_RECV = dat_ep_post_recv(EpHandle, NumSegments, LocalIov, UserCookie, CompletionFlags);
    EP_POST_RDMA_READ = dat_ep_post_rdma_read(
        EpHandle, NumSegments, LocalIov, UserCookie, RemoteIov, CompletionFlags
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
        IaHandle, MemType, RegionDescription, Length, PzHandle, Privileges, LmrHandle, LmrContext,
        RmrContext, RegisteredLength, RegisteredAddress,
    );
    LMR_QUERY = dat_lmr_query(LmrHandle, LmrParamMask, LmrParam);
    LMR_FREE = dat_lmr_free(LmrHandle);
    LMR_SYNC_RDMA_READ = dat_lmr_sync_rdma_read(IaHandle, LocalSegments, NumSegments);
    LMR_SYNC_RDMA_WRITE = dat_lmr_sync_rdma_write(IaHandle, LocalSegments, NumSegments);
    RMR_CREATE = dat_rmr_create(PzHandle, RmrHandle);
    RMR_QUERY = dat_rmr_query(RmrHandle, RmrParamMask, RmrParam);
    RMR_BIND = dat_rmr_bind(
        RmrHandle, LmrTriplet, MemPriv, EpHandle, UserCookie, CompletionFlags, RmrContext
    );
    RMR_FREE = dat_rmr_free(RmrHandle);
    PSP_CREATE = dat_psp_create(IaHandle, ConnQual, EvdHandle, PspFlags, PspHandle);
    PSP_CREATE_ANY = dat_psp_create_any(IaHandle, ConnQual, EvdHandle, PspFlags, PspHandle);
    PSP_QUERY = dat_psp_query(PspHandle, PspParamMask, PspParam);
    PSP_FREE = dat_psp_free(PspHandle);
    RSP_CREATE = dat_rsp_create(IaHandle, ConnQual, EpHandle, EvdHandle, RspHandle);
    RSP_QUERY = dat_rsp_query(RspHandle, RspParamMask, RspParam);
    RSP_FREE = dat_rsp_free(RspHandle);
    PZ_CREATE = dat_pz_create(IaHandle, PzHandle);
    PZ_QUERY = dat_pz_query(PzHandle, PzParamMask, PzParam);
    PZ_FREE = dat_pz_free(PzHandle);
    SRQ_CREATE = dat_srq_create(IaHandle, PzHandle, SrqAttr, SrqHandle);
    SRQ_FREE = dat_srq_free(SrqHandle);
    SRQ_POST_RECV = dat_srq_post_recv(SrqHandle, NumSegments, LocalIov, UserCookie);
    SRQ_QUERY = dat_srq_query(SrqHandle, SrqParamMask, SrqParam);
    SRQ_RESIZE = dat_srq_resize(SrqHandle, SrqMaxRecvDto);
    SRQ_SET_LW = dat_srq_set_lw(SrqHandle, LowWatermark);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls as c20;

    fn header(rel: &str) -> String {
        format!("{}/../../{rel}", env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn every_call_matches_its_dat12_prototype() {
        let h = header("include/dat/dat_api.h");
        c20::check_against_header(ALL, &h, &["dat_ia_open"]);
        let openv = &c20::header_prototypes(&h)["dat_ia_openv"];
        let ours: Vec<&str> = IA_OPEN.params.iter().map(|p| p.c_name()).collect();
        assert_eq!(ours, openv[..ours.len()]);
    }

    #[test]
    fn every_dat12_prototype_has_its_call() {
        let ours: Vec<&str> = ALL.iter().map(|c| c.name).collect();
        let registry_only = [
            "dat_ia_openv",
            "dat_registry_add_provider",
            "dat_registry_remove_provider",
            "dat_registry_list_providers",
            "dat_strerror",
        ];
        for name in c20::header_prototypes(&header("include/dat/dat_api.h")).keys() {
            assert!(
                ours.contains(&name.as_str()) || registry_only.contains(&name.as_str()),
                "{name} has no argument list"
            );
        }
    }

    /// The 1.2 slots that run their 2.0 entry point (whose 2.0 list places their errors)
    /// have the same argument list as it.
    #[test]
    fn delegated_slots_share_the_2_0_list() {
        let own = [
            "dat_ia_open",
            "dat_lmr_create",
            "dat_rmr_bind",
            "dat_cr_reject",
        ];
        for call in ALL.iter().filter(|c| !own.contains(&c.name)) {
            let v20 = c20::ALL
                .iter()
                .find(|c| c.name == call.name)
                .unwrap_or_else(|| panic!("{} has no 2.0 call", call.name));
            let v20: Vec<&str> = v20.params.iter().map(|p| p.c_name()).collect();
            let ours: Vec<&str> = call.params.iter().map(|p| p.c_name()).collect();
            // 1.2 calls the IA's async EVD argument async_evd_*, 2.0 async_event_*.
            let ours: Vec<&str> = ours
                .iter()
                .map(|n| match *n {
                    "async_evd_qlen" => "async_event_qlen",
                    n => n,
                })
                .collect();
            assert_eq!(ours, v20, "{}", call.name);
        }
    }
}
