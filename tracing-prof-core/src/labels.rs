//! Span fields as pprof labels: `TRACING_PROF_LABEL_FIELDS=route,method` makes a span's
//! `route` and `method` values part of its span path, so that its time, memory and samples can
//! be sliced by them (`go tool pprof -tagfocus=route=/users`, `tracing-prof top --tag
//! route=/users`).
//!
//! Cardinality is bounded: each field keeps its first [`crate::config::DEFAULT_LABEL_VALUES`]
//! distinct values (configurable up to [`MAX_LABEL_VALUES`]), and every later value is shown
//! as [`OTHER`]; values are cut to [`MAX_LABEL_VALUE_CHARS`] characters. Each distinct
//! combination is its own span path, so labels also count against the span path cap.
//!
//! Only the values a span has when it is created count (`info_span!("request", route = %r)`);
//! a value recorded later (`span.record("route", ..)`) does not move the span to another path.
//!
//! Cost: spans whose callsite has none of the configured fields, and enter and exit, pay
//! nothing. Creating a span that has one formats those values into a buffer of the thread's and
//! looks them up in the thread's own cache of values and label sets: no lock and no allocation
//! once the thread has seen that combination. A value or combination new to the thread takes
//! the process-wide table's lock once (and allocates its copy); so do all of them on a thread
//! whose thread-locals are being destroyed. Values are cut as they are formatted: a huge one is
//! never held whole.
//!
//! Memory: the shared table keeps each field's values (at most the limit) and every label set
//! seen; each thread that creates labeled spans keeps the values it has seen (all of a field's,
//! once the field is full), up to 4096 label sets and 64 callsites, freed when it exits.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tracing::field::{Field, Visit};
use tracing_core::Metadata;
use tracing_core::span::Attributes;

/// Fields that may be configured as labels at most.
pub const MAX_LABEL_FIELDS: usize = 8;
/// Characters kept of a label value: 64.
pub const MAX_LABEL_VALUE_CHARS: usize = 64;
/// Distinct values per field that may be configured at most.
pub const MAX_LABEL_VALUES: usize = 1024;
/// The value shown for every value of a field past its limit.
pub const OTHER: &str = "(other)";

/// Label sets a thread keeps in its cache; past it the cache starts afresh.
const LOCAL_SETS: usize = 4096;
/// Callsites a thread remembers (direct-mapped) as having a configured field or not.
const LOCAL_CALLSITES: usize = 64;

/// A field's value and every field's label set, interned.
#[derive(Default)]
struct Table {
    /// The configuration these fields and values belong to (see `Labels::generation`).
    generation: u64,
    fields: Vec<Arc<str>>,
    limit: usize,
    /// Per configured field, its values so far.
    values: Vec<HashMap<String, Arc<str>>>,
    other: Option<Arc<str>>,
    /// Label set (field index, value) -> id from 1.
    sets: HashMap<Vec<(usize, Arc<str>)>, u32>,
    /// Id - 1 -> (field, value) pairs, in configured order.
    by_id: Vec<Vec<(Arc<str>, Arc<str>)>>,
}

impl Table {
    fn other(&mut self) -> Arc<str> {
        self.other.get_or_insert_with(|| Arc::from(OTHER)).clone()
    }

    /// Field `i`'s value `text`, interned while the field has room, [`OTHER`] past it.
    fn value(&mut self, i: usize, text: &str) -> Arc<str> {
        if let Some(v) = self.values[i].get(text) {
            return v.clone();
        }
        if self.values[i].len() < self.limit {
            let v: Arc<str> = Arc::from(text);
            self.values[i].insert(text.to_owned(), v.clone());
            v
        } else {
            self.other()
        }
    }

    /// The id of label set `key` (field index and interned value, in field order), interning
    /// it if it is new.
    fn set(&mut self, key: Vec<(usize, Arc<str>)>) -> u32 {
        if let Some(&id) = self.sets.get(&key) {
            return id;
        }
        let pairs: Vec<(Arc<str>, Arc<str>)> = key
            .iter()
            .map(|(i, v)| (self.fields[*i].clone(), v.clone()))
            .collect();
        self.by_id.push(pairs);
        let id = self.by_id.len() as u32;
        self.sets.insert(key, id);
        id
    }
}

/// The configured fields and every label set interned so far: a part of
/// [`crate::runtime::Runtime`].
#[repr(align(64))]
pub(crate) struct Labels {
    /// Boxed: `None` is then all zeros, and so is the whole runtime (see `crate::runtime`).
    table: Mutex<Option<Box<Table>>>,
    /// Whether any field is configured: the only thing span creation reads when none is.
    active: AtomicBool,
    /// The configuration in force, numbered from [`GENERATIONS`]: a thread's cache filled
    /// under another one is dropped and filled again.
    generation: AtomicU64,
}

/// Numbers every call of [`Labels::configure`] of any instance, so that a thread's cache, which
/// all instances share, never passes for another instance's or configuration's.
static GENERATIONS: AtomicU64 = AtomicU64::new(0);

/// What one thread keeps of the labels: the configured fields (in `scratch`, which collects
/// their values), and the values and label sets it has seen, so that a span creation finds
/// them without the table's lock.
struct Local {
    generation: u64,
    /// Direct-mapped by callsite (its metadata's address): whether it has a configured field.
    callsites: [(usize, bool); LOCAL_CALLSITES],
    /// Per field, the values this thread has seen, interned (never more than the field's
    /// limit: [`OTHER`] is not kept per value).
    values: Vec<HashMap<Box<str>, Arc<str>>>,
    /// Per field, whether the shared table has no room left for it: `values` then holds every
    /// value it has, and any other value is [`OTHER`].
    full: Vec<bool>,
    other: Option<Arc<str>>,
    /// Label set (field index, address of the interned value) -> id.
    sets: HashMap<Vec<(usize, usize)>, u32, BuildHasherDefault<SetHasher>>,
    /// The span being created: its values' text, where each is in it, and its set's key.
    scratch: Collect,
    key: Vec<(usize, usize)>,
}

thread_local! {
    static LOCAL: RefCell<Option<Box<Local>>> = const { RefCell::new(None) };
}

/// Hashes a thread's label-set keys: field indexes and addresses, which no input chooses (the
/// values' text, which a request may choose, goes through the standard keyed hasher).
#[derive(Default)]
struct SetHasher(u64);

impl Hasher for SetHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// An interned value's identity in a thread's cache: its address (values are never freed while
/// their configuration lasts, and a new configuration drops every cache).
fn addr(v: &Arc<str>) -> usize {
    Arc::as_ptr(v).cast::<u8>() as usize
}

impl Labels {
    pub(crate) const fn new() -> Self {
        Labels {
            table: Mutex::new(None),
            active: AtomicBool::new(false),
            generation: AtomicU64::new(0),
        }
    }

    /// The table's lock, for `fork` (see `crate::fork`).
    pub(crate) fn lock_for_fork(&'static self) -> Box<dyn std::any::Any> {
        Box::new(self.table())
    }

    fn table(&self) -> MutexGuard<'_, Option<Box<Table>>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the fields shown as labels and the values kept per field. Spans created before keep
    /// their labels; values interned before stay.
    pub(crate) fn configure(&self, fields: &[String], limit: usize) {
        let mut guard = self.table();
        let t = guard.get_or_insert_with(Box::default);
        if t.fields
            .iter()
            .map(|f| &**f)
            .ne(fields.iter().map(String::as_str))
        {
            t.fields = fields.iter().map(|f| Arc::from(f.as_str())).collect();
            t.values = vec![HashMap::new(); t.fields.len()];
            // Sets are keyed by field position: new ones for the new fields (the ids handed
            // out keep their pairs).
            t.sets.clear();
        }
        t.limit = limit.clamp(1, MAX_LABEL_VALUES);
        t.generation = GENERATIONS.fetch_add(1, Ordering::Relaxed) + 1;
        self.generation.store(t.generation, Ordering::Release);
        self.active.store(!t.fields.is_empty(), Ordering::Release);
    }
}

/// The configured fields' values of one span: their text one after another, and per value its
/// field and where its text is.
#[derive(Default)]
struct Collect {
    fields: Vec<Arc<str>>,
    text: String,
    found: Vec<(usize, usize, usize)>,
}

impl Collect {
    fn start(&mut self) {
        self.text.clear();
        self.found.clear();
    }

    fn put(&mut self, field: &Field, value: impl FnOnce(&mut Capped<'_>)) {
        let Some(i) = self.fields.iter().position(|f| **f == *field.name()) else {
            return;
        };
        let start = self.text.len();
        value(&mut Capped {
            out: &mut self.text,
            left: MAX_LABEL_VALUE_CHARS,
        });
        self.found.push((i, start, self.text.len()));
    }

    /// The values found, in field order, the first of a field repeated.
    fn values(&mut self) -> impl Iterator<Item = (usize, &str)> {
        self.found.sort_by_key(|f| f.0);
        self.found.dedup_by_key(|f| f.0);
        self.found
            .iter()
            .map(|&(i, start, end)| (i, &self.text[start..end]))
    }
}

/// Appends what is written to it up to [`MAX_LABEL_VALUE_CHARS`] characters and drops the
/// rest, so that a huge value never grows the thread's buffer.
struct Capped<'a> {
    out: &'a mut String,
    left: usize,
}

impl std::fmt::Write for Capped<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        match s.char_indices().nth(self.left) {
            Some((cut, _)) => {
                self.out.push_str(&s[..cut]);
                self.left = 0;
            }
            None => {
                self.out.push_str(s);
                self.left -= s.chars().count();
            }
        }
        // Never an error: a value's formatting is not stopped, only not kept.
        Ok(())
    }
}

impl Visit for Collect {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, |s| {
            let _ = s.write_str(value);
        });
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, |s| {
            let _ = write!(s, "{value:?}");
        });
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, |s| {
            let _ = write!(s, "{value}");
        });
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, |s| {
            let _ = write!(s, "{value}");
        });
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, |s| {
            let _ = write!(s, "{value}");
        });
    }
}

impl Labels {
    /// The label set of a span being created: 0 when no configured field has a value in it.
    /// Without span labels configured, a load and a compare in the caller.
    #[inline(always)]
    pub(crate) fn of_span(&self, attrs: &Attributes<'_>) -> u32 {
        if !self.active.load(Ordering::Acquire) {
            return 0;
        }
        self.of_span_with_labels(attrs)
    }

    #[cold]
    #[inline(never)]
    fn of_span_with_labels(&self, attrs: &Attributes<'_>) -> u32 {
        let local = LOCAL.try_with(|l| {
            let mut l = l.try_borrow_mut().ok()?;
            Some(self.of_span_here(&mut l, attrs))
        });
        match local {
            Ok(Some(id)) => id,
            // This thread's cache is gone (thread-local teardown) or in use (a span created
            // while formatting a value): through the shared table alone.
            _ => self.of_span_shared(attrs),
        }
    }

    /// Through this thread's cache.
    fn of_span_here(&self, slot: &mut Option<Box<Local>>, attrs: &Attributes<'_>) -> u32 {
        let generation = self.generation.load(Ordering::Acquire);
        if slot.as_ref().is_none_or(|l| l.generation != generation) {
            *slot = self.fresh_local();
        }
        let Some(l) = slot.as_deref_mut() else {
            return 0;
        };
        let meta: &'static Metadata<'static> = attrs.metadata();
        let site = std::ptr::from_ref(meta) as usize;
        let entry = &mut l.callsites[(site >> 4) % LOCAL_CALLSITES];
        if entry.0 != site {
            let has = l
                .scratch
                .fields
                .iter()
                .any(|f| meta.fields().field(&**f).is_some());
            *entry = (site, has);
        }
        if !entry.1 {
            return 0;
        }
        l.scratch.start();
        attrs.record(&mut l.scratch);
        l.key.clear();
        let mut missing = false;
        for (i, text) in l.scratch.values() {
            let value = match l.values[i].get(text) {
                Some(v) => addr(v),
                None if l.full[i] => l.other.as_ref().map_or(0, addr),
                None => {
                    missing = true;
                    0
                }
            };
            l.key.push((i, value));
        }
        if l.key.is_empty() {
            return 0;
        }
        if !missing && let Some(&id) = l.sets.get(&l.key[..]) {
            return id;
        }
        self.learn(l)
    }

    /// A cache for this thread under the current configuration; `None` when none was made.
    #[cold]
    fn fresh_local(&self) -> Option<Box<Local>> {
        let guard = self.table();
        let t = guard.as_ref()?;
        Some(Box::new(Local {
            generation: t.generation,
            callsites: [(0, false); LOCAL_CALLSITES],
            values: vec![HashMap::new(); t.fields.len()],
            full: vec![false; t.fields.len()],
            other: None,
            sets: HashMap::default(),
            scratch: Collect {
                fields: t.fields.clone(),
                ..Collect::default()
            },
            key: Vec::new(),
        }))
    }

    /// The values and the set in `l.scratch` that this thread has not seen: from the shared
    /// table, under its lock, and kept in the cache. 0 if the fields changed meanwhile.
    #[cold]
    #[inline(never)]
    fn learn(&self, l: &mut Local) -> u32 {
        let mut guard = self.table();
        let Some(t) = guard.as_deref_mut() else {
            return 0;
        };
        if t.fields != l.scratch.fields {
            return 0; // reconfigured meanwhile
        }
        // (Other settings may have changed since the cache was filled, the limit: the values
        // come from the table, and the next span fills a fresh cache.)
        let mut key = Vec::with_capacity(l.scratch.found.len());
        l.key.clear();
        for (i, text) in l.scratch.values() {
            let value = t.value(i, text);
            if Arc::ptr_eq(&value, &t.other()) {
                if !l.full[i] {
                    // The field has no room left: this thread keeps every value it has.
                    l.full[i] = true;
                    l.other = Some(value.clone());
                    for (text, v) in &t.values[i] {
                        l.values[i].insert(text.as_str().into(), v.clone());
                    }
                }
            } else {
                l.values[i].insert(text.into(), value.clone());
            }
            l.key.push((i, addr(&value)));
            key.push((i, value));
        }
        let id = t.set(key);
        if l.sets.len() >= LOCAL_SETS {
            l.sets.clear();
        }
        l.sets.insert(l.key.clone(), id);
        id
    }

    /// Through the shared table alone, under its lock.
    #[cold]
    #[inline(never)]
    fn of_span_shared(&self, attrs: &Attributes<'_>) -> u32 {
        let mut c = {
            let guard = self.table();
            let Some(t) = guard.as_ref() else { return 0 };
            let meta = attrs.metadata().fields();
            if !t.fields.iter().any(|f| meta.field(&**f).is_some()) {
                return 0;
            }
            Collect {
                fields: t.fields.clone(),
                ..Collect::default()
            }
        };
        attrs.record(&mut c);
        let mut guard = self.table();
        let Some(t) = guard.as_deref_mut() else {
            return 0;
        };
        if t.fields != c.fields {
            return 0; // reconfigured meanwhile
        }
        let key: Vec<(usize, Arc<str>)> =
            c.values().map(|(i, text)| (i, t.value(i, text))).collect();
        if key.is_empty() {
            return 0;
        }
        t.set(key)
    }

    /// The (field, value) pairs of label set `id` (none for 0).
    pub(crate) fn pairs(&self, id: u32) -> Vec<(Arc<str>, Arc<str>)> {
        if id == 0 {
            return Vec::new();
        }
        self.table()
            .as_ref()
            .and_then(|t| t.by_id.get(id as usize - 1).cloned())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use tracing_subscriber::layer::Context;
    use tracing_subscriber::prelude::*;

    /// Records the label set of every span created, as the span path table would ask for it.
    struct Record {
        labels: &'static Labels,
        ids: std::sync::Mutex<Vec<u32>>,
    }

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for &'static Record {
        fn on_new_span(&self, attrs: &Attributes<'_>, _: &tracing::span::Id, _: Context<'_, S>) {
            let id = self.labels.of_span(attrs);
            // The path without the thread's cache (thread-local teardown, re-entry) agrees.
            if self.labels.active.load(Ordering::Acquire) {
                assert_eq!(
                    self.labels.of_span_shared(attrs),
                    id,
                    "the shared path differs"
                );
            }
            self.ids.lock().unwrap().push(id);
        }
    }

    fn record(labels: &'static Labels) -> &'static Record {
        Box::leak(Box::new(Record {
            labels,
            ids: Default::default(),
        }))
    }

    /// The label sets of spans `make` creates on this thread, through `labels`.
    fn ids_of(labels: &'static Labels, make: impl FnOnce()) -> Vec<u32> {
        let r = record(labels);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(r), make);
        r.ids.lock().unwrap().clone()
    }

    /// The label sets of spans with these routes, created on a new thread in this order.
    fn on_a_thread(labels: &'static Labels, routes: &'static [&'static str]) -> Vec<u32> {
        std::thread::spawn(move || {
            ids_of(labels, || {
                for route in routes {
                    drop(tracing::info_span!("req", route));
                }
            })
        })
        .join()
        .unwrap()
    }

    fn pairs_of(labels: &Labels, id: u32) -> Vec<(String, String)> {
        labels
            .pairs(id)
            .iter()
            .map(|(f, v)| (f.to_string(), v.to_string()))
            .collect()
    }

    fn route_of(labels: &Labels, id: u32) -> String {
        let pairs = pairs_of(labels, id);
        assert_eq!(pairs.len(), 1, "{pairs:?}");
        pairs[0].1.clone()
    }

    /// Each thread's cache gives what the shared table says: the same sets for the same values
    /// on every thread, the values interned by other threads, and the limit reached elsewhere.
    #[test]
    fn thread_caches_agree_with_the_shared_table() {
        static LABELS: Labels = Labels::new();
        LABELS.configure(&["route".to_owned()], 2);
        let first = on_a_thread(&LABELS, &["/a", "/a", "/b"]);
        assert_eq!(first[0], first[1]);
        assert_eq!(route_of(&LABELS, first[0]), "/a");
        assert_eq!(route_of(&LABELS, first[2]), "/b");
        // A second thread: "/b" was interned by the first, "/c" is past the limit of 2, and
        // "/b" again after that comes from the values copied when the field was found full.
        let second = on_a_thread(&LABELS, &["/b", "/c", "/b", "/d", "/a"]);
        assert_eq!(second[0], first[2]);
        assert_eq!(route_of(&LABELS, second[1]), OTHER);
        assert_eq!(
            second[3], second[1],
            "every value past the limit is (other)"
        );
        assert_eq!(second[2], first[2]);
        assert_eq!(second[4], first[0]);
        // Values cut to 64 characters, as the shared path cuts them.
        let long: &'static str = Box::leak("é".repeat(70).into_boxed_str());
        LABELS.configure(&["route".to_owned()], 8);
        let cut = on_a_thread(&LABELS, Box::leak(Box::new([long])));
        assert_eq!(route_of(&LABELS, cut[0]), "é".repeat(MAX_LABEL_VALUE_CHARS));
        // New fields: a cache filled under the old ones is not used, and a set of the new
        // field is not one of the old field's at the same position.
        let ids = ids_of(&LABELS, || {
            drop(tracing::info_span!("req", route = "GET"));
            LABELS.configure(&["method".to_owned()], 8);
            drop(tracing::info_span!("req", route = "GET"));
            drop(tracing::info_span!("req", method = "GET"));
        });
        assert_eq!(pairs_of(&LABELS, ids[0]), [("route".into(), "GET".into())]);
        assert_eq!(ids[1], 0, "route is no label any more");
        assert_eq!(pairs_of(&LABELS, ids[2]), [("method".into(), "GET".into())]);
    }

    /// Two instances (the runtime's and a test's) never read each other's thread cache.
    #[test]
    fn instances_do_not_share_a_cache() {
        static A: Labels = Labels::new();
        static B: Labels = Labels::new();
        A.configure(&["route".to_owned()], 8);
        B.configure(&["method".to_owned()], 8);
        let a = ids_of(&A, || {
            drop(tracing::info_span!("req", route = "/a", method = "GET"))
        });
        let b = ids_of(&B, || {
            drop(tracing::info_span!("req", route = "/a", method = "GET"))
        });
        assert_eq!(pairs_of(&A, a[0]), [("route".into(), "/a".into())]);
        assert_eq!(pairs_of(&B, b[0]), [("method".into(), "GET".into())]);
    }

    /// A span keeps its label when the profiler is configured again with the same fields while
    /// the span's value is being formatted.
    #[test]
    fn a_configuration_of_the_same_fields_meanwhile_keeps_the_label() {
        static LABELS: Labels = Labels::new();
        static FORMATTING: Barrier = Barrier::new(2);
        static CONFIGURED: Barrier = Barrier::new(2);
        static FIRST: AtomicBool = AtomicBool::new(true);
        struct Slow;
        impl std::fmt::Debug for Slow {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                // Only the first formatting waits (the test layer formats it again, through
                // the shared path).
                if FIRST.swap(false, Ordering::Relaxed) {
                    FORMATTING.wait();
                    CONFIGURED.wait();
                }
                f.write_str("/slow")
            }
        }
        LABELS.configure(&["route".to_owned()], 8);
        let span = std::thread::spawn(|| {
            ids_of(&LABELS, || drop(tracing::info_span!("req", route = ?Slow)))
        });
        FORMATTING.wait();
        LABELS.configure(&["route".to_owned()], 16);
        CONFIGURED.wait();
        let ids = span.join().unwrap();
        assert_eq!(route_of(&LABELS, ids[0]), "/slow");
    }

    /// A huge value is cut as it is written: the thread's buffer never holds it.
    #[test]
    fn a_huge_value_is_cut_as_it_is_written() {
        let mut c = Collect::default();
        let huge = "x".repeat(1 << 20);
        let mut w = Capped {
            out: &mut c.text,
            left: MAX_LABEL_VALUE_CHARS,
        };
        let _ = write!(w, "{huge}{huge}");
        assert_eq!(c.text.len(), MAX_LABEL_VALUE_CHARS);
        assert!(c.text.capacity() < 1024, "{}", c.text.capacity());
    }
}
