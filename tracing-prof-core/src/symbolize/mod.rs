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
//! is held while resolving. Build with at least `debug = "line-tables-only"` for file and line
//! numbers (`"limited"` for qualified names of inlined functions); without any debug
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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use tracing_prof_model::{CodeFrame, SpanFrame, Symbols};

/// Addresses whose frames are kept; past it the cache starts afresh.
pub(crate) const MAX_CACHED: usize = 1 << 17;

/// Resolved frames per return address, innermost (inlined) first.
static CACHE: Mutex<Option<HashMap<usize, Arc<[CodeFrame]>>>> = Mutex::new(None);
/// The loaded modules, as last read.
static MODULES: Mutex<Vec<Arc<elf::Module>>> = Mutex::new(Vec::new());

fn cache() -> std::sync::MutexGuard<'static, Option<HashMap<usize, Arc<[CodeFrame]>>>> {
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
pub(crate) type Transient = HashMap<usize, Arc<[CodeFrame]>>;

/// Names and files shared by every frame that has them: one allocation per distinct string,
/// however many addresses resolve to it.
static NAMES: Mutex<Option<HashSet<Arc<str>>>> = Mutex::new(None);

fn intern(names: &mut HashSet<Arc<str>>, s: &Arc<str>) -> Arc<str> {
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
        let c = guard.get_or_insert_with(HashMap::new);
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
                "tracing-prof: {} is stripped (no symbol table, no debug information): code frames in CPU and heap profiles are addresses; build it without strip, and with debug = \"line-tables-only\" or more for files and lines",
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
/// without caching them; addresses the cache has are taken from it.
pub(crate) fn resolve_transient(ips: impl IntoIterator<Item = usize>) -> Transient {
    let wanted: HashSet<usize> = ips.into_iter().map(|ip| ip.wrapping_add(1)).collect();
    let mut out = Transient::with_capacity(wanted.len());
    let missing: Vec<usize> = {
        let guard = cache();
        let cached = guard.as_ref();
        wanted
            .into_iter()
            .filter(|ip| match cached.and_then(|c| c.get(ip)) {
                Some(f) => {
                    out.insert(ip.wrapping_sub(1), f.clone());
                    false
                }
                None => true,
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

/// Resolves `missing` (return addresses: `ip - 1` is looked up), names interned; an address
/// outside every module is named by its value.
fn resolve(missing: Vec<usize>) -> Vec<(usize, Arc<[CodeFrame]>)> {
    let modules = modules_for(&missing);
    let mut resolved: Vec<(usize, Arc<[CodeFrame]>)> = Vec::with_capacity(missing.len());
    let mut found: HashSet<usize> = HashSet::with_capacity(missing.len());
    let mut names_guard = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    let names = names_guard.get_or_insert_with(HashSet::new);
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
        let frames = dwarf::resolve(m, &addrs);
        m.release();
        for (svma, ip) in svmas {
            if let Some(f) = frames.get(&svma) {
                let shared: Vec<CodeFrame> = f
                    .iter()
                    .map(|f| CodeFrame {
                        function: intern(names, &f.function),
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

/// A kind of frame, known by its function's name, by its source file, or (for frames without
/// a file: a build without debug information) by the path its file would have told.
struct FrameClass {
    names: &'static [&'static str],
    files: &'static [&'static str],
    paths_without_file: &'static [&'static str],
}

impl FrameClass {
    fn has(&self, f: &CodeFrame) -> bool {
        self.names.iter().any(|n| f.function.starts_with(n))
            || match f.file.as_deref() {
                Some(file) => self.files.iter().any(|p| file.contains(p)),
                None => self
                    .paths_without_file
                    .iter()
                    .any(|p| f.function.starts_with(p)),
            }
    }
}

/// The allocator's own frames, by name.
const ALLOCATOR_NAMES: &[&str] = &[
    "tracing_prof_alloc::",
    "<tracing_prof_alloc::",
    "__rust_alloc",
    "__rust_realloc",
    "__rustc::",
    "__rdl_",
    "__rg_",
    "_Unwind_",
];

/// The allocator machinery at the leaf of a heap sample.
const ALLOCATOR: FrameClass = FrameClass {
    names: ALLOCATOR_NAMES,
    files: &["/tracing-prof-alloc/src/"],
    paths_without_file: &[],
};

/// The allocator, and the containers of `core`/`alloc` (and hashbrown) that called it.
const CONTAINERS: FrameClass = FrameClass {
    names: ALLOCATOR_NAMES,
    files: &[
        "/tracing-prof-alloc/src/",
        "/library/alloc/",
        "/library/core/",
        "/library/std/src/alloc.rs",
        "/hashbrown-",
    ],
    paths_without_file: &[
        "alloc::",
        "<alloc::",
        "core::",
        "<core::",
        "std::alloc::",
        "hashbrown::",
        "<hashbrown::",
    ],
};

/// Root frames of the runtime, thread start-up and the test harness.
const ROOT: FrameClass = FrameClass {
    names: &[
        "main",
        "_start",
        "__libc_start",
        "start_thread",
        "clone",
        "0x",
    ],
    files: &[
        "/library/std/src/rt.rs",
        "/library/std/src/sys/",
        "/library/std/src/panicking.rs",
        "/library/std/src/panic.rs",
        "/library/std/src/thread/",
        "/library/core/",
        "/library/alloc/src/boxed.rs",
        "/library/test/src/",
    ],
    paths_without_file: &[
        "std::rt::",
        "std::sys::",
        "std::panicking::",
        "std::panic::",
        "std::thread::",
        "<std::thread::",
        "core::",
        "<core::",
        "alloc::boxed::",
        "<alloc::boxed::",
        "test::",
        "<test::",
    ],
};

/// Whether a frame is where Rust's runtime starts the program or a thread: everything further
/// out is start-up code.
fn is_runtime_start(f: &CodeFrame) -> bool {
    f.function.starts_with("std::rt::lang_start") || f.function.ends_with("::thread_start")
}

/// Whether a frame is where a span was entered for the code below it: `Span::in_scope`, or the
/// `poll` or `drop` of an `Instrumented` future (by name, and by file for builds whose names
/// are short).
fn is_span_entry(f: &CodeFrame) -> bool {
    let name = &*f.function;
    let file = f.file.as_deref().unwrap_or("");
    let in_tracing = file.contains("/tracing-0.") || file.contains("/tracing/src/");
    name.starts_with("tracing::span::Span::in_scope")
        || name.starts_with("tracing_prof_core::budget::Budget::measure")
        || (name.contains("tracing::instrument::Instrumented<") && name.ends_with("::poll"))
        // An instrumented future's drop enters its span to drop the future inside.
        || (name.contains("Drop for tracing::instrument::Instrumented<")
            && (name.ends_with("::drop") || name.ends_with("::__drop_inner")))
        || (in_tracing
            && file.ends_with("span.rs")
            && (name == "in_scope" || name.starts_with("in_scope<")))
        || (in_tracing
            && file.ends_with("instrument.rs")
            && (name == "poll"
                || name.starts_with("poll<")
                || name == "drop"
                || name == "__drop_inner"))
}

/// What to do with the innermost frames of a stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Leaf {
    /// Drop the allocator's frames and the containers' that called it (heap samples).
    TrimAllocator,
    /// Keep everything (CPU samples: time spent in `core` or `alloc` code is real).
    Keep,
}

/// The code stack of `ips` (innermost first, as they were captured), root first and trimmed
/// as the module docs say. `span`: the innermost span entered when the sample was taken (a
/// synthetic frame when only that one was, `None` outside spans).
pub(crate) fn code_stack(ips: &[usize], span: Option<&SpanFrame>, leaf: Leaf) -> Vec<CodeFrame> {
    code_stack_from(None, ips, span, leaf)
}

/// [`code_stack`] of a CPU sample: `first` is the interrupted instruction's frames (from
/// [`resolve_transient`]), `ips` the return addresses above it.
pub(crate) fn code_stack_from(
    first: Option<&[CodeFrame]>,
    ips: &[usize],
    span: Option<&SpanFrame>,
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
    trim(leaf_first, span, leaf)
}

/// Trims a leaf-first stack and returns it root first.
fn trim(mut leaf_first: Vec<CodeFrame>, span: Option<&SpanFrame>, leaf: Leaf) -> Vec<CodeFrame> {
    if leaf == Leaf::TrimAllocator {
        trim_allocator(&mut leaf_first);
    }
    trim_root(&mut leaf_first, span);
    leaf_first.reverse();
    leaf_first
}

/// Drops the allocator's frames at the leaf, and the library containers' that called it.
fn trim_allocator(leaf_first: &mut Vec<CodeFrame>) {
    // Leaf: the allocator's frames (up to the outermost of them: std helpers such as
    // `LocalKey::with` sit between them) and the library containers' frames that called it, so
    // that the innermost frame is the code that asked for memory (its file and line say where).
    let mut allocator = 0;
    for (i, f) in leaf_first.iter().enumerate() {
        if ALLOCATOR.has(f) {
            allocator = i + 1;
        } else if !CONTAINERS.has(f)
            && !f
                .file
                .as_deref()
                .is_some_and(|p| p.contains("/library/std/"))
        {
            break; // the caller's code: allocator frames further out are not this allocation's
        }
    }
    leaf_first.drain(..allocator);
    let leading = leaf_first
        .iter()
        .position(|f| !CONTAINERS.has(f))
        .unwrap_or(leaf_first.len());
    leaf_first.drain(..leading);
}

/// Whether a frame, between a span's entry point and the code that runs in the span, is
/// machinery that wraps the call into that code: the instrumented future's projection,
/// `in_scope`'s own closure, a budget's wrapper. (What the span's enter and exit run, the
/// profiler's own `on_enter` and `on_exit` included, stays: it is time spent in the span,
/// and the samples that catch it say so.)
fn is_span_machinery(f: &CodeFrame) -> bool {
    let name = &*f.function;
    let file = f.file.as_deref().unwrap_or("");
    [
        "tracing::instrument::",
        "<tracing::instrument::",
        "tracing::span::Span::in_scope",
        "tracing_prof_core::budget::",
    ]
    .iter()
    .any(|p| name.starts_with(p))
        || ((file.contains("/tracing-0.") || file.contains("/tracing/src/"))
            && (file.ends_with("instrument.rs")
                || (file.ends_with("span.rs") && name.starts_with("in_scope"))))
}

/// Whether `f` is the function that `#[instrument]` made `span` for: a function of the span's
/// module named like the span, or its body: `target::name`, `target::Type::name` (a method),
/// `target::name::{{closure}}` (`{closure#0}` in v0 names), as tracing-attributes names a span
/// after its function and targets it at its module. A function of a module below the span's
/// (`target::json::name`: lower case, as Rust names modules) is another function.
fn is_instrumented_function(f: &CodeFrame, span: &SpanFrame) -> bool {
    if span.is_synthetic() || span.target.is_empty() {
        return false;
    }
    let mut name = &*f.function;
    loop {
        let outer = name.strip_suffix("::{{closure}}").or_else(|| {
            let (outer, last) = name.rsplit_once("::")?;
            (last.starts_with("{closure#") && last.ends_with('}')).then_some(outer)
        });
        match outer {
            Some(o) => name = o,
            None => break,
        }
    }
    let Some(rest) = name
        .strip_prefix(&*span.target)
        .and_then(|rest| rest.strip_prefix("::"))
    else {
        return false;
    };
    if rest == &*span.name {
        return true;
    }
    // `Type::name` or `<impl Trait for Type>::name`: one segment before the name, a type's
    // (CamelCase, as Rust names types; a module's is lower case).
    rest.strip_suffix(&*span.name)
        .and_then(|r| r.strip_suffix("::"))
        .is_some_and(|ty| {
            ty.starts_with('<')
                || (!ty.contains("::") && ty.starts_with(|c: char| c.is_uppercase()))
        })
}

/// Root: cuts at the innermost span entry point, less the `tracing` machinery right under it
/// (every code frame between the entry point and the leaf stays: the bodies of async
/// functions and of closures are the code that ran in the span). Where no entry point is on
/// the stack (`span.enter()`, or a build without debug information that inlined it), cuts
/// above the function `#[instrument]` made the span for, when it is there: what called it ran
/// before the span was entered. Outside spans, drops the runtime's start-up frames.
fn trim_root(leaf_first: &mut Vec<CodeFrame>, span: Option<&SpanFrame>) {
    let entry = span.and_then(|_| leaf_first.iter().position(is_span_entry));
    if let Some(i) = entry {
        leaf_first.truncate(i);
        while leaf_first.len() > 1 && leaf_first.last().is_some_and(is_span_machinery) {
            leaf_first.pop();
        }
    } else if let Some(i) = span.and_then(|s| {
        leaf_first
            .iter()
            .position(|f| is_instrumented_function(f, s))
    }) {
        // Its outer frames too (an async fn's body is under the function's own frame).
        let mut end = i + 1;
        while leaf_first
            .get(end)
            .is_some_and(|f| is_instrumented_function(f, span.expect("a span")))
        {
            end += 1;
        }
        leaf_first.truncate(end);
    } else {
        // Everything from where Rust's runtime starts the program or the thread is start-up.
        if let Some(i) = leaf_first.iter().position(is_runtime_start)
            && i > 0
        {
            leaf_first.truncate(i);
        }
        while leaf_first.len() > 1 && leaf_first.last().is_some_and(|f| ROOT.has(f)) {
            leaf_first.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str, file: &str) -> CodeFrame {
        CodeFrame {
            function: Arc::from(name),
            file: (!file.is_empty()).then(|| Arc::from(file)),
            line: None,
        }
    }

    fn names(v: &[CodeFrame]) -> Vec<&str> {
        v.iter().map(|f| &*f.function).collect()
    }

    const STD: &str = "/rustc/abc/library";

    /// A span whose callsite says nothing of the stack.
    fn span() -> SpanFrame {
        SpanFrame::synthetic("a span")
    }

    #[test]
    fn trims_allocator_leaves_and_cuts_at_the_span_entry() {
        let stack = vec![
            f(
                "tracing_prof_alloc::unwind::capture",
                "/src/tracing-prof-alloc/src/unwind.rs",
            ),
            f("__rust_alloc", ""),
            f(
                "alloc::raw_vec::RawVecInner<A>::try_allocate_in",
                &format!("{STD}/alloc/src/raw_vec/mod.rs"),
            ),
            f("app::parse", "/src/app/src/main.rs"),
            f("app::handle::{{closure}}", "/src/app/src/main.rs"),
            f(
                "tracing::span::Span::in_scope",
                "/cargo/tracing-0.1.41/src/span.rs",
            ),
            f("app::handle", "/src/app/src/main.rs"),
            f("app::main", "/src/app/src/main.rs"),
            f(
                "std::rt::lang_start_internal",
                &format!("{STD}/std/src/rt.rs"),
            ),
            f("main", ""),
        ];
        // The closure given to `in_scope` ran in the span: it stays.
        assert_eq!(
            names(&trim(stack.clone(), Some(&span()), Leaf::TrimAllocator)),
            ["app::handle::{{closure}}", "app::parse"]
        );
        assert_eq!(
            names(&trim(stack.clone(), None, Leaf::TrimAllocator)),
            [
                "app::main",
                "app::handle",
                "tracing::span::Span::in_scope",
                "app::handle::{{closure}}",
                "app::parse"
            ]
        );
        // Short names (line-tables-only builds): the entry point is found by its file.
        let mut short = stack;
        short[5] = f(
            "in_scope<app::handle::{closure_env#0}, ()>",
            "/cargo/tracing-0.1.41/src/span.rs",
        );
        short[4] = f("{closure#0}", "/src/app/src/main.rs");
        assert_eq!(
            names(&trim(short.clone(), Some(&span()), Leaf::TrimAllocator)),
            ["{closure#0}", "app::parse"]
        );
        // CPU samples keep the leaf frames, whatever they are.
        assert_eq!(
            names(&trim(short, Some(&span()), Leaf::Keep))[..2],
            ["{closure#0}", "app::parse"]
        );
    }

    /// The stack gdb showed in a real server (mini-redis): every async fn body between the
    /// instrumented future's `poll` and the leaf stays, in order.
    #[test]
    fn async_fn_bodies_under_an_instrumented_future_stay() {
        let stack = vec![
            f("send", ""),
            f(
                "<tokio::io::util::flush::Flush<A> as core::future::future::Future>::poll",
                "/cargo/tokio-1.40.0/src/io/util/flush.rs",
            ),
            f(
                "mini_redis::connection::Connection::write_frame::{{closure}}",
                "/cargo/mini-redis-0.4.1/src/connection.rs",
            ),
            f(
                "mini_redis::cmd::set::Set::apply::{{closure}}::{{closure}}",
                "/cargo/mini-redis-0.4.1/src/cmd/set.rs",
            ),
            f(
                "<tracing::instrument::Instrumented<T> as core::future::future::Future>::poll",
                "/cargo/tracing-0.1.41/src/instrument.rs",
            ),
            f(
                "mini_redis::cmd::set::Set::apply::{{closure}}",
                "/cargo/mini-redis-0.4.1/src/cmd/set.rs",
            ),
            f(
                "mini_redis::server::Handler::run::{{closure}}::{{closure}}",
                "/cargo/mini-redis-0.4.1/src/server.rs",
            ),
        ];
        assert_eq!(
            names(&trim(stack, Some(&span()), Leaf::Keep)),
            [
                "mini_redis::cmd::set::Set::apply::{{closure}}::{{closure}}",
                "mini_redis::connection::Connection::write_frame::{{closure}}",
                "<tokio::io::util::flush::Flush<A> as core::future::future::Future>::poll",
                "send",
            ]
        );
        // The instrumented future's drop enters the span too (to drop the future inside).
        let stack = vec![
            f(
                "core::ptr::drop_in_place<mini_redis::cmd::get::Get::apply::{{closure}}::{{closure}}>",
                "",
            ),
            f(
                "tracing::instrument::_::<impl core::ops::drop::Drop for tracing::instrument::Instrumented<T>>::drop::__drop_inner",
                "/cargo/tracing-0.1.41/src/instrument.rs",
            ),
            f(
                "tracing::instrument::_::<impl core::ops::drop::Drop for tracing::instrument::Instrumented<T>>::drop",
                "/cargo/tracing-0.1.41/src/instrument.rs",
            ),
            f("mini_redis::cmd::get::Get::apply::{{closure}}", ""),
        ];
        assert_eq!(
            names(&trim(stack, Some(&span()), Leaf::Keep)),
            [
                "core::ptr::drop_in_place<mini_redis::cmd::get::Get::apply::{{closure}}::{{closure}}>"
            ]
        );
        // `tracing`'s own frames just inside the entry point are its machinery.
        let stack = vec![
            f("app::parse", "/src/app/src/main.rs"),
            f(
                "tracing::instrument::_::<impl tracing::instrument::Instrumented<T>>::project",
                "/cargo/tracing-0.1.41/src/instrument.rs",
            ),
            f(
                "<tracing::instrument::Instrumented<T> as core::future::future::Future>::poll",
                "/cargo/tracing-0.1.41/src/instrument.rs",
            ),
        ];
        assert_eq!(
            names(&trim(stack, Some(&span()), Leaf::Keep)),
            ["app::parse"]
        );
    }

    /// Without an entry point on the stack (`span.enter()` in a sync `#[instrument] fn`, or an
    /// `Instrumented::poll` inlined away in a build without debug information), the stack is
    /// cut above the function the span was made for.
    #[test]
    fn without_an_entry_point_the_instrumented_function_is_the_root() {
        let handler = SpanFrame::new("app", "handler", Some("/src/app/src/main.rs"), Some(9));
        let stack = vec![
            f("app::build_table", ""),
            f("app::handler::{{closure}}::{{closure}}", ""),
            f(
                "tokio::runtime::scheduler::current_thread::Context::enter",
                "",
            ),
            f("tokio::runtime::runtime::Runtime::block_on", ""),
            f("app::main", ""),
        ];
        assert_eq!(
            names(&trim(stack, Some(&handler), Leaf::Keep)),
            ["app::handler::{{closure}}::{{closure}}", "app::build_table"]
        );
        let stack = vec![
            f("app::build_table", ""),
            f("app::handler", ""),
            f("app::main", ""),
        ];
        assert_eq!(
            names(&trim(stack.clone(), Some(&handler), Leaf::Keep)),
            ["app::handler", "app::build_table"]
        );
        // A span named otherwise keeps the whole stack (less the runtime's roots).
        let other = SpanFrame::new("app", "request", None, None);
        assert_eq!(
            names(&trim(stack, Some(&other), Leaf::Keep)),
            ["app::main", "app::handler", "app::build_table"]
        );
        // A function of a module below the span's is another function: the stack stays.
        let parse = SpanFrame::new("app", "parse", None, None);
        let stack = vec![
            f("app::json::parse", ""),
            f("app::handler", ""),
            f("app::main", ""),
        ];
        assert_eq!(
            names(&trim(stack, Some(&parse), Leaf::Keep)),
            ["app::main", "app::handler", "app::json::parse"]
        );
        // v0 names its closures `{closure#0}`.
        let stack = vec![
            f("app::build_table", ""),
            f("app::handler::{closure#0}::{closure#0}", ""),
            f("tokio::runtime::runtime::Runtime::block_on", ""),
        ];
        assert_eq!(
            names(&trim(stack, Some(&handler), Leaf::Keep)),
            ["app::handler::{closure#0}::{closure#0}", "app::build_table"]
        );
        // A method: the span is named after it, targeted at its module.
        let apply = SpanFrame::new("mini_redis::cmd::set", "apply", None, None);
        let stack = vec![
            f("send", ""),
            f("mini_redis::cmd::set::Set::apply::{{closure}}", ""),
            f("mini_redis::server::Handler::run::{{closure}}", ""),
        ];
        assert_eq!(
            names(&trim(stack, Some(&apply), Leaf::Keep)),
            ["mini_redis::cmd::set::Set::apply::{{closure}}", "send"]
        );
    }

    #[inline(never)]
    fn probe_target() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn resolves_a_function_with_its_file_and_line() {
        // As a return address: the symbolizer looks up `ip - 1`.
        let ip = probe_target as *const () as usize + 1;
        let frames = code_stack(&[ip], None, Leaf::Keep);
        assert!(
            frames.iter().any(|f| f.function.ends_with("probe_target")
                && f.file
                    .as_deref()
                    .is_some_and(|p| p.ends_with("symbolize/mod.rs"))
                && f.line.is_some()),
            "{frames:?}"
        );
        // An address outside every module is named by its value.
        assert_eq!(&*code_stack(&[0x10], None, Leaf::Keep)[0].function, "0x10");
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
        m.rename_function(svma, unix.as_bytes());
        let frames = dwarf::resolve(m, &[svma + 1]);
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
        let frames = code_stack(&[addr + 8], None, Leaf::Keep);
        assert!(
            frames.iter().any(|f| f.function.contains("clock_gettime")),
            "{frames:?} at 0x{addr:x}"
        );
    }
}
