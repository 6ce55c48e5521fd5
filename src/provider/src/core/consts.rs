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
    pub const ALL: u32 = 0x33;
}

/// DAT_EP_STATE values.
pub mod ep_state {
    pub const UNCONNECTED: u32 = 0;
    pub const UNCONFIGURED_UNCONNECTED: u32 = 1;
    pub const RESERVED: u32 = 2;
    pub const UNCONFIGURED_RESERVED: u32 = 3;
    pub const PASSIVE_CONNECTION_PENDING: u32 = 4;
    pub const UNCONFIGURED_PASSIVE: u32 = 5;
    pub const ACTIVE_CONNECTION_PENDING: u32 = 6;
    pub const TENTATIVE_CONNECTION_PENDING: u32 = 7;
    pub const UNCONFIGURED_TENTATIVE: u32 = 8;
    pub const CONNECTED: u32 = 9;
    pub const DISCONNECT_PENDING: u32 = 10;
    pub const DISCONNECTED: u32 = 11;
    pub const COMPLETION_PENDING: u32 = 12;
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
