//! The OpenTelemetry process context (OTEP 4719, `oteps/profiles/4719-process-ctx.md` in
//! opentelemetry-specification): the process's resource attributes (`service.name`, ...)
//! published in a memory mapping named `OTEL_CTX`, where an out-of-process reader such as the
//! OpenTelemetry eBPF profiler finds them through `/proc/PID/maps` and reads them from the
//! process's memory.
//!
//! One mapping per process, made by [`publish`]: a 32-byte header (`"OTEL_CTX"`, version 2,
//! the payload's size, when it was published, a pointer to the payload), the payload right
//! after it (an `opentelemetry.proto.resource.v1.Resource` in protobuf), rounded up to whole
//! pages. It comes from `memfd_create("OTEL_CTX")` (so `/proc/PID/maps` names it
//! `/memfd:OTEL_CTX`), or an anonymous mapping where memfds are refused, named with
//! `prctl(PR_SET_VMA_ANON_NAME)` (`[anon:OTEL_CTX]`, Linux 5.17+ with `CONFIG_ANON_VMA_NAME`).
//! It is marked `MADV_DONTFORK`: a child of `fork` has none (and this module forgets the
//! parent's there). The signature is written last, after a fence; an update zeroes
//! `published_at_ns` first and writes a new, larger one last, so a reader that sees it
//! unchanged around its read of the payload has read a whole one.
//!
//! An update keeps the header where it is (readers may keep its address): a payload that no
//! longer fits after it goes into memory of its own that the header points to.
//!
//! 64-bit little-endian Linux only; elsewhere [`publish`] says it is unsupported.

use crate::fork::ForkSafe;
use crate::otel_resource::AttributeValue;
use std::sync::atomic::{AtomicU64, Ordering, fence};

/// The signature of a published header.
pub const SIGNATURE: [u8; 8] = *b"OTEL_CTX";
/// The header format's version.
pub const VERSION: u32 = 2;
/// Bytes of the header; the payload follows it.
pub const HEADER_BYTES: usize = 32;

/// The mapping this process published, if any.
#[derive(Debug)]
struct Published {
    addr: usize,
    len: usize,
    /// The process that made it (a child of `fork` does not have it).
    pid: u32,
    published_at: u64,
    /// A payload too large for the room after the header: the header points here.
    outside: Option<Box<[u8]>>,
}

static PUBLISHED: ForkSafe<Option<Published>> = ForkSafe::new(None);

/// `attributes` as the protobuf payload.
fn encode(attributes: &[(String, AttributeValue)]) -> Vec<u8> {
    prost::Message::encode_to_vec(&crate::otel_resource::resource_message(attributes))
}

fn page_bytes() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// Publishes `attributes` as this process's context, or updates the one published. Attribute keys should be
/// unique (the OTEP's readers take the resource as is).
pub fn publish(attributes: &[(String, AttributeValue)]) -> std::io::Result<()> {
    let payload = encode(attributes);
    if u32::try_from(payload.len()).is_err() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a process context payload of 4 GiB or more",
        ));
    }
    let mut guard = PUBLISHED.lock();
    let pid = std::process::id();
    if guard.as_ref().is_some_and(|p| p.pid != pid) {
        // The parent's: a child of fork does not have its mapping (MADV_DONTFORK).
        *guard = None;
    }
    if let Some(p) = guard.as_mut() {
        // SAFETY: our own mapping of `p.len` bytes, still mapped (only `remove` unmaps it,
        // under this lock).
        unsafe { update(p, payload) };
        return Ok(());
    }
    *guard = Some(create(&payload, pid)?);
    Ok(())
}

/// Removes the context when dropped: what a profiler that published it keeps until it stops.
#[derive(Debug)]
pub(crate) struct RemoveOnDrop;

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        remove();
    }
}

/// Removes the published context, if this process published one.
pub fn remove() {
    let mut guard = PUBLISHED.lock();
    if let Some(p) = guard.take()
        && p.pid == std::process::id()
    {
        // SAFETY: our own mapping; the signature goes first so that a reader holding the
        // address from an earlier read sees no context rather than a stale one.
        unsafe {
            header(p.addr).signature.store(0, Ordering::Release);
            libc::munmap(p.addr as *mut libc::c_void, p.len);
        }
    }
}

/// The header's fields, written as atomics (a reader in another process reads them while
/// this one writes).
#[repr(C)]
struct Header {
    signature: AtomicU64,
    /// `version` (low half) and `payload_size` (high half), little-endian as the OTEP lays
    /// out two `uint32`s on the platforms we run on.
    version_and_size: AtomicU64,
    published_at_ns: AtomicU64,
    payload: AtomicU64,
}

impl Header {
    /// Version, payload size and payload address (not yet published: the caller fences, then
    /// writes the signature or the timestamp).
    fn point_at(&self, at: u64, size: usize) {
        self.version_and_size
            .store(u64::from(VERSION) | (size as u64) << 32, Ordering::Relaxed);
        self.payload.store(at, Ordering::Relaxed);
    }
}

/// Copies `payload` right after the header at `addr`; returns where it went.
///
/// # Safety
/// `addr` must be the start of a live mapping of ours with room for the header and `payload`.
unsafe fn copy_after_header(addr: usize, payload: &[u8]) -> u64 {
    let at = addr + HEADER_BYTES;
    // SAFETY: within the caller's mapping, which nothing else of ours writes meanwhile.
    unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), at as *mut u8, payload.len()) };
    at as u64
}

/// # Safety
/// `addr` must be the start of a live mapping of ours of at least [`HEADER_BYTES`] bytes.
unsafe fn header<'a>(addr: usize) -> &'a Header {
    const { assert!(size_of::<Header>() == HEADER_BYTES) };
    // SAFETY: the caller's mapping is page-aligned and large enough; zeroed memory is valid
    // atomics.
    unsafe { &*(addr as *const Header) }
}

/// The header's layout is the OTEP's on 64-bit little-endian Linux (two `uint32`s in one
/// word, an 8-byte pointer): only there is it published.
#[cfg(all(
    target_os = "linux",
    target_endian = "little",
    target_pointer_width = "64"
))]
fn create(payload: &[u8], pid: u32) -> std::io::Result<Published> {
    let page = page_bytes();
    let len = (HEADER_BYTES + payload.len()).div_ceil(page) * page;
    let name = c"OTEL_CTX";
    // SAFETY: a new memfd with a NUL-terminated name; the fd is ours until closed below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    let from_memfd = fd >= 0
        // SAFETY: sizing our own new memfd.
        && unsafe { libc::ftruncate(fd, len as libc::off_t) } == 0;
    let (flags, map_fd) = if from_memfd {
        (libc::MAP_PRIVATE, fd)
    } else {
        (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
    };
    // SAFETY: a new private mapping of `len` bytes; nothing else refers to it.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            map_fd,
            0,
        )
    };
    let mapped = std::io::Error::last_os_error();
    if fd >= 0 {
        // SAFETY: our own fd; the mapping keeps the memfd's memory alive.
        unsafe { libc::close(fd) };
    }
    if addr == libc::MAP_FAILED {
        return Err(mapped);
    }
    let unmap = |e: std::io::Error| {
        // SAFETY: the mapping just made, referred to by nothing else.
        unsafe { libc::munmap(addr, len) };
        Err(e)
    };
    // SAFETY: advice on our own mapping.
    if unsafe { libc::madvise(addr, len, libc::MADV_DONTFORK) } != 0 {
        return unmap(std::io::Error::last_os_error());
    }
    let published_at = realtime_ns().max(1);
    // SAFETY: the payload fits after the header in the `len` bytes just mapped.
    let at = unsafe { copy_after_header(addr as usize, payload) };
    // SAFETY: our live mapping of `len >= HEADER_BYTES` bytes.
    let h = unsafe { header(addr as usize) };
    h.point_at(at, payload.len());
    h.published_at_ns.store(published_at, Ordering::Relaxed);
    fence(Ordering::SeqCst);
    h.signature
        .store(u64::from_le_bytes(SIGNATURE), Ordering::Release);
    let named = name_mapping(addr as usize, len);
    if !from_memfd && !named {
        // Neither a memfd nor a name: no reader could find it (the OTEP's rule).
        return unmap(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "neither memfd_create nor naming an anonymous mapping is allowed here",
        ));
    }
    Ok(Published {
        addr: addr as usize,
        len,
        pid,
        published_at,
        outside: None,
    })
}

#[cfg(not(all(
    target_os = "linux",
    target_endian = "little",
    target_pointer_width = "64"
)))]
fn create(_payload: &[u8], _pid: u32) -> std::io::Result<Published> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "the process context is published on 64-bit little-endian Linux only",
    ))
}

/// Names the mapping `OTEL_CTX` (`[anon:OTEL_CTX]` in `/proc/PID/maps` for an anonymous one;
/// a memfd's keeps its file name there). Whether the kernel took it.
#[cfg(target_os = "linux")]
fn name_mapping(addr: usize, len: usize) -> bool {
    const PR_SET_VMA: libc::c_int = 0x53564d41;
    const PR_SET_VMA_ANON_NAME: libc::c_ulong = 0;
    // SAFETY: names our own mapping with a NUL-terminated string the kernel copies.
    unsafe {
        libc::prctl(
            PR_SET_VMA,
            PR_SET_VMA_ANON_NAME,
            addr as libc::c_ulong,
            len as libc::c_ulong,
            c"OTEL_CTX".as_ptr(),
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn name_mapping(_addr: usize, _len: usize) -> bool {
    false
}

/// Replaces the payload of `p`: the OTEP's updating protocol. The header stays where it is (a
/// reader may keep its address); the payload goes after it if it fits, else into memory of
/// its own that the header points to.
///
/// # Safety
/// `p` must describe a live mapping of ours.
unsafe fn update(p: &mut Published, payload: Vec<u8>) {
    // SAFETY: as the caller promises.
    let h = unsafe { header(p.addr) };
    let size = payload.len();
    h.published_at_ns.store(0, Ordering::Relaxed);
    fence(Ordering::SeqCst);
    let (at, outside) = if HEADER_BYTES + size <= p.len {
        // SAFETY: the payload fits after the header in our mapping.
        (unsafe { copy_after_header(p.addr, &payload) }, None)
    } else {
        let outside = payload.into_boxed_slice();
        (outside.as_ptr() as u64, Some(outside))
    };
    h.point_at(at, size);
    fence(Ordering::SeqCst);
    // A reader compares it before and after: never the same value twice.
    p.published_at = realtime_ns().max(p.published_at + 1);
    h.published_at_ns.store(p.published_at, Ordering::Release);
    // The payload before this one is no longer pointed to (a reader that was reading it sees
    // the timestamp change and reads again).
    p.outside = outside;
    name_mapping(p.addr, p.len);
}
