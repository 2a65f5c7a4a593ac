//! Span paths: the chain of callsites from a root span to a span, interned to a [`Tag`].
//!
//! A path is identified by its parent path and the span's callsite, so memory is bounded by the
//! number of distinct paths, never by the number of span instances, and a span id reused by the
//! registry can never mix two spans' counts. The table is process-wide, like the allocator's
//! counters it indexes. Beyond the cap, new paths map to [`Tag::OVERFLOW`] and are counted.

use crate::labels::Labels;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tracing_core::Metadata;
use tracing_prof_alloc::{MAX_TAGS, Tag};
use tracing_prof_model::{NO_SPAN_FRAME, OVERFLOW_FRAME, PROFILER_FRAME, PathKind, SpanFrame};

/// Most span paths the allocator's tables can hold (`MAX_TAGS` less the reserved tags).
pub const MAX_SPAN_PATHS: usize = MAX_TAGS - Tag::FIRST_PATH as usize;

/// Parent tag, callsite address, label set (0: none).
type Key = (u32, usize, u32);

/// Hashes a [`Key`] (two machine words, one of them a static address) with one multiply per
/// word: SipHash's DoS resistance buys nothing here and costs most of a span's creation.
#[derive(Default, Clone, Copy)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
    }
}

type KeyMap<V> = HashMap<Key, V, BuildHasherDefault<KeyHasher>>;

#[derive(Debug)]
struct Entry {
    parent: u32,
    /// The span's callsite, a key of `Table::frames`.
    callsite: usize,
    /// Its label values.
    fields: Vec<(Arc<str>, Arc<str>)>,
}

#[derive(Default)]
struct Table {
    by_key: KeyMap<u32>,
    /// Entry of tag `Tag::FIRST_PATH + i` at index `i`.
    entries: Vec<Entry>,
    /// One frame per callsite, shared by every path through it.
    frames: HashMap<usize, SpanFrame, BuildHasherDefault<KeyHasher>>,
    /// The callsites of each span name.
    by_name: HashMap<Arc<str>, Vec<usize>>,
}

impl Table {
    /// The frame of the callsite `metadata` at `callsite`, added if new. A callsite whose
    /// name another callsite has already goes by `target::name` in span paths, and so does
    /// that other one from now on (see [`path_name`]).
    fn callsite(&mut self, callsite: usize, metadata: &'static Metadata<'static>) {
        if self.frames.contains_key(&callsite) {
            return;
        }
        let frame = SpanFrame::new(
            metadata.target(),
            metadata.name(),
            metadata.file(),
            metadata.line(),
        );
        let same_name = self.by_name.entry(frame.name.clone()).or_default();
        same_name.push(callsite);
        self.frames.insert(callsite, frame);
        if same_name.len() > 1 {
            let group: Vec<SpanFrame> = same_name.iter().map(|c| self.frames[c].clone()).collect();
            for c in same_name.iter() {
                let f = self.frames.get_mut(c).expect("a callsite of the group");
                f.path_name = path_name(f, &group);
            }
        }
    }
}

/// The name `frame` goes by in span paths when the callsites of `group` share its name:
/// `target::name`, and ` (file:line)` after it where the target is shared too.
fn path_name(frame: &SpanFrame, group: &[SpanFrame]) -> Arc<str> {
    let qualified = frame.qualified_name();
    if group.iter().filter(|o| o.target == frame.target).count() < 2 {
        return Arc::from(qualified);
    }
    let file = frame
        .file
        .as_deref()
        .map_or("?", |f| f.rsplit('/').next().unwrap_or(f));
    let line = frame.line.unwrap_or(0);
    Arc::from(format!("{qualified} ({file}:{line})"))
}

/// Distinct span paths tracked before new ones are lumped into `(other span paths)`: 1024.
pub const DEFAULT_MAX_SPAN_PATHS: usize = 1024;

thread_local! {
    /// Per-thread cache of the table, so that span creation rarely takes the global lock.
    static CACHE: RefCell<KeyMap<u32>> = RefCell::new(KeyMap::default());
    /// In front of it, the paths this thread interned lately: a direct-mapped table of
    /// `(parent, callsite, label set, tag)`, one hash and one compare per span creation.
    static RECENT: [Cell<(u32, usize, u32, u32)>; RECENT_PATHS] =
        const { [const { Cell::new((u32::MAX, 0, 0, 0)) }; RECENT_PATHS] };
}

const RECENT_PATHS: usize = 64;

fn recent_slot(key: Key) -> usize {
    let mut h = KeyHasher::default();
    h.write_u32(key.0);
    h.write_usize(key.1);
    h.write_u32(key.2);
    h.finish() as usize % RECENT_PATHS
}

/// The span path table, its cap and what went past it: a part of [`crate::runtime::Runtime`].
/// All zeros when new.
#[repr(align(64))]
pub(crate) struct Paths {
    /// Boxed: `None` is then all zeros, and so is the whole runtime (see `crate::runtime`).
    table: Mutex<Option<Box<Table>>>,
    /// The cap on distinct paths; 0: [`DEFAULT_MAX_SPAN_PATHS`].
    cap: AtomicUsize,
    overflowed: AtomicU64,
}

impl Paths {
    pub(crate) const fn new() -> Self {
        Paths {
            table: Mutex::new(None),
            cap: AtomicUsize::new(0),
            overflowed: AtomicU64::new(0),
        }
    }

    /// The table's lock, for `fork` (see `crate::fork`).
    pub(crate) fn lock_for_fork(&'static self) -> Box<dyn std::any::Any> {
        Box::new(self.table())
    }

    fn table(&self) -> MutexGuard<'_, Option<Box<Table>>> {
        // A panic while holding the lock cannot leave the table inconsistent (inserts are one
        // push plus one map insert), so a poisoned lock is simply taken over.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the cap on distinct span paths, clamped to `1..=MAX_SPAN_PATHS`. Paths already
    /// interned stay.
    pub(crate) fn set_cap(&self, cap: usize) {
        self.cap
            .store(cap.clamp(1, MAX_SPAN_PATHS), Ordering::Relaxed);
    }

    fn cap(&self) -> usize {
        match self.cap.load(Ordering::Relaxed) {
            0 => DEFAULT_MAX_SPAN_PATHS,
            n => n,
        }
    }

    /// The tag of the path `parent -> metadata` with the label set `labels` (see
    /// [`crate::labels`]; 0: none), interning it if it is new.
    ///
    /// `parent` is the parent span's tag, or [`Tag::NO_SPAN`] for a root span. Allocates (call it
    /// with the profiler's tag current), may lock; never called on enter or exit.
    #[inline]
    pub(crate) fn intern(
        &self,
        parent: Tag,
        metadata: &'static Metadata<'static>,
        labels: u32,
        label_pairs: &Labels,
    ) -> Tag {
        let key = (
            parent.get(),
            metadata as *const Metadata<'static> as usize,
            labels,
        );
        let slot = recent_slot(key);
        if let Ok((p, m, l, tag)) = RECENT.try_with(|r| r[slot].get())
            && (p, m, l) == key
        {
            return Tag::new(tag);
        }
        let tag = self.intern_slow(key, metadata, label_pairs);
        if tag != Tag::OVERFLOW {
            let _ = RECENT.try_with(|r| r[slot].set((key.0, key.1, key.2, tag.get())));
        }
        tag
    }

    #[cold]
    fn intern_slow(
        &self,
        key: Key,
        metadata: &'static Metadata<'static>,
        label_pairs: &Labels,
    ) -> Tag {
        let parent = Tag::new(key.0);
        let cached = CACHE
            .try_with(|c| c.borrow().get(&key).copied())
            .ok()
            .flatten();
        if let Some(raw) = cached {
            return Tag::new(raw);
        }
        let tag = {
            let mut guard = self.table();
            let table = guard.get_or_insert_with(Box::default);
            match table.by_key.get(&key) {
                Some(&raw) => Tag::new(raw),
                None if table.entries.len() < self.cap() => {
                    let raw = Tag::FIRST_PATH + table.entries.len() as u32;
                    table.callsite(key.1, metadata);
                    table.entries.push(Entry {
                        parent: parent.get(),
                        callsite: key.1,
                        fields: label_pairs.pairs(key.2),
                    });
                    table.by_key.insert(key, raw);
                    Tag::new(raw)
                }
                None => Tag::OVERFLOW,
            }
        };
        if tag == Tag::OVERFLOW {
            self.overflowed.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = CACHE.try_with(|c| c.borrow_mut().insert(key, tag.get()));
        }
        tag
    }

    /// The innermost span of the path of `tag`: its callsite's frame, with no field values; a
    /// synthetic frame for paths beyond the cap; `None` for tags that are no span path.
    pub(crate) fn innermost(&self, tag: Tag) -> Option<SpanFrame> {
        if tag == Tag::OVERFLOW {
            return Some(SpanFrame::synthetic(OVERFLOW_FRAME));
        }
        let i = tag.get().checked_sub(Tag::FIRST_PATH)? as usize;
        let guard = self.table();
        let table = guard.as_ref()?;
        let e = table.entries.get(i)?;
        table.frames.get(&e.callsite).cloned()
    }

    /// [`Self::innermost`] of `tag`'s path, and its parent's span frame (`None` at a root, or
    /// past the cap).
    pub(crate) fn innermost_two(&self, tag: Tag) -> (Option<SpanFrame>, Option<SpanFrame>) {
        let span = self.innermost(tag);
        let parent = (|| {
            let i = tag.get().checked_sub(Tag::FIRST_PATH)? as usize;
            let guard = self.table();
            let table = guard.as_ref()?;
            let p = table.entries.get(i)?.parent.checked_sub(Tag::FIRST_PATH)? as usize;
            table.frames.get(&table.entries.get(p)?.callsite).cloned()
        })();
        (span, parent)
    }

    /// Spans that were mapped to [`Tag::OVERFLOW`] because the cap was reached.
    pub(crate) fn overflowed_spans(&self) -> u64 {
        self.overflowed.load(Ordering::Relaxed)
    }

    /// The number of tags in use: the reserved ones and every interned path's (a bound for
    /// reading the allocator's counters by tag without listing the paths).
    pub(crate) fn tags(&self) -> usize {
        let n = self.table().as_ref().map_or(0, |t| t.entries.len());
        Tag::FIRST_PATH as usize + n
    }

    /// Every interned path as `(tag, frames root first)`.
    pub(crate) fn all(&self) -> Vec<(Tag, Vec<SpanFrame>)> {
        let guard = self.table();
        let Some(table) = guard.as_ref() else {
            return Vec::new();
        };
        let frames_of = |mut raw: u32| {
            let mut frames = Vec::new();
            while raw >= Tag::FIRST_PATH {
                let e = &table.entries[(raw - Tag::FIRST_PATH) as usize];
                // Every entry's callsite has its frame (inserted before the entry).
                if let Some(frame) = table.frames.get(&e.callsite) {
                    let mut frame = frame.clone();
                    frame.fields = e.fields.clone();
                    frames.push(frame);
                }
                raw = e.parent;
            }
            if raw == Tag::OVERFLOW.get() {
                frames.push(SpanFrame::synthetic(OVERFLOW_FRAME));
            }
            frames.reverse();
            frames
        };
        (0..table.entries.len() as u32)
            .map(|i| {
                (
                    Tag::new(Tag::FIRST_PATH + i),
                    frames_of(Tag::FIRST_PATH + i),
                )
            })
            .collect()
    }

    /// The path names of the path of `tag` (see [`SpanFrame::path_name`]), joined by ` -> ` (or
    /// its synthetic frame's name).
    pub(crate) fn display(&self, tag: Tag) -> String {
        match tag {
            Tag::NO_SPAN => return NO_SPAN_FRAME.to_owned(),
            Tag::PROFILER => return PROFILER_FRAME.to_owned(),
            Tag::OVERFLOW => return OVERFLOW_FRAME.to_owned(),
            _ => {}
        }
        let guard = self.table();
        let Some(table) = guard.as_ref() else {
            return OVERFLOW_FRAME.to_owned();
        };
        let mut names = Vec::new();
        let mut raw = tag.get();
        while raw >= Tag::FIRST_PATH {
            let Some(e) = table.entries.get((raw - Tag::FIRST_PATH) as usize) else {
                break;
            };
            if let Some(f) = table.frames.get(&e.callsite) {
                names.push(&*f.path_name);
            }
            raw = e.parent;
        }
        names.reverse();
        names.join(tracing_prof_model::PATH_SEPARATOR)
    }

    /// Every span path known now, the reserved ones first, each with its kind and frames.
    pub(crate) fn all_with_reserved(&self) -> Vec<(Tag, PathKind, Vec<SpanFrame>)> {
        let special = [
            (Tag::NO_SPAN, PathKind::NoSpan, NO_SPAN_FRAME),
            (Tag::PROFILER, PathKind::Profiler, PROFILER_FRAME),
            (Tag::OVERFLOW, PathKind::Overflow, OVERFLOW_FRAME),
        ]
        .map(|(tag, kind, name)| (tag, kind, vec![SpanFrame::synthetic(name)]));
        special
            .into_iter()
            .chain(self.all().into_iter().map(|(t, f)| (t, PathKind::Span, f)))
            .collect()
    }

    /// Every span path known now, by tag.
    pub(crate) fn index(&self) -> PathIndex {
        self.all_with_reserved()
            .into_iter()
            .map(|(tag, kind, frames)| (tag, (kind, frames)))
            .collect()
    }
}

/// The span paths known now, the reserved ones first, each with its kind and frames.
pub(crate) type PathIndex = HashMap<Tag, (PathKind, Vec<SpanFrame>)>;

/// The span path of `tag`: its kind and frames (overflow when unknown).
pub(crate) fn path_of(by_tag: &PathIndex, tag: Tag) -> (PathKind, &[SpanFrame]) {
    by_tag
        .get(&tag)
        .map_or((PathKind::Overflow, &[][..]), |(k, f)| (*k, f.as_slice()))
}
