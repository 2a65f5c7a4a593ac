//! What the process's resident memory is made of, beside the heap the profiler counts: the
//! resident set from `/proc/self/smaps_rollup`, where the application says which allocator it
//! wraps ([`AllocatorStats`]) what that allocator holds, and the cgroup's limit (see
//! `crate::cgroup`).

use tracing_prof_model::{AllocatorMemory, ProcessMemory};

/// What an allocator says of its own memory; given to
/// [`ProfilerBuilder::allocator_stats`](crate::ProfilerBuilder::allocator_stats) for the
/// allocator the [`TaggingAllocator`](tracing_prof_alloc::TaggingAllocator) wraps.
///
/// Called on the profiler's thread at each capture (never on an allocation). [`GlibcMalloc`]
/// answers for `std::alloc::System` on glibc. For jemalloc, an implementation reads
/// `stats.allocated` and `stats.resident` through `tikv-jemalloc-ctl` after advancing
/// `epoch` (jemalloc built with its `stats` feature, of the `tikv-jemalloc-sys` release your
/// `tikv-jemallocator` uses).
pub trait AllocatorStats: Send + Sync + std::fmt::Debug + 'static {
    /// The allocator's figures now; `None` when it cannot say.
    fn read(&self) -> Option<AllocatorMemory>;
}

/// glibc's `malloc` (`std::alloc::System` on Linux with glibc): `mallinfo2`, glibc's own
/// (its versioned symbol, whatever allocator is preloaded), found at run time (glibc 2.33
/// and later; `None` before, or on another C library). It walks every arena under its lock:
/// call it at a capture's rate, not more.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlibcMalloc;

/// glibc's `struct mallinfo2` (`malloc.h`), field for field.
#[repr(C)]
#[derive(Default)]
struct MallInfo2 {
    arena: usize,
    ordblks: usize,
    smblks: usize,
    hblks: usize,
    hblkhd: usize,
    usmblks: usize,
    fsmblks: usize,
    uordblks: usize,
    fordblks: usize,
    keepcost: usize,
}

impl AllocatorStats for GlibcMalloc {
    #[cfg(target_env = "gnu")]
    fn read(&self) -> Option<AllocatorMemory> {
        type MallInfo2Fn = unsafe extern "C" fn() -> MallInfo2;
        static FOUND: std::sync::OnceLock<Option<MallInfo2Fn>> = std::sync::OnceLock::new();
        let f = (*FOUND.get_or_init(|| {
            // SAFETY: dlvsym with RTLD_DEFAULT and NUL-terminated name and version is always
            // sound to call; it returns null when no loaded object defines that version of
            // the symbol. Asking for glibc's version (GLIBC_2.33) finds glibc's own, not an
            // allocator preloaded in front of it.
            let p = unsafe {
                libc::dlvsym(
                    libc::RTLD_DEFAULT,
                    c"mallinfo2".as_ptr(),
                    c"GLIBC_2.33".as_ptr(),
                )
            };
            // SAFETY: glibc's `mallinfo2@GLIBC_2.33` has exactly this signature (malloc.h:
            // `struct mallinfo2 mallinfo2(void)`), and `MallInfo2` is that struct, field for
            // field.
            (!p.is_null())
                .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, MallInfo2Fn>(p) })
        }))?;
        // SAFETY: `f` is glibc's mallinfo2 (above); it takes no arguments and is thread-safe
        // (it takes each arena's lock).
        let m = unsafe { f() };
        Some(AllocatorMemory::new(
            "glibc malloc (mallinfo2)",
            (m.uordblks + m.hblkhd) as u64,
            (m.arena + m.hblkhd) as u64,
        ))
    }

    /// Not glibc: nothing to ask.
    #[cfg(not(target_env = "gnu"))]
    fn read(&self) -> Option<AllocatorMemory> {
        None
    }
}

/// The resident set now (`/proc/self/smaps_rollup`: `Rss` and `Anonymous`; file-backed and
/// shared memory is the rest), beside `heap_inuse_bytes` and what `allocator` says; `None`
/// where `/proc` cannot say (not Linux, or a kernel before 4.14).
pub(crate) fn read(
    heap_inuse_bytes: u64,
    allocator: Option<&dyn AllocatorStats>,
    cgroup: Option<&crate::cgroup::MemoryCgroup>,
) -> Option<ProcessMemory> {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let (rss, anon) = parse_rollup(&text)?;
    let mut m = ProcessMemory::default();
    m.rss_bytes = rss;
    m.anon_bytes = anon;
    m.file_bytes = rss.saturating_sub(anon);
    m.heap_inuse_bytes = heap_inuse_bytes;
    m.allocator = allocator.and_then(AllocatorStats::read);
    m.cgroup = cgroup.and_then(crate::cgroup::MemoryCgroup::read);
    Some(m)
}

/// `Rss` and `Anonymous` of a `smaps_rollup` text, in bytes.
fn parse_rollup(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            let kb = rest.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
            Some(kb * 1024)
        })
    };
    Some((field("Rss")?, field("Anonymous")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rollup_is_read_in_bytes() {
        let text = "55725dd79000-7fffc78c8000 ---p 00000000 00:00 0    [rollup]\n\
                    Rss:                1620 kB\nPss:                 680 kB\n\
                    Anonymous:           116 kB\nLazyFree:              0 kB\n";
        assert_eq!(parse_rollup(text), Some((1620 * 1024, 116 * 1024)));
        assert_eq!(parse_rollup("Rss: 12 kB\n"), None, "no Anonymous line");
        assert_eq!(parse_rollup("Rss: x kB\nAnonymous: 1 kB\n"), None);
    }

    #[test]
    fn this_process_has_a_resident_set_and_glibc_says_what_it_holds() {
        let m = read(1, Some(&GlibcMalloc), None).expect("Linux 4.14 or later");
        assert!(m.rss_bytes > 0 && m.anon_bytes > 0 && m.anon_bytes <= m.rss_bytes);
        assert_eq!(m.file_bytes, m.rss_bytes - m.anon_bytes);
        if cfg!(target_env = "gnu") {
            let a = m.allocator.expect("glibc 2.33 or later");
            assert!(
                a.held_bytes >= a.allocated_bytes && a.allocated_bytes > 0,
                "{a:?}"
            );
        }
    }
}
