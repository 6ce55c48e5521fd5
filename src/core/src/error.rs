//! DAT_RETURN as a Rust error: every error the core produces is a (type, subtype) pair whose
//! numeric values are exactly those of DAT 2.0, so the ffi layer returns `err.code()` unchanged.

use std::fmt;

use daplrs_backend as backend;

/// Error class bit of a DAT_RETURN (DAT_CLASS_ERROR).
pub const CLASS_ERROR: u32 = 0x8000_0000;
/// DAT_SUCCESS.
pub const SUCCESS: u32 = 0;

/// DAT_RETURN_TYPE: bits 29..16 of a DAT_RETURN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorType {
    Abort = 0x0001_0000,
    ConnQualInUse = 0x0002_0000,
    InsufficientResources = 0x0003_0000,
    InternalError = 0x0004_0000,
    InvalidHandle = 0x0005_0000,
    InvalidParameter = 0x0006_0000,
    InvalidState = 0x0007_0000,
    LengthError = 0x0008_0000,
    ModelNotSupported = 0x0009_0000,
    ProviderNotFound = 0x000a_0000,
    PrivilegesViolation = 0x000b_0000,
    ProtectionViolation = 0x000c_0000,
    QueueEmpty = 0x000d_0000,
    QueueFull = 0x000e_0000,
    TimeoutExpired = 0x000f_0000,
    ProviderAlreadyRegistered = 0x0010_0000,
    ProviderInUse = 0x0011_0000,
    InvalidAddress = 0x0012_0000,
    InterruptedCall = 0x0013_0000,
    ConnQualUnavailable = 0x0014_0000,
    ReservedLmr = 0x0015_0000,
    PortInUse = 0x0016_0000,
    CommNotSupported = 0x0017_0000,
    NotImplemented = 0x3fff_0000,
}

/// DAT_RETURN_SUBTYPE: bits 15..0 of a DAT_RETURN (DAT 2.0 numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum SubType {
    None = 0,
    SubInterrupted = 1,
    ResourceMemory = 2,
    ResourceDevice = 3,
    ResourceTep = 4,
    ResourceTevd = 5,
    ResourceProtectionDomain = 6,
    ResourceMemoryRegion = 7,
    ResourceErrorHandler = 8,
    ResourceCredits = 9,
    ResourceSrq = 10,
    InvalidHandleIa = 11,
    InvalidHandleEp = 12,
    InvalidHandleLmr = 13,
    InvalidHandleRmr = 14,
    InvalidHandlePz = 15,
    InvalidHandlePsp = 16,
    InvalidHandleRsp = 17,
    InvalidHandleCr = 18,
    InvalidHandleCno = 19,
    InvalidHandleEvdCr = 20,
    InvalidHandleEvdRequest = 21,
    InvalidHandleEvdRecv = 22,
    InvalidHandleEvdConn = 23,
    InvalidHandleEvdAsync = 24,
    InvalidHandleSrq = 25,
    InvalidHandleCsp = 26,
    InvalidHandle1 = 27,
    InvalidHandle2 = 28,
    InvalidHandle3 = 29,
    InvalidHandle4 = 30,
    InvalidHandle5 = 31,
    InvalidHandle6 = 32,
    InvalidHandle7 = 33,
    InvalidHandle8 = 34,
    InvalidHandle9 = 35,
    InvalidHandle10 = 36,
    InvalidArg1 = 37,
    InvalidArg2 = 38,
    InvalidArg3 = 39,
    InvalidArg4 = 40,
    InvalidArg5 = 41,
    InvalidArg6 = 42,
    InvalidArg7 = 43,
    InvalidArg8 = 44,
    InvalidArg9 = 45,
    InvalidArg10 = 46,
    EpUnconnected = 47,
    EpActConnPending = 48,
    EpPassConnPending = 49,
    EpTentConnPending = 50,
    EpConnected = 51,
    EpDisconnected = 52,
    EpReserved = 53,
    EpComplPending = 54,
    EpDiscPending = 55,
    EpProviderControl = 56,
    EpNotReady = 57,
    EpRecvWatermark = 58,
    EpPz = 59,
    EpEvdRequest = 60,
    EpEvdRecv = 61,
    EpEvdConnect = 62,
    EpUnconfigured = 63,
    EpUnconfReserved = 64,
    EpUnconfPassive = 65,
    EpUnconfTentative = 66,
    CnoInUse = 67,
    CnoDead = 68,
    EvdOpen = 69,
    EvdEnabled = 70,
    EvdDisabled = 71,
    EvdWaitable = 72,
    EvdUnwaitable = 73,
    EvdInUse = 74,
    EvdConfigNotify = 75,
    EvdConfigSolicited = 76,
    EvdConfigThreshold = 77,
    EvdWaiter = 78,
    EvdAsync = 79,
    IaInUse = 80,
    LmrInUse = 81,
    LmrFree = 82,
    PzInUse = 83,
    PzFree = 84,
    SrqOperational = 85,
    SrqError = 86,
    SrqInUse = 87,
    SrqShutdown = 88,
    PrivilegesRead = 89,
    PrivilegesWrite = 90,
    PrivilegesRdmaRead = 91,
    PrivilegesRdmaWrite = 92,
    ProtectionRead = 93,
    ProtectionWrite = 94,
    ProtectionRdmaRead = 95,
    ProtectionRdmaWrite = 96,
    InvalidAddressUnsupported = 97,
    InvalidAddressUnreachable = 98,
    InvalidAddressMalformed = 99,
    NameNotRegistered = 100,
    MajorNotFound = 101,
    MinorNotFound = 102,
    ThreadSafetyNotFound = 103,
}

impl SubType {
    /// DAT_INVALID_ARGn for a 1-based argument position (1..=10).
    pub fn arg(position: usize) -> Option<SubType> {
        Some(match position {
            1 => SubType::InvalidArg1,
            2 => SubType::InvalidArg2,
            3 => SubType::InvalidArg3,
            4 => SubType::InvalidArg4,
            5 => SubType::InvalidArg5,
            6 => SubType::InvalidArg6,
            7 => SubType::InvalidArg7,
            8 => SubType::InvalidArg8,
            9 => SubType::InvalidArg9,
            10 => SubType::InvalidArg10,
            _ => return None,
        })
    }

    /// DAT_INVALID_HANDLEn for a 1-based argument position (1..=10).
    pub fn handle_arg(position: usize) -> Option<SubType> {
        Some(match position {
            1 => SubType::InvalidHandle1,
            2 => SubType::InvalidHandle2,
            3 => SubType::InvalidHandle3,
            4 => SubType::InvalidHandle4,
            5 => SubType::InvalidHandle5,
            6 => SubType::InvalidHandle6,
            7 => SubType::InvalidHandle7,
            8 => SubType::InvalidHandle8,
            9 => SubType::InvalidHandle9,
            10 => SubType::InvalidHandle10,
            _ => return None,
        })
    }
}

/// Declares [`Param`] with each variant's C parameter name.
macro_rules! params {
    ($($(#[$doc:meta])* $variant:ident = $c_name:literal,)*) => {
        /// A parameter of a DAT call, by its C name: what the core names when it refuses an
        /// argument. The core never knows where a parameter sits in a C argument list; the C
        /// boundary (provider-ffi) turns a `Param` into DAT_INVALID_ARGn / DAT_INVALID_HANDLEn
        /// with the argument list of the entry point it serves, declared there once per call.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Param {
            $($(#[$doc])* $variant,)*
        }

        impl Param {
            /// Every parameter.
            pub const ALL: &'static [Param] = &[$(Param::$variant,)*];

            /// The parameter's name in the DAT headers' prototypes.
            pub const fn c_name(self) -> &'static str {
                match self {
                    $(Param::$variant => $c_name,)*
                }
            }
        }
    };
}

params! {
    Address = "address",
    Agent = "agent",
    Answer = "answer",
    AsyncEvdHandle = "async_evd_handle",
    AsyncEventHandle = "async_event_handle",
    AsyncEventQlen = "async_event_qlen",
    AsyncEvdQlen = "async_evd_qlen",
    BufsAllocSpan = "bufs_alloc_span",
    CloseFlags = "close_flags",
    CnoHandle = "cno_handle",
    CnoParam = "cno_param",
    CnoParamMask = "cno_param_mask",
    Comm = "comm",
    CompletionFlags = "completion_flags",
    ConnQual = "conn_qual",
    ConnectEvdHandle = "connect_evd_handle",
    ConnectFlags = "connect_flags",
    Context = "context",
    CrHandle = "cr_handle",
    CrParam = "cr_param",
    CrParamMask = "cr_param_mask",
    CspHandle = "csp_handle",
    CspParam = "csp_param",
    CspParamMask = "csp_param_mask",
    EpAttributes = "ep_attributes",
    EpDupHandle = "ep_dup_handle",
    EpHandle = "ep_handle",
    EpParam = "ep_param",
    EpParamMask = "ep_param_mask",
    EpState = "ep_state",
    EvdFlags = "evd_flags",
    EvdHandle = "evd_handle",
    EvdMinQlen = "evd_min_qlen",
    EvdParam = "evd_param",
    EvdParamMask = "evd_param_mask",
    EvdQlen = "evd_qlen",
    Event = "event",
    Fd = "fd",
    Handle = "handle",
    HandleType = "handle_type",
    Handoff = "handoff",
    HardHighWatermark = "hard_high_watermark",
    IaAttr = "ia_attr",
    IaAttrMask = "ia_attr_mask",
    IaHandle = "ia_handle",
    InvalidateFlag = "invalidate_flag",
    Length = "length",
    LmrContext = "lmr_context",
    LmrHandle = "lmr_handle",
    LmrParam = "lmr_param",
    LmrParamMask = "lmr_param_mask",
    LmrTriplet = "lmr_triplet",
    LocalIov = "local_iov",
    LocalSegments = "local_segments",
    LowWatermark = "low_watermark",
    MemPriv = "mem_priv",
    MemType = "mem_type",
    Name = "name",
    NbufsAllocated = "nbufs_allocated",
    Nmore = "nmore",
    NumSegments = "num_segments",
    PrivateData = "private_data",
    PrivateDataSize = "private_data_size",
    Privileges = "privileges",
    ProviderAttr = "provider_attr",
    Provider = "provider",
    ProviderAttrMask = "provider_attr_mask",
    Provider1 = "provider1",
    Provider2 = "provider2",
    PspFlags = "psp_flags",
    PspHandle = "psp_handle",
    PspParam = "psp_param",
    PspParamMask = "psp_param_mask",
    PzHandle = "pz_handle",
    PzParam = "pz_param",
    PzParamMask = "pz_param_mask",
    Qos = "qos",
    RecvEvdHandle = "recv_evd_handle",
    RecvIdle = "recv_idle",
    RegionDescription = "region_description",
    RegisteredAddress = "registered_address",
    RegisteredLength = "registered_length",
    RemoteConnQual = "remote_conn_qual",
    RemoteIaAddress = "remote_ia_address",
    RemoteIov = "remote_iov",
    RequestEvdHandle = "request_evd_handle",
    RequestIdle = "request_idle",
    RmrContext = "rmr_context",
    RmrHandle = "rmr_handle",
    RmrParam = "rmr_param",
    RmrParamMask = "rmr_param_mask",
    RspHandle = "rsp_handle",
    RspParam = "rsp_param",
    RspParamMask = "rsp_param_mask",
    SoftHighWatermark = "soft_high_watermark",
    SrqAttr = "srq_attr",
    SrqHandle = "srq_handle",
    SrqMaxRecvDto = "srq_max_recv_dto",
    SrqParam = "srq_param",
    SrqParamMask = "srq_param_mask",
    Threshold = "threshold",
    Timeout = "timeout",
    UserCookie = "user_cookie",
    VaType = "va_type",
    /// dat_extension_op's operation code (argument 2 of every IB extension call).
    ExtOp = "op",
    /// dat_ib_post_fetch_and_add's addend.
    AddValue = "add_val",
    /// dat_ib_post_cmp_and_swap's compare value.
    CompareValue = "cmp_val",
    /// dat_ib_post_cmp_and_swap's swap value.
    SwapValue = "swap_val",
    /// dat_ib_post_rdma_write_immed's immediate data.
    ImmediateData = "idata",
    /// The DAT_IB_ADDR_HANDLE of dat_ib_post_send_ud and dat_ib_ud_ah_free.
    AddressHandle = "ah_ptr",
    /// dat_ib_ud_cm_free's resolution record.
    UdCm = "cm",
    /// dat_ib_query_counters / dat_ib_print_counters: which counter.
    Counter = "cntr",
    /// dat_ib_query_counters' output array.
    CountersOut = "p_cntrs_out",
    /// dat_ib_query_counters / dat_ib_print_counters: reset after reading.
    Reset = "reset",
}

/// A DAT error: maps 1:1 onto the DAT_RETURN value the C caller sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DatError {
    pub kind: ErrorType,
    pub sub: SubType,
    /// The refused parameter of a DAT_INVALID_PARAMETER or positional DAT_INVALID_HANDLE
    /// (`sub` is then `None` until the C boundary places it: see [`DatError::code_in`]).
    pub param: Option<Param>,
}

pub type DatResult<T> = Result<T, DatError>;

impl DatError {
    pub const fn new(kind: ErrorType, sub: SubType) -> DatError {
        DatError {
            kind,
            sub,
            param: None,
        }
    }

    /// The exact DAT_RETURN value: DAT_CLASS_ERROR | type | subtype. An error naming a
    /// parameter has no argument subtype here: see [`DatError::code_in`].
    #[inline]
    pub fn code(&self) -> u32 {
        CLASS_ERROR | self.kind as u32 | self.sub as u16 as u32
    }

    /// The DAT_RETURN of this error in a call whose C arguments are `params`, in order: a
    /// refused parameter becomes DAT_INVALID_ARGn (DAT_INVALID_HANDLEn for a handle) for its
    /// position there. A parameter the call does not have is the provider's bug, never some
    /// ARGn: `Err` with the parameter, for the caller to report (as DAT_INTERNAL_ERROR).
    ///
    /// Inlined into the boundary: most errors name no parameter (an empty dequeue's
    /// DAT_QUEUE_EMPTY), and they need no call.
    #[inline]
    pub fn code_in(&self, params: &[Param]) -> Result<u32, Param> {
        match self.param {
            None => Ok(self.code()),
            Some(param) => self.code_at(param, params),
        }
    }

    /// `code_in` for an error that names `param`.
    fn code_at(&self, param: Param, params: &[Param]) -> Result<u32, Param> {
        let position = params.iter().position(|p| *p == param).ok_or(param)? + 1;
        let sub = match self.kind {
            ErrorType::InvalidHandle => SubType::handle_arg(position),
            _ => SubType::arg(position),
        }
        .ok_or(param)?;
        Ok(DatError { sub, ..*self }.code())
    }

    pub const fn invalid_handle(sub: SubType) -> DatError {
        DatError::new(ErrorType::InvalidHandle, sub)
    }
    /// DAT_INVALID_PARAMETER for `param` (DAT_INVALID_ARGn, n its C position).
    pub const fn bad(param: Param) -> DatError {
        DatError {
            kind: ErrorType::InvalidParameter,
            sub: SubType::None,
            param: Some(param),
        }
    }
    /// DAT_INVALID_HANDLE for the handle `param` where DAT names it by position
    /// (DAT_INVALID_HANDLEn) rather than by its kind.
    pub const fn bad_handle(param: Param) -> DatError {
        DatError {
            kind: ErrorType::InvalidHandle,
            sub: SubType::None,
            param: Some(param),
        }
    }
    pub const fn invalid_state(sub: SubType) -> DatError {
        DatError::new(ErrorType::InvalidState, sub)
    }
    pub const fn resources(sub: SubType) -> DatError {
        DatError::new(ErrorType::InsufficientResources, sub)
    }
    pub const fn internal() -> DatError {
        DatError::new(ErrorType::InternalError, SubType::None)
    }
    pub const fn timeout() -> DatError {
        DatError::new(ErrorType::TimeoutExpired, SubType::None)
    }
    pub const fn queue_empty() -> DatError {
        DatError::new(ErrorType::QueueEmpty, SubType::None)
    }
    pub const fn queue_full() -> DatError {
        DatError::new(ErrorType::QueueFull, SubType::None)
    }
    pub const fn not_implemented() -> DatError {
        DatError::new(ErrorType::NotImplemented, SubType::None)
    }
    pub const fn length() -> DatError {
        DatError::new(ErrorType::LengthError, SubType::None)
    }
    pub const fn interrupted() -> DatError {
        DatError::new(ErrorType::InterruptedCall, SubType::None)
    }
    pub const fn plain(kind: ErrorType) -> DatError {
        DatError::new(kind, SubType::None)
    }
}

impl fmt::Display for DatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.param {
            Some(p) => write!(
                f,
                "{:?} of {} (0x{:08x})",
                self.kind,
                p.c_name(),
                self.code()
            ),
            None => write!(f, "{:?}/{:?} (0x{:08x})", self.kind, self.sub, self.code()),
        }
    }
}

impl std::error::Error for DatError {}

/// The DAT code of a backend's failure: the one place a `backend::Error` becomes a DAT_RETURN.
///
/// `arg` is the parameter, in the DAT call being served, of the input a backend may refuse (scatter-gather list, address handle, memory range, the EP's EVDs):
/// its refusals (`TooLong`, `Foreign`, `Invalid`, `BadAddress`) are DAT_INVALID_PARAMETER
/// naming that argument. With `None` the core's own validation leaves the backend nothing of
/// the caller's to refuse, so a refusal is the provider's fault: DAT_INTERNAL_ERROR.
pub fn from_backend(e: backend::Error, arg: Option<Param>) -> DatError {
    use backend::{Error, Resource};
    match e {
        Error::NoResource(r) => DatError::resources(match r {
            Resource::Memory => SubType::ResourceMemory,
            Resource::Device => SubType::ResourceDevice,
            Resource::Qp => SubType::ResourceTep,
            Resource::Srq => SubType::ResourceSrq,
            Resource::Pd => SubType::ResourceProtectionDomain,
            Resource::Key => SubType::ResourceMemoryRegion,
            Resource::WorkQueue | Resource::Host => SubType::None,
        }),
        Error::NoDevice => DatError::new(ErrorType::ProviderNotFound, SubType::ResourceDevice),
        Error::BadState => DatError::invalid_state(SubType::None),
        Error::NotConnected => DatError::invalid_state(SubType::EpNotReady),
        Error::TooLong | Error::Foreign | Error::Invalid | Error::BadAddress => match arg {
            Some(param) => DatError::bad(param),
            None => DatError::internal(),
        },
        Error::Unsupported => DatError::not_implemented(),
        Error::AddrInUse => DatError::plain(ErrorType::ConnQualInUse),
        Error::Internal => DatError::internal(),
    }
}

/// A backend failure in a call whose arguments the core validated completely (see
/// `from_backend`).
impl From<backend::Error> for DatError {
    fn from(e: backend::Error) -> DatError {
        from_backend(e, None)
    }
}

/// Turns a `DatResult<()>` into the DAT_RETURN the ffi layer hands back.
pub fn to_code(result: &DatResult<()>) -> u32 {
    match result {
        Ok(()) => SUCCESS,
        Err(e) => e.code(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_the_dat2_dump() {
        assert_eq!(
            DatError::invalid_handle(SubType::InvalidHandleEp).code(),
            0x8005_000c
        );
        assert_eq!(
            DatError::invalid_handle(SubType::InvalidHandleIa).code(),
            0x8005_000b
        );
        let post_send = [
            Param::EpHandle,
            Param::NumSegments,
            Param::LocalIov,
            Param::UserCookie,
            Param::CompletionFlags,
        ];
        assert_eq!(
            DatError::bad(Param::NumSegments).code_in(&post_send),
            Ok(0x8006_0026)
        );
        assert_eq!(
            DatError::bad_handle(Param::LocalIov).code_in(&post_send),
            Ok(0x8005_001d)
        );
        assert_eq!(
            DatError::bad(Param::RemoteIov).code_in(&post_send),
            Err(Param::RemoteIov)
        );
        assert_eq!(DatError::queue_empty().code_in(&post_send), Ok(0x800d_0000));
        assert_eq!(
            DatError::invalid_state(SubType::EpDisconnected).code(),
            0x8007_0034
        );
        assert_eq!(
            DatError::new(ErrorType::ProviderNotFound, SubType::NameNotRegistered).code(),
            0x800a_0064
        );
        assert_eq!(DatError::queue_empty().code(), 0x800d_0000);
        assert_eq!(DatError::timeout().code(), 0x800f_0000);
        assert_eq!(
            DatError::resources(SubType::ResourceMemory).code(),
            0x8003_0002
        );
        assert_eq!(SubType::InvalidHandle1 as u16, 27);
        assert_eq!(SubType::InvalidArg1 as u16, 37);
        assert_eq!(SubType::EpUnconfTentative as u16, 66);
        assert_eq!(SubType::EvdWaiter as u16, 78);
        assert_eq!(SubType::IaInUse as u16, 80);
        assert_eq!(SubType::PzInUse as u16, 83);
        assert_eq!(SubType::SrqShutdown as u16, 88);
        assert_eq!(SubType::PrivilegesRead as u16, 89);
        assert_eq!(SubType::InvalidAddressUnsupported as u16, 97);
        assert_eq!(SubType::ThreadSafetyNotFound as u16, 103);
        assert_eq!(DatError::not_implemented().code(), 0xbfff_0000);
    }

    /// The codes the backends' errors had when the backends built them.
    /// Naming the parameter costs no space: every DatResult stays as small as before.
    #[test]
    fn a_named_parameter_fits_in_the_padding() {
        assert_eq!(std::mem::size_of::<DatError>(), 8);
        assert_eq!(std::mem::size_of::<DatResult<()>>(), 8);
    }

    #[test]
    fn param_names_are_distinct() {
        let mut names: Vec<&str> = Param::ALL.iter().map(|p| p.c_name()).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn backend_errors_keep_their_dat_codes() {
        use daplrs_backend::{Error, Resource};
        let code = |e, arg| from_backend(e, arg).code();
        assert_eq!(code(Error::NoResource(Resource::Memory), None), 0x8003_0002);
        assert_eq!(code(Error::NoResource(Resource::Device), None), 0x8003_0003);
        assert_eq!(code(Error::NoResource(Resource::Qp), None), 0x8003_0004);
        assert_eq!(code(Error::NoResource(Resource::Pd), None), 0x8003_0006);
        assert_eq!(code(Error::NoResource(Resource::Key), None), 0x8003_0007);
        assert_eq!(code(Error::NoResource(Resource::Srq), None), 0x8003_000a);
        assert_eq!(
            code(Error::NoResource(Resource::WorkQueue), None),
            0x8003_0000
        );
        assert_eq!(code(Error::NoResource(Resource::Host), None), 0x8003_0000);
        assert_eq!(code(Error::NoDevice, None), 0x800a_0003);
        assert_eq!(code(Error::BadState, Some(Param::NumSegments)), 0x8007_0000);
        assert_eq!(code(Error::NotConnected, None), 0x8007_0039);
        assert_eq!(code(Error::AddrInUse, None), 0x8002_0000);
        assert_eq!(code(Error::Unsupported, None), 0xbfff_0000);
        assert_eq!(code(Error::Internal, Some(Param::EpHandle)), 0x8004_0000);
        for e in [
            Error::TooLong,
            Error::Foreign,
            Error::Invalid,
            Error::BadAddress,
        ] {
            assert_eq!(
                from_backend(e, Some(Param::LocalIov)),
                DatError::bad(Param::LocalIov)
            );
            assert_eq!(code(e, None), DatError::internal().code());
            assert_eq!(DatError::from(e), DatError::internal());
        }
    }
}
