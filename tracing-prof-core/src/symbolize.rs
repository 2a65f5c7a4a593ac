//! Turning sampled return addresses into code frames, off the hot path, with a cache.
//!
//! The allocator stores raw return addresses; this module resolves them with the `backtrace`
//! crate (DWARF line tables through `addr2line`; inlined functions become frames of their own)
//! on the thread that captures a profile, under the profiler's own tag. Each address is
//! resolved once per process. The first resolution reads the binary's debug info, which takes
//! time and memory once (build with at least `debug = "line-tables-only"` for file and line
//! numbers; without any debug info, function names still come from the symbol table).
//!
//! Two trims make the stacks read like Go's:
//! - at the leaf, the allocator's own frames (`tracing_prof_alloc`, `__rust_alloc`,
//!   `alloc::alloc::*`) are dropped, so the innermost frame is the code that asked for memory;
//! - at the root, when the stack runs through the place a span was entered by
//!   `Span::in_scope` or an `Instrumented` future's `poll`, everything from there outwards is
//!   dropped: those frames are already shown as span frames. Stacks entered with
//!   `span.enter()` keep their whole code stack, less the runtime's own root frames.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tracing_prof_model::CodeFrame;

fn unknown(ip: usize) -> CodeFrame {
    CodeFrame::named(&format!("0x{ip:x}"))
}

/// Set when an address was resolved since the last [`release_debug_info`].
static PARSED: AtomicBool = AtomicBool::new(false);
/// Captures in a row that resolved nothing new while the debug info was loaded.
static IDLE: AtomicU32 = AtomicU32::new(0);
/// Whether the debug info may be loaded.
static LOADED: AtomicBool = AtomicBool::new(false);

/// Captures without a new address before the parsed debug info is freed.
const RELEASE_AFTER: u32 = 2;

/// Called once per capture, after all its stacks are resolved: frees the debug info parsed to
/// resolve new addresses (tens of MB for a service) once two captures in a row needed nothing
/// new, so that a service that has shown its allocation sites pays for it only while warming
/// up. Resolved frames stay cached.
pub(crate) fn release_debug_info() {
    if PARSED.swap(false, Ordering::Relaxed) {
        LOADED.store(true, Ordering::Relaxed);
        IDLE.store(0, Ordering::Relaxed);
    } else if LOADED.load(Ordering::Relaxed)
        && IDLE.fetch_add(1, Ordering::Relaxed) + 1 >= RELEASE_AFTER
    {
        LOADED.store(false, Ordering::Relaxed);
        backtrace::clear_symbol_cache();
    }
}

/// Frees the parsed debug info now (the profiler stops); resolved frames stay cached.
pub(crate) fn release_now() {
    let loaded = LOADED.swap(false, Ordering::Relaxed);
    let parsed = PARSED.swap(false, Ordering::Relaxed);
    IDLE.store(0, Ordering::Relaxed);
    if loaded || parsed {
        backtrace::clear_symbol_cache();
    }
}

/// Resolved frames per return address, innermost (inlined) first.
static CACHE: Mutex<Option<HashMap<usize, Arc<[CodeFrame]>>>> = Mutex::new(None);

/// Leaf frames that belong to the allocator machinery or to the containers of `core`/`alloc`,
/// by function name (for frames without line tables)...
const LEAF_NAMES: &[&str] = &[
    "tracing_prof_alloc::",
    "<tracing_prof_alloc::",
    "__rust_alloc",
    "__rust_realloc",
    "__rustc::",
    "__rdl_",
    "__rg_",
    "_Unwind_",
];

/// ... and by source file.
const LEAF_FILES: &[&str] = &[
    "/tracing-prof-alloc/src/",
    "/library/alloc/",
    "/library/core/",
    "/library/std/src/alloc.rs",
    "/hashbrown-",
];

/// Root frames of the runtime, thread start-up and the test harness, by name...
const ROOT_NAMES: &[&str] = &[
    "main",
    "_start",
    "__libc_start",
    "start_thread",
    "clone",
    "0x",
];

/// ... and by source file.
const ROOT_FILES: &[&str] = &[
    "/library/std/src/rt.rs",
    "/library/std/src/sys/",
    "/library/std/src/panicking.rs",
    "/library/std/src/panic.rs",
    "/library/std/src/thread/",
    "/library/core/",
    "/library/alloc/src/boxed.rs",
    "/library/test/src/",
];

fn matches(f: &CodeFrame, names: &[&str], files: &[&str]) -> bool {
    names.iter().any(|n| f.function.starts_with(n))
        || f.file
            .as_deref()
            .is_some_and(|file| files.iter().any(|p| file.contains(p)))
}

/// Whether a frame is where Rust's runtime starts the program or a thread: everything further
/// out is start-up code.
fn is_runtime_start(f: &CodeFrame) -> bool {
    f.function.starts_with("std::rt::lang_start") || f.function.ends_with("::thread_start")
}

/// Whether a frame is where a span was entered for the code below it: `Span::in_scope`, or the
/// `poll` of an `Instrumented` future (by name, and by file for builds whose names are short).
fn is_span_entry(f: &CodeFrame) -> bool {
    let name = &*f.function;
    let file = f.file.as_deref().unwrap_or("");
    let in_tracing = file.contains("/tracing-0.") || file.contains("/tracing/src/");
    name.starts_with("tracing::span::Span::in_scope")
        || name.starts_with("tracing_prof_core::budget::Budget::measure")
        || (name.contains("tracing::instrument::Instrumented<") && name.ends_with("::poll"))
        || (in_tracing
            && file.ends_with("span.rs")
            && (name == "in_scope" || name.starts_with("in_scope<")))
        || (in_tracing
            && file.ends_with("instrument.rs")
            && (name == "poll" || name.starts_with("poll<")))
}

/// `<Vec<T> as Trait>::f` becomes `Vec<T> as Trait::f`: pprof's viewers drop every `<...>` group
/// from names (C++ templates), which would leave `::f`.
fn unwrap_qualified_path(name: &str) -> String {
    if !name.starts_with('<') {
        return name.to_owned();
    }
    let mut depth = 0usize;
    for (i, c) in name.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => {
                depth -= 1;
                if depth == 0 {
                    return format!("{}{}", &name[1..i], &name[i + 1..]);
                }
            }
            _ => {}
        }
    }
    name.to_owned()
}

fn resolve(ip: usize) -> Arc<[CodeFrame]> {
    let mut frames = Vec::new();
    // Return addresses point after the call; the call itself is one byte before.
    let pc = ip.saturating_sub(1);
    backtrace::resolve(pc as *mut std::ffi::c_void, |sym| {
        let Some(name) = sym.name() else { return };
        frames.push(CodeFrame {
            function: Arc::from(unwrap_qualified_path(&format!("{name:#}"))),
            file: sym
                .filename()
                .map(|f| Arc::from(f.to_string_lossy().as_ref())),
            line: sym.lineno(),
        });
    });
    if frames.is_empty() {
        frames.push(unknown(ip));
    }
    frames.into()
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
/// as the module docs say. `in_span`: whether the sample was taken inside a span.
pub(crate) fn code_stack(ips: &[usize], in_span: bool, leaf: Leaf) -> Vec<CodeFrame> {
    let mut guard = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    let cache = guard.get_or_insert_with(HashMap::new);
    let mut leaf_first: Vec<CodeFrame> = Vec::with_capacity(ips.len() * 2);
    let mut resolved = false;
    for &ip in ips {
        let frames = cache.entry(ip).or_insert_with(|| {
            resolved = true;
            resolve(ip)
        });
        leaf_first.extend(frames.iter().cloned());
        // Frames outside the innermost span's entry point, and those of the runtime's start-up
        // (C's `main`, libc's thread start), are trimmed anyway: not resolving them spares
        // reading other objects' debug info (libc's cost 56 ms and 34 MB in the example).
        if (in_span && frames.iter().any(is_span_entry)) || frames.iter().any(is_runtime_start) {
            break;
        }
    }
    if resolved {
        PARSED.store(true, Ordering::Relaxed);
    }
    drop(guard);
    trim(leaf_first, in_span, leaf)
}

/// Trims a leaf-first stack and returns it root first.
fn trim(mut leaf_first: Vec<CodeFrame>, in_span: bool, leaf: Leaf) -> Vec<CodeFrame> {
    if leaf == Leaf::TrimAllocator {
        trim_allocator(&mut leaf_first);
    }
    trim_root(&mut leaf_first, in_span);
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
        if matches(f, LEAF_NAMES, &LEAF_FILES[..1]) {
            allocator = i + 1;
        } else if !matches(f, LEAF_NAMES, LEAF_FILES)
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
        .position(|f| !matches(f, LEAF_NAMES, LEAF_FILES))
        .unwrap_or(leaf_first.len());
    leaf_first.drain(..leading);
}

/// Root: cuts at the innermost span entry point and the closure it was given, or drops the
/// runtime's start-up frames.
fn trim_root(leaf_first: &mut Vec<CodeFrame>, in_span: bool) {
    if in_span && let Some(i) = leaf_first.iter().position(is_span_entry) {
        leaf_first.truncate(i);
        while leaf_first.len() > 1
            && leaf_first
                .last()
                .is_some_and(|f| f.function.ends_with("{{closure}}"))
        {
            leaf_first.pop();
        }
    } else {
        while leaf_first.len() > 1
            && leaf_first
                .last()
                .is_some_and(|f| matches(f, ROOT_NAMES, ROOT_FILES))
        {
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
        assert_eq!(
            names(&trim(stack.clone(), true, Leaf::TrimAllocator)),
            ["app::parse"]
        );
        assert_eq!(
            names(&trim(stack.clone(), false, Leaf::TrimAllocator)),
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
            names(&trim(short.clone(), true, Leaf::TrimAllocator)),
            ["{closure#0}", "app::parse"]
        );
        // CPU samples keep the leaf frames, whatever they are.
        assert_eq!(
            names(&trim(short, true, Leaf::Keep))[..2],
            ["{closure#0}", "app::parse"]
        );
    }

    #[test]
    fn qualified_paths_survive_pprof_name_shortening() {
        assert_eq!(
            unwrap_qualified_path("<alloc::vec::Vec<T> as core::Foo<I>>::from_iter"),
            "alloc::vec::Vec<T> as core::Foo<I>::from_iter"
        );
        assert_eq!(unwrap_qualified_path("app::main"), "app::main");
        assert_eq!(unwrap_qualified_path("<broken"), "<broken");
    }

    #[test]
    fn resolves_this_function() {
        let mut ips = Vec::new();
        backtrace::trace(|frame| {
            ips.push(frame.ip() as usize);
            ips.len() < 8
        });
        let frames = code_stack(&ips, false, Leaf::TrimAllocator);
        assert!(
            frames
                .iter()
                .any(|f| f.function.contains("resolves_this_function")),
            "{frames:?}"
        );
    }
}
