//! Where C meets Rust: the panic guard, and every conversion of a raw
//! pointer the C caller hands us. Other modules of this crate call these
//! helpers instead of dereferencing pointers themselves.

use crate::calls::Call;
use daplrs::backend::Sge;
use daplrs::core::ep::RemoteBuffer;
use daplrs::core::error::{DatError, DatResult, ErrorType, Param, SubType};
use daplrs::core::handle::Handle;
use dat_abi::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs one provider entry point, `call`: its error becomes the DAT_RETURN (a refused
/// parameter the DAT_INVALID_ARGn of its position in `call`), and a panic becomes
/// DAT_INTERNAL_ERROR instead of unwinding into C.
pub(crate) fn guard(call: &Call, f: impl FnOnce() -> DatResult<()>) -> DAT_RETURN {
    // The error is placed inside the unwind guard: a debug build's assertion there must not
    // cross into C either.
    match catch_unwind(AssertUnwindSafe(|| f().map_err(|e| call.code_of(e)))) {
        Ok(Ok(())) => DAT_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => {
            log::error!("panic caught at the provider's C boundary");
            DatError::internal().code()
        }
    }
}

/// A handle value as the core knows it; nothing is read through it.
pub(crate) fn h(p: DAT_HANDLE) -> Handle {
    Handle::from_ptr(p)
}

/// The C handle of a core handle.
pub(crate) fn c(h: Handle) -> DAT_HANDLE {
    h.as_ptr()
}

/// An OUT parameter: NULL is DAT_INVALID_PARAMETER for `param`.
///
/// # Safety
/// `p` is NULL or points to writable memory of a `T` (the C contract).
pub(crate) unsafe fn out<'a, T>(p: *mut T, param: Param) -> DatResult<&'a mut T> {
    // SAFETY: `p` is NULL or points to a writable value of its type (the C caller's contract).
    unsafe { p.as_mut() }.ok_or(DatError::bad(param))
}

/// An IN struct: NULL is DAT_INVALID_PARAMETER for `param`.
///
/// # Safety
/// `p` is NULL or points to a readable `T`.
pub(crate) unsafe fn input<'a, T>(p: *const T, param: Param) -> DatResult<&'a T> {
    // SAFETY: `p` is NULL or points to a readable value of its type (the C caller's contract).
    unsafe { p.as_ref() }.ok_or(DatError::bad(param))
}

/// Most IOVs are short: keep up to this many segments on the stack.
const INLINE_SEGMENTS: usize = 8;

/// Where a local IOV copied out of the caller's DAT_LMR_TRIPLET array lives: on the stack
/// up to `INLINE_SEGMENTS` segments, else on the heap. The caller owns it and `read` hands
/// back the segments by reference: returned by value, the inline array (136 bytes) was
/// copied once more on every post. The inline array starts uninitialized: `read` writes
/// the segments it hands back, and zeroing all eight first cost each post 13 instructions.
pub(crate) struct IovBuf {
    inline: [MaybeUninit<Sge>; INLINE_SEGMENTS],
    heap: Vec<Sge>,
}

impl IovBuf {
    #[inline(always)]
    pub(crate) fn new() -> IovBuf {
        IovBuf {
            inline: [MaybeUninit::uninit(); INLINE_SEGMENTS],
            heap: Vec::new(),
        }
    }

    /// Reads `n` triplets at `p` (local_iov, num_segments). A negative count, or
    /// one above `max` (the object's IOV limit), is DAT_INVALID_PARAMETER for
    /// num_segments, refused before the array is touched (a count of 1 << 30 must
    /// not make us read a gigabyte past one triplet); a NULL array with segments
    /// is for local_iov. Zero segments (a zero-length message) may come with a
    /// NULL array.
    ///
    /// # Safety
    /// `p` is NULL or points to `n` readable triplets.
    // Inlined into each post: the copy is built in the caller's frame.
    #[inline(always)]
    pub(crate) unsafe fn read<T: LocalTriplet>(
        &mut self,
        p: *const T,
        n: DAT_COUNT,
        max: u32,
    ) -> DatResult<&[Sge]> {
        if n < 0 || n as u64 > u64::from(max) {
            return Err(DatError::bad(Param::NumSegments));
        }
        if n == 0 {
            return Ok(&[]);
        }
        if p.is_null() {
            return Err(DatError::bad(Param::LocalIov));
        }
        // SAFETY: `p` is not NULL (checked above) and points to `n` readable triplets (our
        // contract); `n` is positive and at most `max`.
        let triplets = unsafe { std::slice::from_raw_parts(p, n as usize) };
        if triplets.len() <= INLINE_SEGMENTS {
            let segments = &mut self.inline[..triplets.len()];
            for (d, t) in segments.iter_mut().zip(triplets) {
                d.write(t.sge()?);
            }
            // SAFETY: the loop above wrote every one of these segments (an error left it).
            Ok(unsafe { &*(segments as *const [MaybeUninit<Sge>] as *const [Sge]) })
        } else {
            self.heap = triplets.iter().map(|t| t.sge()).collect::<DatResult<_>>()?;
            Ok(&self.heap)
        }
    }
}

/// One element of a C local IOV (DAT_LMR_TRIPLET of either DAT version).
pub(crate) trait LocalTriplet {
    /// The segment as the core posts it. A segment the core cannot carry
    /// (DAT 1.2's 64-bit length beyond 32 bits) is the error.
    fn sge(&self) -> DatResult<Sge>;
    /// (address, length) for dat_lmr_sync_rdma_*.
    fn span(&self) -> (u64, u64);
}

impl LocalTriplet for DAT_LMR_TRIPLET {
    fn sge(&self) -> DatResult<Sge> {
        Ok(Sge {
            addr: self.virtual_address,
            length: self.segment_length,
            lkey: self.lmr_context,
        })
    }
    fn span(&self) -> (u64, u64) {
        (self.virtual_address, u64::from(self.segment_length))
    }
}

/// The remote buffer of an RDMA DTO (DAT_RMR_TRIPLET of either version).
pub(crate) trait RemoteTriplet {
    fn remote(&self) -> DatResult<RemoteBuffer>;
}

impl RemoteTriplet for DAT_RMR_TRIPLET {
    fn remote(&self) -> DatResult<RemoteBuffer> {
        Ok(RemoteBuffer {
            address: self.virtual_address,
            length: self.segment_length,
            rmr_context: self.rmr_context,
        })
    }
}

/// DAT 1.2's 24-byte triplet: its 64-bit length must fit the 32 bits one
/// segment of the core carries. A longer segment is DAT_LENGTH_ERROR: no
/// transfer of ours can be that long (the largest message and RDMA sizes
/// are 32-bit), the error the core gives a transfer beyond those sizes.
impl LocalTriplet for dat_abi12::DAT_LMR_TRIPLET {
    fn sge(&self) -> DatResult<Sge> {
        Ok(Sge {
            addr: self.virtual_address,
            length: u32::try_from(self.segment_length).map_err(|_| DatError::length())?,
            lkey: self.lmr_context,
        })
    }
    fn span(&self) -> (u64, u64) {
        (self.virtual_address, self.segment_length)
    }
}

/// DAT 1.2's remote triplet; a length beyond 32 bits is DAT_LENGTH_ERROR
/// (dat_ep_post_rdma_read's page: the local buffer cannot hold the remote
/// one's data, as no local IOV of ours can).
impl RemoteTriplet for dat_abi12::DAT_RMR_TRIPLET {
    fn remote(&self) -> DatResult<RemoteBuffer> {
        Ok(RemoteBuffer {
            address: self.target_address,
            length: u32::try_from(self.segment_length).map_err(|_| DatError::length())?,
            rmr_context: self.rmr_context,
        })
    }
}

/// The remote buffer of an RDMA DTO (remote_iov): NULL is
/// DAT_INVALID_PARAMETER for it.
///
/// # Safety
/// `p` is NULL or points to a readable triplet.
pub(crate) unsafe fn remote_buffer<T: RemoteTriplet>(p: *const T) -> DatResult<RemoteBuffer> {
    // SAFETY: `p` is NULL or points to a readable struct (the C caller's contract).
    unsafe { input(p, Param::RemoteIov) }?.remote()
}

/// The (address, length) spans of `n` triplets at `p` (dat_lmr_sync_rdma_*:
/// local_segments and num_segments).
///
/// # Safety
/// `p` is NULL or points to `n` readable triplets.
pub(crate) unsafe fn lmr_spans<T: LocalTriplet>(
    p: *const T,
    n: DAT_VLEN,
) -> DatResult<Vec<(u64, u64)>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(DatError::bad(Param::LocalSegments));
    }
    let n = usize::try_from(n).map_err(|_| DatError::bad(Param::NumSegments))?;
    // SAFETY: `p` is not NULL (checked above) and points to `n` readable triplets (our
    // contract).
    Ok(unsafe { std::slice::from_raw_parts(p, n) }
        .iter()
        .map(|t| t.span())
        .collect())
}

/// Private data: `size` bytes at `p` (private_data_size, private_data; NULL
/// allowed with size 0).
///
/// # Safety
/// `p` is NULL or points to `size` readable bytes.
pub(crate) unsafe fn bytes<'a>(p: *const c_void, size: DAT_COUNT) -> DatResult<&'a [u8]> {
    if size < 0 {
        return Err(DatError::bad(Param::PrivateDataSize));
    }
    if size == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(DatError::bad(Param::PrivateData));
    }
    // SAFETY: `p` is not NULL (checked above) and points to `size` (> 0) readable bytes (our
    // contract).
    Ok(unsafe { std::slice::from_raw_parts(p as *const u8, size as usize) })
}

/// The IPv4 address of a DAT_IA_ADDRESS_PTR (a `struct sockaddr`).
///
/// # Safety
/// `p` is NULL or points to a sockaddr of at least its family's size.
pub(crate) unsafe fn ipv4_of(p: *const sockaddr, param: Param) -> DatResult<Ipv4Addr> {
    // SAFETY: `p` is NULL or points to a readable struct (the C caller's contract).
    let sa = unsafe { input(p, param) }?;
    if i32::from(sa.sa_family) != libc::AF_INET {
        return Err(DatError::new(
            ErrorType::InvalidAddress,
            SubType::InvalidAddressUnsupported,
        ));
    }
    // SAFETY: an AF_INET sockaddr (checked above), of at least its family's size (our
    // contract): a readable sockaddr_in.
    let sin = unsafe { &*(p as *const libc::sockaddr_in) };
    Ok(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
}

/// The IPv4 address and port of a DAT_IA_ADDRESS_PTR (a `struct sockaddr`
/// naming a service point: dat_csp_create, dat_ep_common_connect). Errors as
/// `ipv4_of`.
///
/// # Safety
/// `p` is NULL or points to a sockaddr of at least its family's size.
pub(crate) unsafe fn ipv4_port_of(p: *const sockaddr, param: Param) -> DatResult<SocketAddrV4> {
    // SAFETY: `p` is NULL or a sockaddr of its family's size (the C caller's contract).
    let ip = unsafe { ipv4_of(p, param) }?;
    // SAFETY: `ipv4_of` accepted it: not NULL and AF_INET, so a readable sockaddr_in (our
    // contract).
    let sin = unsafe { &*(p as *const libc::sockaddr_in) };
    Ok(SocketAddrV4::new(ip, u16::from_be(sin.sin_port)))
}

/// A stable `struct sockaddr` for an IPv4 address, for the address pointers
/// DAT hands out (IA address, CR and EP peers). One per distinct address,
/// kept for the life of the process, so a pointer a consumer holds never
/// dangles.
pub(crate) fn sockaddr_of(ip: Ipv4Addr) -> DAT_IA_ADDRESS_PTR {
    sockaddr_port_of(SocketAddrV4::new(ip, 0))
}

/// As `sockaddr_of`, with a port (a CSP's address).
pub(crate) fn sockaddr_port_of(sa: SocketAddrV4) -> DAT_IA_ADDRESS_PTR {
    static INTERNED: Mutex<Option<HashMap<SocketAddrV4, usize>>> = Mutex::new(None);
    let mut map = INTERNED.lock();
    let addr = *map
        .get_or_insert_with(HashMap::new)
        .entry(sa)
        .or_insert_with(|| {
            // SAFETY: sockaddr_in is plain data; all-zero is a valid value.
            let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_addr.s_addr = u32::from(*sa.ip()).to_be();
            sin.sin_port = sa.port().to_be();
            Box::leak(Box::new(sin)) as *mut libc::sockaddr_in as usize
        });
    addr as DAT_IA_ADDRESS_PTR
}

/// A communicator as (domain, type, protocol).
type CommKey = (i32, i32, i32);

/// A stable DAT_COMM with these (domain, type, protocol), for dat_csp_query's
/// `comm` pointer: one per distinct value, kept for the life of the process.
pub(crate) fn interned_comm(comm: CommKey) -> *mut DAT_COMM {
    static INTERNED: Mutex<Option<HashMap<CommKey, usize>>> = Mutex::new(None);
    let mut map = INTERNED.lock();
    let addr = *map
        .get_or_insert_with(HashMap::new)
        .entry(comm)
        .or_insert_with(|| {
            let c = DAT_COMM {
                domain: comm.0,
                r#type: comm.1,
                protocol: comm.2,
            };
            Box::leak(Box::new(c)) as *mut DAT_COMM as usize
        });
    addr as *mut DAT_COMM
}

/// Copies `s` into a fixed C char array, NUL-terminated and truncated.
pub(crate) fn cstr_into(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}

/// A core count as a C DAT_COUNT (an int), saturating.
pub(crate) fn count(v: u32) -> DAT_COUNT {
    v.min(i32::MAX as u32) as DAT_COUNT
}

/// A C DAT_COUNT the consumer gave as a core count; negative is
/// DAT_INVALID_PARAMETER for `param`.
pub(crate) fn count_arg(v: DAT_COUNT, param: Param) -> DatResult<u32> {
    u32::try_from(v).map_err(|_| DatError::bad(param))
}

/// DAT_BOOLEAN of a bool.
pub(crate) fn boolean(b: bool) -> DAT_BOOLEAN {
    if b {
        DAT_TRUE
    } else {
        DAT_FALSE
    }
}

/// The variable arguments of dat_extension_op, as the registry hands them to the provider's
/// extension slot: C's `va_list`, which on x86_64 SysV is a pointer to the caller's
/// `__va_list_tag`. Every argument of the IB extension operations (pointers, 64-bit values,
/// enums and ints, the 8-byte DTO cookie union) is of the INTEGER class, so one reader of
/// 8-byte general-purpose slots serves them all; narrower C arguments were promoted to a slot.
pub(crate) struct VaArgs(*mut c_void);

#[cfg(target_arch = "x86_64")]
#[repr(C)]
struct VaListTag {
    gp_offset: u32,
    fp_offset: u32,
    overflow_arg_area: *mut u8,
    reg_save_area: *mut u8,
}

impl VaArgs {
    /// # Safety
    /// `args` is the `va_list` the registry passed, not yet consumed past the arguments the
    /// caller of dat_extension_op supplied for this operation.
    pub(crate) unsafe fn new(args: va_list) -> VaArgs {
        VaArgs(args)
    }

    /// The next argument's 8-byte slot. None where this provider cannot read a va_list (not
    /// x86_64) or none was given.
    ///
    /// # Safety
    /// The caller passed at least one more argument (the operation's C macro says how many).
    #[cfg(target_arch = "x86_64")]
    pub(crate) unsafe fn word(&mut self) -> Option<u64> {
        // SAFETY: `self.0` is the registry's va_list (`new`'s contract): on x86_64 a pointer to
        // its one __va_list_tag, ours to advance.
        let tag = unsafe { (self.0 as *mut VaListTag).as_mut() }?;
        // The first six integer arguments of the variadic call were saved in the register save
        // area (48 bytes); the rest are on the caller's stack.
        if tag.gp_offset < 48 {
            // SAFETY: gp_offset < 48: a saved integer register inside the save area, holding the
            // argument our caller says was passed.
            let v = unsafe {
                (tag.reg_save_area.add(tag.gp_offset as usize) as *const u64).read_unaligned()
            };
            tag.gp_offset += 8;
            Some(v)
        } else {
            // SAFETY: registers used up: the next 8-byte slot of the caller's stack arguments,
            // holding the argument our caller says was passed.
            let v = unsafe { (tag.overflow_arg_area as *const u64).read_unaligned() };
            // SAFETY: stays within the caller's stack arguments (one slot past the one read).
            tag.overflow_arg_area = unsafe { tag.overflow_arg_area.add(8) };
            Some(v)
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(crate) unsafe fn word(&mut self) -> Option<u64> {
        None
    }

    /// The next argument, or DAT_NOT_IMPLEMENTED where variable arguments cannot be read.
    ///
    /// # Safety
    /// As for `word`.
    pub(crate) unsafe fn u64(&mut self) -> DatResult<u64> {
        // SAFETY: the caller of dat_extension_op passed this operation's arguments, in this order
        // (its C macro's contract).
        unsafe { self.word() }.ok_or_else(DatError::not_implemented)
    }

    /// # Safety
    /// As for `word`; the argument is a 32-bit C value (int, enum, DAT_UINT32).
    pub(crate) unsafe fn u32(&mut self) -> DatResult<u32> {
        // SAFETY: the caller of dat_extension_op passed this operation's arguments, in this order
        // (its C macro's contract).
        Ok(unsafe { self.u64() }? as u32)
    }

    /// # Safety
    /// As for `word`; the argument is a pointer.
    pub(crate) unsafe fn ptr<T>(&mut self) -> DatResult<*mut T> {
        // SAFETY: the caller of dat_extension_op passed this operation's arguments, in this order
        // (its C macro's contract).
        Ok(unsafe { self.u64() }? as usize as *mut T)
    }
}

/// A stable copy of a shared-memory id (DAT_LMR_COOKIE) for dat_lmr_query to point to: one per
/// distinct id, kept for the life of the process (as `sockaddr_of` keeps addresses), so the
/// pointer a consumer holds never dangles.
pub(crate) fn interned_cookie(id: [u8; DAT_LMR_COOKIE_SIZE]) -> DAT_LMR_COOKIE {
    static INTERNED: Mutex<Option<HashMap<[u8; DAT_LMR_COOKIE_SIZE], usize>>> = Mutex::new(None);
    let mut map = INTERNED.lock();
    let addr = *map
        .get_or_insert_with(HashMap::new)
        .entry(id)
        .or_insert_with(|| {
            let cookie: [c_char; DAT_LMR_COOKIE_SIZE] = id.map(|b| b as c_char);
            Box::leak(Box::new(cookie)) as *mut [c_char; DAT_LMR_COOKIE_SIZE] as usize
        });
    addr as DAT_LMR_COOKIE
}
