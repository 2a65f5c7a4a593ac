//! Trimming a resolved stack as the symbolizer's docs say: the allocator's frames at the leaf
//! of heap samples, and at the root everything outside the span's entry point (or the
//! runtime's start-up frames outside spans). Frames are known by name, and by file where the
//! build has debug information.

use tracing_prof_model::{CodeFrame, SpanFrame};

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
    // A short name is told apart by its place (`poll at tracing-0.1.41/src/instrument.rs:319`).
    let short = name.split_once(" at ").map_or(name, |(n, _)| n);
    name.starts_with("tracing::span::Span::in_scope")
        || name.starts_with("tracing_prof_core::budget::Budget::measure")
        || (name.contains("tracing::instrument::Instrumented<") && name.ends_with("::poll"))
        // An instrumented future's drop enters its span to drop the future inside.
        || (name.contains("Drop for tracing::instrument::Instrumented<")
            && (name.ends_with("::drop") || name.ends_with("::__drop_inner")))
        || (in_tracing
            && file.ends_with("span.rs")
            && (short == "in_scope" || short.starts_with("in_scope<")))
        || (in_tracing
            && file.ends_with("instrument.rs")
            && (short == "poll"
                || short.starts_with("poll<")
                || short == "drop"
                || short == "__drop_inner"))
}

/// What to do with the innermost frames of a stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Leaf {
    /// Drop the allocator's frames and the containers' that called it (heap samples).
    TrimAllocator,
    /// Keep everything (CPU samples: time spent in `core` or `alloc` code is real).
    Keep,
}

/// Trims a leaf-first stack and returns it root first. `span`: the innermost span the sample
/// was taken in; `parent`: the span it is in.
pub(super) fn trim(
    mut leaf_first: Vec<CodeFrame>,
    span: Option<&SpanFrame>,
    parent: Option<&SpanFrame>,
    leaf: Leaf,
) -> Vec<CodeFrame> {
    if leaf == Leaf::TrimAllocator {
        trim_allocator(&mut leaf_first);
    }
    trim_root(&mut leaf_first, span, parent);
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
fn trim_root(
    leaf_first: &mut Vec<CodeFrame>,
    span: Option<&SpanFrame>,
    parent: Option<&SpanFrame>,
) {
    let entry = span.and_then(|_| leaf_first.iter().position(is_span_entry));
    // The frames of the function the span was made for (its outermost, and how far they go).
    let own = span.and_then(|s| {
        let i = leaf_first
            .iter()
            .take(entry.unwrap_or(usize::MAX))
            .position(|f| is_instrumented_function(f, s))?;
        let run = leaf_first[i..]
            .iter()
            .take_while(|f| is_instrumented_function(f, s))
            .count();
        Some(i + run)
    });
    // When the parent span's function is between them and the entry point found, that entry
    // point is the parent's: the span's own was inlined into the parent's code (as optimized
    // code without debug information shows it), and the parent's frames ran before the span
    // was entered. (Otherwise what is between is code that ran in the span: the closure given
    // to `in_scope`, say.)
    let parents_entry = |end: usize| {
        let e = entry?;
        let parent = parent?;
        (end < e
            && leaf_first[end..e]
                .iter()
                .any(|f| is_instrumented_function(f, parent)))
        .then_some(end)
    };
    if let Some(end) = own.and_then(parents_entry) {
        leaf_first.truncate(end);
    } else if let Some(i) = entry {
        leaf_first.truncate(i);
        while leaf_first.len() > 1 && leaf_first.last().is_some_and(is_span_machinery) {
            leaf_first.pop();
        }
    } else if let Some(end) = own {
        // Its outer frames too (an async fn's body is under the function's own frame).
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
    use std::sync::Arc;

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
            names(&trim(
                stack.clone(),
                Some(&span()),
                None,
                Leaf::TrimAllocator
            )),
            ["app::handle::{{closure}}", "app::parse"]
        );
        assert_eq!(
            names(&trim(stack.clone(), None, None, Leaf::TrimAllocator)),
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
            names(&trim(
                short.clone(),
                Some(&span()),
                None,
                Leaf::TrimAllocator
            )),
            ["{closure#0}", "app::parse"]
        );
        // CPU samples keep the leaf frames, whatever they are.
        assert_eq!(
            names(&trim(short, Some(&span()), None, Leaf::Keep))[..2],
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
            names(&trim(stack, Some(&span()), None, Leaf::Keep)),
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
            names(&trim(stack, Some(&span()), None, Leaf::Keep)),
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
            names(&trim(stack, Some(&span()), None, Leaf::Keep)),
            ["app::parse"]
        );
    }

    /// The stack seen in a release build without debug information: the child's
    /// `Instrumented::poll` was inlined into the caller's body, so the entry point on the
    /// stack is the caller's span's. The caller's body ran before the child's span was
    /// entered: the stack is cut above the child's own frame.
    #[test]
    fn an_outer_spans_entry_point_does_not_keep_the_callers_frames() {
        let outer = SpanFrame::new("myapp::compute", "outer", None, None);
        let stack = vec![
            f("myapp::compute::burn", ""),
            f("myapp::compute::outer::{{closure}}", ""),
            f("myapp::orders::apply::{{closure}}::{{closure}}", ""),
            f(
                "<tracing::instrument::Instrumented<T> as core::future::future::Future>::poll",
                "",
            ),
            f("myapp::orders::apply::{{closure}}", ""),
            f("tokio::runtime::task::raw::poll", ""),
        ];
        let apply = SpanFrame::new("myapp::orders", "apply", None, None);
        assert_eq!(
            names(&trim(stack.clone(), Some(&outer), Some(&apply), Leaf::Keep)),
            ["myapp::compute::outer::{{closure}}", "myapp::compute::burn"]
        );
        // The caller's own span: cut at its entry point, as before.
        assert_eq!(
            names(&trim(stack.clone(), Some(&apply), None, Leaf::Keep)),
            [
                "myapp::orders::apply::{{closure}}::{{closure}}",
                "myapp::compute::outer::{{closure}}",
                "myapp::compute::burn"
            ]
        );
        // A span entered with `in_scope` around a function named like it (the example's
        // `info_span!("render").in_scope(|| render(..))`): the closure between them ran in the
        // span and stays. Without the parent's function between, the entry point is the span's.
        let render = SpanFrame::new("app", "render", None, None);
        let request = SpanFrame::new("app", "request", None, None);
        let stack = vec![
            f("app::render", ""),
            f("app::handle::{{closure}}::{{closure}}", ""),
            f("tracing::span::Span::in_scope", ""),
            f("app::handle::{{closure}}", ""),
        ];
        assert_eq!(
            names(&trim(stack, Some(&render), Some(&request), Leaf::Keep)),
            ["app::handle::{{closure}}::{{closure}}", "app::render"]
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
            names(&trim(stack, Some(&handler), None, Leaf::Keep)),
            ["app::handler::{{closure}}::{{closure}}", "app::build_table"]
        );
        let stack = vec![
            f("app::build_table", ""),
            f("app::handler", ""),
            f("app::main", ""),
        ];
        assert_eq!(
            names(&trim(stack.clone(), Some(&handler), None, Leaf::Keep)),
            ["app::handler", "app::build_table"]
        );
        // A span named otherwise keeps the whole stack (less the runtime's roots).
        let other = SpanFrame::new("app", "request", None, None);
        assert_eq!(
            names(&trim(stack, Some(&other), None, Leaf::Keep)),
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
            names(&trim(stack, Some(&parse), None, Leaf::Keep)),
            ["app::main", "app::handler", "app::json::parse"]
        );
        // v0 names its closures `{closure#0}`.
        let stack = vec![
            f("app::build_table", ""),
            f("app::handler::{closure#0}::{closure#0}", ""),
            f("tokio::runtime::runtime::Runtime::block_on", ""),
        ];
        assert_eq!(
            names(&trim(stack, Some(&handler), None, Leaf::Keep)),
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
            names(&trim(stack, Some(&apply), None, Leaf::Keep)),
            ["mini_redis::cmd::set::Set::apply::{{closure}}", "send"]
        );
    }
}
