//! Tags: which span path a block belongs to, and which tag is current on this thread.

use crate::MAX_TAGS;
use std::cell::Cell;

/// A compact id of the span path an allocation is charged to.
///
/// Tags are handed out by the span layer (one per interned span path). Three are reserved:
/// [`Tag::NO_SPAN`] (no span entered), [`Tag::PROFILER`] (the profiler's own allocations) and
/// [`Tag::OVERFLOW`] (span paths beyond the configured cap, and any raw value `>= MAX_TAGS`).
/// The default is [`Tag::NO_SPAN`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag(u32);

impl Tag {
    /// Allocations made while no span is entered on the thread.
    pub const NO_SPAN: Tag = Tag(0);
    /// Allocations made by the profiler itself, so that they are never charged to user spans.
    pub const PROFILER: Tag = Tag(1);
    /// Span paths beyond the cap; they are counted here instead of being lost.
    pub const OVERFLOW: Tag = Tag(2);
    /// The first raw value available to span paths.
    pub const FIRST_PATH: u32 = 3;

    /// Makes a tag from a raw value; values `>= MAX_TAGS` become [`Tag::OVERFLOW`].
    #[inline]
    pub const fn new(raw: u32) -> Tag {
        if (raw as usize) < MAX_TAGS {
            Tag(raw)
        } else {
            Tag::OVERFLOW
        }
    }

    /// The raw value, always `< MAX_TAGS`.
    #[inline]
    pub const fn get(self) -> u32 {
        self.0
    }
}

/// Per-thread state of the hot path. `const`-initialised and without `Drop`, so it is usable
/// before `main`, during thread exit and during TLS teardown, and costs a plain TLS access.
pub(crate) struct ThreadState {
    pub(crate) tag: Cell<u32>,
    /// This thread's counter table; see `counters` for the sentinel values.
    pub(crate) table: Cell<*const crate::counters::ThreadTable>,
    /// Set while this thread is inside the table's slow path, to keep re-entrant calls off it.
    pub(crate) busy: Cell<bool>,
    /// The span-instance word current with `tag` (0: none; see `instances`).
    pub(crate) instance: Cell<u64>,
    /// This thread's table index as stored in headers (0: no table; see `counters`).
    pub(crate) origin: Cell<u32>,
    /// Bytes left before the next heap sample; the hot path subtracts each request's size.
    pub(crate) sample_left: Cell<i64>,
    /// The sampler's random state (0: not seeded yet).
    pub(crate) rng: Cell<u64>,
    /// Sample points covered by the request being sampled (see `sample`).
    pub(crate) sample_points: Cell<u32>,
    /// The sampling generation this thread's countdown was drawn for.
    pub(crate) sample_gen: Cell<u32>,
    /// Set while this thread records a sample, so that nothing in it is sampled again.
    pub(crate) in_sample: Cell<bool>,
    /// Where [`crate::record_sites`] records this thread's allocations (null: nowhere).
    pub(crate) recorder: Cell<*mut crate::sites::SiteRecorder>,
    /// Span instance slots this thread freed last (`free_len` of them), reused first.
    pub(crate) free_slots: [Cell<u16>; crate::instances::LOCAL_FREE],
    pub(crate) free_len: Cell<u8>,
    /// When the stretch this thread is in began (its last span enter or exit), in
    /// tracing-prof's monotonic clock, on threads where long polls are watched; 0: none.
    pub(crate) stretch_start: Cell<u64>,
}

thread_local! {
    pub(crate) static STATE: ThreadState = const {
        ThreadState {
            tag: Cell::new(0),
            table: Cell::new(std::ptr::null()),
            busy: Cell::new(false),
            instance: Cell::new(0),
            origin: Cell::new(0),
            sample_left: Cell::new(0),
            rng: Cell::new(0),
            sample_points: Cell::new(1),
            sample_gen: Cell::new(0),
            in_sample: Cell::new(false),
            recorder: Cell::new(std::ptr::null_mut()),
            free_slots: [const { Cell::new(0) }; crate::instances::LOCAL_FREE],
            free_len: Cell::new(0),
            stretch_start: Cell::new(0),
        }
    };
}

/// The tag that allocations on this thread are charged to right now.
#[inline]
pub fn current_tag() -> Tag {
    Tag(STATE.try_with(|s| s.tag.get()).unwrap_or(0))
}

/// Records when the calling thread's current stretch began (its last span enter or exit), in
/// tracing-prof's monotonic clock; 0: the thread is in no span, or is not watched. The span
/// layer calls this on enter and exit of async runtime workers, so that the CPU sampler can
/// tell samples taken in a long poll (see [`stretch_start`]). Never allocates, locks or panics.
#[inline]
pub fn set_stretch_start(ns: u64) {
    let _ = STATE.try_with(|s| s.stretch_start.set(ns));
}

/// What [`set_stretch_start`] last recorded on the calling thread (0: nothing). One
/// thread-local read: async-signal-safe, as [`current_tag`] is.
#[inline]
pub fn stretch_start() -> u64 {
    STATE.try_with(|s| s.stretch_start.get()).unwrap_or(0)
}

/// Makes `tag` current on this thread and returns the tag it replaces.
///
/// The span layer calls this on span enter and exit. Never allocates, locks or panics.
#[inline]
pub fn set_current_tag(tag: Tag) -> Tag {
    Tag(STATE.try_with(|s| s.tag.replace(tag.0)).unwrap_or(0))
}

/// Makes `tag` and the span-instance word `instance` current on this thread (an
/// `eager_instance_word` or a `lazy_instance_word`, 0: none); returns the pair it replaces.
/// The span layer calls this on enter and exit. Never allocates, locks or panics.
///
/// # Safety
/// A lazy word's cell stays valid memory, accessed only atomically, for as long as the word is
/// current on this thread (a sampled allocation reads and writes it), including after its span
/// closed if the word outlives it.
#[inline]
pub unsafe fn set_current_span(tag: Tag, instance: u64) -> (Tag, u64) {
    STATE
        .try_with(|s| (Tag(s.tag.replace(tag.0)), s.instance.replace(instance)))
        .unwrap_or((Tag::NO_SPAN, 0))
}

/// Makes a tag current until dropped, then restores the previous one (also on panic).
///
/// Every path of the profiler that may allocate holds `TagGuard::new(Tag::PROFILER)`, so that
/// the profiler's own memory shows up under its own tag and never under a user's span.
///
/// # Examples
/// ```
/// use tracing_prof_alloc::{Tag, TagGuard, current_tag};
/// {
///     let _g = TagGuard::new(Tag::PROFILER);
///     assert_eq!(current_tag(), Tag::PROFILER);
/// }
/// assert_eq!(current_tag(), Tag::NO_SPAN);
/// ```
#[derive(Debug)]
#[must_use = "the tag is restored when the guard drops"]
pub struct TagGuard {
    previous: Tag,
}

impl TagGuard {
    /// Makes `tag` current on this thread.
    #[inline]
    pub fn new(tag: Tag) -> Self {
        TagGuard {
            previous: set_current_tag(tag),
        }
    }
}

impl Drop for TagGuard {
    #[inline]
    fn drop(&mut self) {
        set_current_tag(self.previous);
    }
}
