//! DAT 2.0 numbers the core needs (values from dat2-abi-dump.txt), so the core does not
//! depend on the ABI crate. The ffi layer may assert them against dat-abi.

/// DAT_TIMEOUT_INFINITE (microseconds otherwise).
pub const TIMEOUT_INFINITE: u32 = 0xffff_ffff;

pub mod evd_flags {
    pub const SOFTWARE: u32 = 0x01;
    pub const CR: u32 = 0x10;
    pub const DTO: u32 = 0x20;
    pub const CONNECTION: u32 = 0x40;
    pub const RMR_BIND: u32 = 0x80;
    pub const ASYNC: u32 = 0x100;
    pub const DEFAULT: u32 = 0x1f0;
    pub const ALL: u32 = SOFTWARE | CR | DTO | CONNECTION | RMR_BIND | ASYNC;
}

pub mod evd_state {
    pub const ENABLED: u32 = 1;
    pub const DISABLED: u32 = 2;
    pub const WAITABLE: u32 = 4;
    pub const UNWAITABLE: u32 = 8;
}

pub mod event_number {
    pub const DTO_COMPLETION: u32 = 0x0001;
    pub const RMR_BIND_COMPLETION: u32 = 0x1001;
    pub const CONNECTION_REQUEST: u32 = 0x2001;
    pub const CONNECTION_ESTABLISHED: u32 = 0x4001;
    pub const CONNECTION_PEER_REJECTED: u32 = 0x4002;
    pub const CONNECTION_NON_PEER_REJECTED: u32 = 0x4003;
    pub const CONNECTION_ACCEPT_COMPLETION_ERROR: u32 = 0x4004;
    pub const CONNECTION_DISCONNECTED: u32 = 0x4005;
    pub const CONNECTION_BROKEN: u32 = 0x4006;
    pub const CONNECTION_TIMED_OUT: u32 = 0x4007;
    pub const CONNECTION_UNREACHABLE: u32 = 0x4008;
    pub const ASYNC_EVD_OVERFLOW: u32 = 0x8001;
    pub const ASYNC_IA_CATASTROPHIC: u32 = 0x8002;
    pub const ASYNC_EP_BROKEN: u32 = 0x8003;
    pub const ASYNC_TIMED_OUT: u32 = 0x8004;
    pub const ASYNC_PROVIDER_INTERNAL_ERROR: u32 = 0x8005;
    pub const SOFTWARE: u32 = 0x10001;
}

/// The `reason` of an asynchronous error event (DAT_ASYNCH_ERROR_EVENT_DATA), which depends on
/// the type of the object the event names.
pub mod async_reason {
    /// DAT_EP_TRANSFER_TO_ERROR: the EP left its connection.
    pub const EP_TRANSFER_TO_ERROR: u32 = 0;
    /// DAT_SRQ_LOW_WATERMARK_EVENT: fewer receives are posted to the SRQ than its low watermark.
    pub const SRQ_LOW_WATERMARK: u32 = 2;
    /// DAT_SRQ_SOFT_HIGH_WATERMARK_EVENT (an EP reason): the Recv buffers at the EP exceed its
    /// soft high watermark (dat_ep_set_watermark).
    pub const EP_SOFT_HIGH_WATERMARK: u32 = 2;
}

/// DAT_DTO_COMPLETION_STATUS.
pub mod dto_status {
    pub const SUCCESS: u32 = 0;
    pub const FLUSHED: u32 = 1;
    pub const LOCAL_LENGTH: u32 = 2;
    pub const LOCAL_EP: u32 = 3;
    pub const LOCAL_PROTECTION: u32 = 4;
    pub const BAD_RESPONSE: u32 = 5;
    pub const REMOTE_ACCESS: u32 = 6;
    pub const REMOTE_RESPONDER: u32 = 7;
    pub const TRANSPORT: u32 = 8;
    pub const RECEIVER_NOT_READY: u32 = 9;
    pub const PARTIAL_PACKET: u32 = 10;
    pub const RMR_OPERATION_FAILED: u32 = 11;
    pub const LOCAL_MM_ERROR: u32 = 12;
}

/// DAT_DTOS: the operation reported in a DTO completion.
pub mod dto_op {
    pub const SEND: u32 = 0;
    pub const RDMA_WRITE: u32 = 1;
    pub const RDMA_READ: u32 = 2;
    pub const RECEIVE: u32 = 3;
    pub const RECEIVE_WITH_INVALIDATE: u32 = 4;
    pub const BIND_MW: u32 = 5;
}

pub mod completion_flags {
    pub const DEFAULT: u32 = 0;
    pub const SUPPRESS: u32 = 0x01;
    pub const SOLICITED_WAIT: u32 = 0x02;
    pub const UNSIGNALLED: u32 = 0x04;
    pub const BARRIER_FENCE: u32 = 0x08;
    pub const EVD_THRESHOLD: u32 = 0x10;
    pub const LMR_INVALIDATE_FENCE: u32 = 0x20;
}

pub mod mem_priv {
    pub const NONE: u32 = 0;
    pub const LOCAL_READ: u32 = 0x01;
    pub const REMOTE_READ: u32 = 0x02;
    pub const LOCAL_WRITE: u32 = 0x10;
    pub const REMOTE_WRITE: u32 = 0x20;
    /// DAT_MEM_PRIV_ALL_FLAG.
    pub const ALL: u32 = 0x33;
    /// DAT_IB_MEM_PRIV_REMOTE_ATOMIC (the IB extension's privilege for fetch-and-add and
    /// compare-and-swap by a peer).
    pub const REMOTE_ATOMIC: u32 = 0x40;
    /// Every privilege bit we accept.
    pub const KNOWN: u32 = ALL | REMOTE_ATOMIC;
}

/// The InfiniBand extensions of DAT 2.0 (interface 2.0.9): what their completions look like.
pub mod ib_ext {
    /// DAT_IB_DTO_EVENT: a DTO completion of an extended operation, or a receive that carries
    /// immediate data.
    pub const DTO_EVENT: u32 = 0x40000;
    /// DAT_IB_EXT_TYPE values (the `type` of the event's extension data).
    pub const TYPE_FETCH_AND_ADD: u32 = 0;
    pub const TYPE_CMP_AND_SWAP: u32 = 1;
    pub const TYPE_RDMA_WRITE_IMMED: u32 = 2;
    pub const TYPE_RDMA_WRITE_IMMED_DATA: u32 = 3;
    /// DAT_IB_DTOS values (the event's `operation`).
    pub const DTO_RDMA_WRITE_IMMED: u32 = 8;
    pub const DTO_RECV_IMMED: u32 = 9;
    pub const DTO_FETCH_ADD: u32 = 10;
    pub const DTO_CMP_SWAP: u32 = 11;
    /// Unreliable datagrams: DAT_IB_SERVICE_TYPE_UD, the event numbers of address
    /// resolution, the extension types of its events and of datagram completions
    /// (DAT_IB_UD_*), and the operations of datagram completions (DAT_IB_DTO_SEND_UD,
    /// DAT_IB_DTO_RECV_UD).
    pub const SERVICE_TYPE_UD: u32 = 1;
    pub const UD_CONNECTION_REQUEST_EVENT: u32 = 0x40001;
    pub const UD_CONNECTION_EVENT_ESTABLISHED: u32 = 0x40002;
    pub const UD_CONNECTION_REJECT_EVENT: u32 = 0x40003;
    pub const UD_CONNECTION_ERROR_EVENT: u32 = 0x40004;
    pub const TYPE_UD_CONNECT_REQUEST: u32 = 5;
    pub const TYPE_UD_REMOTE_AH: u32 = 6;
    pub const TYPE_UD_PASSIVE_REMOTE_AH: u32 = 7;
    pub const TYPE_UD_SEND: u32 = 8;
    pub const TYPE_UD_RECV: u32 = 9;
    pub const TYPE_UD_CONNECT_REJECT: u32 = 10;
    pub const TYPE_UD_CONNECT_ERROR: u32 = 11;
    pub const DTO_SEND_UD: u32 = 13;
    pub const DTO_RECV_UD: u32 = 14;
}

pub mod close_flags {
    pub const ABRUPT: u32 = 0;
    pub const GRACEFUL: u32 = 1;
}

pub mod psp_flags {
    pub const CONSUMER: u32 = 0;
    pub const PROVIDER: u32 = 1;
}

/// DAT_HANDLE_TYPE values returned by dat_get_handle_type.
pub mod handle_type {
    pub const CR: u32 = 0;
    pub const EP: u32 = 1;
    pub const EVD: u32 = 2;
    pub const IA: u32 = 3;
    pub const LMR: u32 = 4;
    pub const PSP: u32 = 5;
    pub const PZ: u32 = 6;
    pub const RMR: u32 = 7;
    pub const RSP: u32 = 8;
    pub const CNO: u32 = 9;
    pub const SRQ: u32 = 10;
    pub const CSP: u32 = 11;
}
