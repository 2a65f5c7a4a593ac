//! Turning sampled return addresses into code frames, off the hot path, with a cache.
//!
//! The samplers store raw return addresses; this module resolves them on the thread that
//! captures a profile, under the profiler's own tag, within a small memory budget:
//! - function names come from each module's symbol table (the program's, its libraries',
//!   the vDSO's), demangled;
//! - file, line and inlined functions come from the DWARF debug information of only the
//!   compilation units that hold sampled addresses, found through `.debug_aranges`; each
//!   unit's line program is run once per batch without keeping its rows, and its tree of
//!   functions is walked only where it holds the batch's addresses (see `dwarf`).
//!
//! Each module file is mapped read-only once; the pages a batch read are handed back to the
//! kernel when it is done, so the debug information never stays in memory. Each address is
//! resolved once per process and its frames cached ([`MAX_CACHED`] addresses at most). No lock
//! is held while resolving. Build with `debug = "limited"` for file, line and qualified names of
//! inlined functions; `"line-tables-only"` names inlined functions by their short names, each
//! told apart by its place (`{async_fn#0} at myapp/src/orders.rs:42`); without any debug
//! information, names still come from the symbol table.
//!
//! Two trims make the stacks read like Go's:
//! - at the leaf of heap samples, the allocator's own frames (`tracing_prof_alloc`,
//!   `__rust_alloc`, `alloc::alloc::*`) are dropped, so the innermost frame is the code that
//!   asked for memory;
//! - at the root, when the stack runs through the place a span was entered by
//!   `Span::in_scope` or an `Instrumented` future's `poll`, everything from there outwards is
//!   dropped, and `tracing`'s own frames just inside it: those frames are already shown as
//!   span frames. Every frame of the code that ran in the span stays: the closure given to
//!   `in_scope`, the body of an `#[instrument]`ed `async fn`, and every `async fn` it awaits
//!   (each one a `{{closure}}` frame). Stacks entered with `span.enter()` keep their whole
//!   code stack, less the runtime's own root frames.

mod dwarf;
mod elf;
mod functions;
mod trim;
mod units;

pub(crate) use trim::Leaf;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use tracing_prof_model::{CodeFrame, SpanFrame, Symbols};

/// Addresses whose frames are kept; past it the cache starts afresh.
pub(crate) const MAX_CACHED: usize = 1 << 17;

/// Resolved frames per return address, innermost (inlined) first.
static CACHE: Mutex<Option<Frames>> = Mutex::new(None);

/// Frames per address (foldhash: the profiler's own keys, hashed at every batch).
type Frames = HashMap<usize, Arc<[CodeFrame]>, foldhash::fast::RandomState>;
/// The loaded modules, as last read.
static MODULES: Mutex<Vec<Arc<elf::Module>>> = Mutex::new(Vec::new());

fn cache() -> std::sync::MutexGuard<'static, Option<Frames>> {
    CACHE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The modules, read again when one holding `addr` is missing (a library loaded since).
fn modules_for(addrs: &[usize]) -> Vec<Arc<elf::Module>> {
    let known = MODULES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let covered = |m: &[Arc<elf::Module>], a: usize| m.iter().any(|m| m.text.contains(&(a as u64)));
    if !known.is_empty() && addrs.iter().all(|&a| covered(&known, a)) {
        return known;
    }
    let fresh = elf::loaded_modules(&known);
    *MODULES.lock().unwrap_or_else(PoisonError::into_inner) = fresh.clone();
    fresh
}

/// Frames resolved outside the cache: the interrupted instructions of CPU samples, which are
/// any instruction of a hot function (a cache of them would grow with every run), looked up
/// once per batch and dropped with it.
pub(crate) type Transient = Frames;

/// Names and files shared by every frame that has them: one allocation per distinct string,
/// however many addresses resolve to it.
static NAMES: Mutex<Option<Names>> = Mutex::new(None);

pub(super) type Names = HashSet<Arc<str>, foldhash::fast::RandomState>;

/// `s` as the one shared copy of it: a name is allocated once however many frames have it
/// (the first compaction of a busy service's CPU samples resolves tens of thousands of frames,
/// and each had its own copy until the batch ended: megabytes that the allocator then kept).
pub(super) fn intern_str(names: &mut Names, s: &str) -> Arc<str> {
    if let Some(shared) = names.get(s) {
        return shared.clone();
    }
    let shared: Arc<str> = Arc::from(s);
    names.insert(shared.clone());
    shared
}

fn intern(names: &mut Names, s: &Arc<str>) -> Arc<str> {
    if let Some(shared) = names.get(&**s) {
        return shared.clone();
    }
    names.insert(s.clone());
    s.clone()
}

/// Resolves every address of `ips` not cached yet, in one batch: each compilation unit
/// involved is read once. Return addresses point after their call: `ip - 1` is looked up.
pub(crate) fn prepare(ips: impl IntoIterator<Item = usize>) {
    let missing: Vec<usize> = {
        let guard = cache();
        let cached = guard.as_ref();
        let set: HashSet<usize> = ips
            .into_iter()
            .filter(|ip| cached.is_none_or(|c| !c.contains_key(ip)))
            .collect();
        set.into_iter().collect()
    };
    if missing.is_empty() {
        return;
    }
    let resolved = resolve(missing);
    let full = {
        let mut guard = cache();
        let c = guard.get_or_insert_with(Frames::default);
        let full = c.len() + resolved.len() > MAX_CACHED;
        if full {
            c.clear();
        }
        c.extend(resolved);
        full
    };
    if full {
        // Not under the cache's lock: locks are taken in the order `fork` lists them.
        *NAMES.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// What the main program says about its own code (read with the loaded modules, the first
/// time anything is symbolized). Says once on stderr when it is stripped: then every code
/// frame is an address.
pub(crate) fn program_symbols() -> Symbols {
    static SAID: std::sync::Once = std::sync::Once::new();
    let modules = modules_for(&[]);
    let symbols = modules.first().map_or(Symbols::Unknown, |m| m.symbols());
    if symbols == Symbols::Stripped {
        SAID.call_once(|| {
            eprintln!(
                "tracing-prof: {} is stripped (no symbol table, no debug information): code frames in CPU and heap profiles are addresses; build it without strip, and with debug = \"limited\" for names, files and lines",
                crate::binary::current().map_or_else(|| "the program".to_owned(), |b| b.name().to_owned())
            );
        });
    }
    symbols
}

/// This module's locks, taken in order, for `fork` (see `crate::fork`).
pub(crate) fn lock_for_fork() -> Vec<Box<dyn std::any::Any>> {
    vec![
        Box::new(MODULES.lock().unwrap_or_else(PoisonError::into_inner)),
        Box::new(NAMES.lock().unwrap_or_else(PoisonError::into_inner)),
        Box::new(cache()),
    ]
}

/// Resolves `ips` (innermost addresses, looked up as they are, not `ip - 1`) in one batch
/// without caching them; addresses the cache has, or `previous` (the last batch's), are taken
/// from there: a program's hot instructions come back batch after batch.
pub(crate) fn resolve_transient(
    ips: impl IntoIterator<Item = usize>,
    previous: &Transient,
) -> Transient {
    let wanted: HashSet<usize> = ips.into_iter().map(|ip| ip.wrapping_add(1)).collect();
    let mut out = Transient::with_capacity_and_hasher(wanted.len(), Default::default());
    let missing: Vec<usize> = {
        let guard = cache();
        let cached = guard.as_ref();
        wanted
            .into_iter()
            .filter(|ip| {
                match previous
                    .get(&ip.wrapping_sub(1))
                    .or_else(|| cached.and_then(|c| c.get(ip)))
                {
                    Some(f) => {
                        out.insert(ip.wrapping_sub(1), f.clone());
                        false
                    }
                    None => true,
                }
            })
            .collect()
    };
    if !missing.is_empty() {
        out.extend(
            resolve(missing)
                .into_iter()
                .map(|(ip, f)| (ip.wrapping_sub(1), f)),
        );
    }
    out
}

/// The frames of each of `ips` (return addresses: `ip - 1` is looked up), innermost first,
/// resolved afresh in one batch, as a first export resolves them (nothing cached is used or
/// kept): what the symbolizer benchmark compares with other symbolizers.
pub fn resolve_uncached(ips: &[usize]) -> Vec<Vec<CodeFrame>> {
    let resolved: HashMap<usize, Arc<[CodeFrame]>> = resolve(ips.to_vec()).into_iter().collect();
    ips.iter()
        .map(|ip| resolved.get(ip).map_or_else(Vec::new, |f| f.to_vec()))
        .collect()
}

/// Resolves `missing` (return addresses: `ip - 1` is looked up), names interned; an address
/// outside every module is named by its value.
fn resolve(missing: Vec<usize>) -> Vec<(usize, Arc<[CodeFrame]>)> {
    let modules = modules_for(&missing);
    let mut resolved: Vec<(usize, Arc<[CodeFrame]>)> = Vec::with_capacity(missing.len());
    let mut found: HashSet<usize> = HashSet::with_capacity(missing.len());
    let mut names_guard = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    let names = names_guard.get_or_insert_with(Names::default);
    for m in &modules {
        let mut svmas: Vec<(u64, usize)> = missing
            .iter()
            .filter(|&&ip| m.text.contains(&(ip.saturating_sub(1) as u64)))
            .map(|&ip| ((ip.saturating_sub(1) as u64).wrapping_sub(m.bias), ip))
            .collect();
        if svmas.is_empty() {
            continue;
        }
        svmas.sort_unstable();
        let addrs: Vec<u64> = svmas.iter().map(|s| s.0).collect();
        let frames = dwarf::resolve(m, &addrs, names);
        m.release();
        for (svma, ip) in svmas {
            if let Some(f) = frames.get(&svma) {
                let shared: Vec<CodeFrame> = f
                    .iter()
                    .map(|f| CodeFrame {
                        // Interned as it was resolved (`intern_str`).
                        function: f.function.clone(),
                        file: f.file.as_ref().map(|file| intern(names, file)),
                        line: f.line,
                    })
                    .collect();
                found.insert(ip);
                resolved.push((ip, shared.into()));
            }
        }
    }
    for ip in missing {
        if !found.contains(&ip) {
            resolved.push((ip, vec![unknown(ip)].into()));
        }
    }
    resolved
}

fn unknown(ip: usize) -> CodeFrame {
    CodeFrame::named(&format!("0x{ip:x}"))
}

/// The spans a sample was taken in, as trimming needs them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct InSpan<'a> {
    /// The innermost span entered when the sample was taken (a synthetic frame when only that
    /// one was); `None` outside spans.
    pub(crate) span: Option<&'a SpanFrame>,
    /// The span it is in, if any.
    pub(crate) parent: Option<&'a SpanFrame>,
}

impl<'a> InSpan<'a> {
    /// The innermost span of `path` (root first) and its parent.
    pub(crate) fn of(path: &'a [SpanFrame]) -> Self {
        InSpan {
            span: path.last(),
            parent: path.len().checked_sub(2).and_then(|i| path.get(i)),
        }
    }
}

/// The code stack of `ips` (innermost first, as they were captured), root first and trimmed
/// as the module docs say.
pub(crate) fn code_stack(ips: &[usize], spans: InSpan<'_>, leaf: Leaf) -> Vec<CodeFrame> {
    code_stack_from(None, ips, spans, leaf)
}

/// [`code_stack`] of a CPU sample: `first` is the interrupted instruction's frames (from
/// [`resolve_transient`]), `ips` the return addresses above it.
pub(crate) fn code_stack_from(
    first: Option<&[CodeFrame]>,
    ips: &[usize],
    spans: InSpan<'_>,
    leaf: Leaf,
) -> Vec<CodeFrame> {
    prepare(ips.iter().copied());
    let leaf_first: Vec<CodeFrame> = {
        let guard = cache();
        let c = guard.as_ref();
        let mut v = Vec::with_capacity(ips.len() * 2 + 2);
        v.extend(first.into_iter().flatten().cloned());
        for ip in ips {
            match c.and_then(|c| c.get(ip)) {
                Some(frames) => v.extend(frames.iter().cloned()),
                None => v.push(unknown(*ip)),
            }
        }
        v
    };
    trim::trim(leaf_first, spans.span, spans.parent, leaf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn probe_target() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn resolves_a_function_with_its_file_and_line() {
        // As a return address: the symbolizer looks up `ip - 1`.
        let ip = probe_target as *const () as usize + 1;
        let frames = code_stack(&[ip], InSpan::default(), Leaf::Keep);
        assert!(
            frames.iter().any(|f| f.function.ends_with("probe_target")
                && f.file
                    .as_deref()
                    .is_some_and(|p| p.ends_with("symbolize/mod.rs"))
                && f.line.is_some()),
            "{frames:?}"
        );
        // An address outside every module is named by its value.
        assert_eq!(
            &*code_stack(&[0x10], InSpan::default(), Leaf::Keep)[0].function,
            "0x10"
        );
    }

    /// Deep enough to hold inlined frames: the outer ones are `#[inline(always)]`.
    #[inline(never)]
    fn collect_return_addresses(out: &mut Vec<usize>) {
        inlined_outer(out);
    }

    #[inline(always)]
    fn inlined_outer(out: &mut Vec<usize>) {
        inlined_inner(out);
    }

    #[inline(always)]
    fn inlined_inner(out: &mut Vec<usize>) {
        backtrace::trace(|frame| {
            out.push(frame.ip() as usize);
            true
        });
        // Addresses inside std, the test harness and libc, as well as these.
        let mut v: Vec<u32> = (0..100).rev().collect();
        v.sort();
        std::hint::black_box(&v);
    }

    /// Every frame, name, file and line agrees with backtrace-rs (which reads all the debug
    /// information up front) on the return addresses of a real stack: this test's, through
    /// inlined functions, the test harness, std's thread start and libc.
    #[test]
    fn agrees_with_backtrace_rs() {
        let mut ips = Vec::new();
        collect_return_addresses(&mut ips);
        assert!(ips.len() > 5, "{ips:?}");
        prepare(ips.iter().copied());
        let guard = cache();
        let c = guard.as_ref().expect("the cache");
        let mut compared = 0;
        let mut inlined = 0;
        let mut named = 0;
        for &ip in &ips {
            let ours: Vec<(String, Option<String>, Option<u32>)> = c[&ip]
                .iter()
                .map(|f| {
                    (
                        f.function.to_string(),
                        f.file.as_deref().map(str::to_owned),
                        f.line,
                    )
                })
                .collect();
            let mut theirs = Vec::new();
            backtrace::resolve(ip as *mut std::ffi::c_void, |s| {
                let name = s.name().map(|n| format!("{n:#}"));
                let file = s.filename().map(|p| p.to_string_lossy().into_owned());
                theirs.push((name, file, s.lineno()));
            });
            if theirs.is_empty() || theirs.iter().all(|t| t.0.is_none()) {
                continue; // backtrace-rs knows nothing there (ours names it by symbol or address)
            }
            let theirs: Vec<(String, Option<String>, Option<u32>)> = theirs
                .into_iter()
                .map(|(n, f, l)| (n.unwrap_or_default(), f, l))
                .collect();
            if ours.len() == 1 && ours[0].1.is_none() {
                // A module whose DWARF is compressed in a separate debug file (libc with
                // Debian's libc6-dbg): ours reads its symbol table only.
                assert_eq!(ours[0].0, theirs[theirs.len() - 1].0, "at 0x{ip:x}");
                named += 1;
                continue;
            }
            assert_eq!(ours, theirs, "at 0x{ip:x}");
            compared += 1;
            inlined += ours.len() - 1;
        }
        assert!(
            compared >= 5,
            "compared {compared}, named {named}, of {}",
            ips.len()
        );
        assert!(inlined >= 2, "no inlined frames compared");
    }
}

#[cfg(all(test, target_os = "linux"))]
mod alias_tests {
    use super::*;
    use std::io::Write;

    /// The load addresses the symbol table gives each of `names` (demangled, without hash),
    /// and every name at those addresses.
    fn symbols_at(names: &[&str]) -> Vec<(usize, Vec<String>)> {
        use object::{Object, ObjectSymbol};
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let file = object::File::parse(&*exe).unwrap();
        let demangled = |s: &object::Symbol<'_, '_>| {
            s.name()
                .ok()
                .and_then(|n| rustc_demangle::try_demangle(n).ok())
                .map(|d| format!("{d:#}"))
        };
        let text: Vec<(u64, String)> = file
            .symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text && s.address() != 0)
            .filter_map(|s| Some((s.address(), demangled(&s)?)))
            .collect();
        // The program's load bias, from a function of this test.
        let here = symbols_at as *const () as usize;
        let mine = text
            .iter()
            .find(|(_, n)| n.ends_with("alias_tests::symbols_at"))
            .map(|(a, _)| *a)
            .expect("this test's own symbol");
        let bias = here.wrapping_sub(mine as usize);
        text.iter()
            .filter(|(_, n)| names.contains(&n.as_str()))
            .map(|&(a, _)| {
                let all = text.iter().filter(|(b, _)| *b == a).map(|(_, n)| n.clone());
                ((a as usize).wrapping_add(bias), all.collect())
            })
            .collect()
    }

    /// Code shared by two functions is named as its debug information names it (as
    /// backtrace-rs, addr2line and perf do), not by whichever alias the symbol table lists
    /// first: a real server's every TCP send read `<&UnixStream as Write>::write`, the linker
    /// having kept one copy of that identical function under both names and listed that one
    /// first.
    #[test]
    fn folded_functions_are_named_by_their_debug_information() {
        const TCP_WRITE: &str = "<&std::net::tcp::TcpStream as std::io::Write>::write";
        const UNIX_WRITE: &str =
            "<&std::os::unix::net::stream::UnixStream as std::io::Write>::write";
        // A real TCP write, so that the function is in this binary.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (&stream).write_all(b"x").unwrap();
        let (addr, names) = symbols_at(&[TCP_WRITE])
            .into_iter()
            .next()
            .expect("TcpStream's write in this binary");
        // backtrace-rs, from the debug information.
        let mut theirs = Vec::new();
        backtrace::resolve((addr + 1) as *mut std::ffi::c_void, |s| {
            theirs.push(s.name().map(|n| format!("{n:#}")));
        });
        assert_eq!(theirs.last().cloned().flatten().as_deref(), Some(TCP_WRITE));
        // The symbol table lists the other alias first (as the real server's did).
        let mut modules = elf::loaded_modules(&[]);
        let m = modules
            .iter_mut()
            .find(|m| m.text.contains(&(addr as u64)))
            .expect("the program");
        let m = Arc::get_mut(m).expect("a module of our own");
        let svma = (addr as u64).wrapping_sub(m.bias);
        let unix: &'static str = mangled_name(UNIX_WRITE).unwrap_or_else(|| {
            panic!("{UNIX_WRITE} is no alias here: {names:?} (the test needs one)")
        });
        let object = m.object.as_ref().expect("the program's file");
        m.functions.rename(svma, unix.as_bytes(), object);
        let frames = dwarf::resolve(m, &[svma + 1], &mut Names::default());
        assert_eq!(
            frames[&(svma + 1)].first().map(|f| &*f.function),
            Some(TCP_WRITE),
            "aliases {names:?}"
        );
    }

    /// The mangled symbol of the function `demangled`, kept for the life of the test.
    fn mangled_name(demangled: &str) -> Option<&'static str> {
        use object::{Object, ObjectSymbol};
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let file = object::File::parse(&*exe).unwrap();
        let name = file.symbols().find_map(|s| {
            let n = s.name().ok()?;
            let d = rustc_demangle::try_demangle(n).ok()?;
            (format!("{d:#}") == demangled).then(|| n.to_owned())
        })?;
        Some(Box::leak(name.into_boxed_str()))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod vdso_tests {
    use super::*;

    /// The vDSO's `clock_gettime`, found as glibc's `dlsym` finds it.
    fn vdso_clock_gettime() -> Option<usize> {
        // SAFETY: dlopen with RTLD_NOLOAD only looks up an already loaded object; the names
        // are NUL-terminated literals.
        let handle = unsafe {
            libc::dlopen(
                c"linux-vdso.so.1".as_ptr(),
                libc::RTLD_NOLOAD | libc::RTLD_LAZY,
            )
        };
        if handle.is_null() {
            return None;
        }
        // SAFETY: a valid handle and a NUL-terminated name.
        let sym = unsafe { libc::dlsym(handle, c"__vdso_clock_gettime".as_ptr()) };
        (!sym.is_null()).then_some(sym as usize)
    }

    /// Samples that land in the vDSO (a `clock_gettime` on the fast path) are named.
    #[test]
    fn names_functions_of_the_vdso() {
        let Some(addr) = vdso_clock_gettime() else {
            eprintln!("SKIPPED: no vDSO clock_gettime here");
            return;
        };
        let frames = code_stack(&[addr + 8], InSpan::default(), Leaf::Keep);
        assert!(
            frames.iter().any(|f| f.function.contains("clock_gettime")),
            "{frames:?} at 0x{addr:x}"
        );
    }
}
