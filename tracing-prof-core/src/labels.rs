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
//! Cost: when fields are configured, creating a span whose callsite has one of them visits its
//! fields and takes a process-wide lock to intern the values; spans without those fields, and
//! enter and exit, pay nothing.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tracing::field::{Field, Visit};
use tracing_core::span::Attributes;

/// Fields that may be configured as labels at most.
pub const MAX_LABEL_FIELDS: usize = 8;
/// Characters kept of a label value: 64.
pub const MAX_LABEL_VALUE_CHARS: usize = 64;
/// Distinct values per field that may be configured at most.
pub const MAX_LABEL_VALUES: usize = 1024;
/// The value shown for every value of a field past its limit.
pub const OTHER: &str = "(other)";

/// A field's value and every field's label set, interned.
#[derive(Default)]
struct Table {
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

/// The configured fields and every label set interned so far: a part of
/// [`crate::runtime::Runtime`].
#[repr(align(64))]
pub(crate) struct Labels {
    /// Boxed: `None` is then all zeros, and so is the whole runtime (see `crate::runtime`).
    table: Mutex<Option<Box<Table>>>,
    /// Whether any field is configured: the only thing span creation reads when none is.
    active: AtomicBool,
}

impl Labels {
    pub(crate) const fn new() -> Self {
        Labels {
            table: Mutex::new(None),
            active: AtomicBool::new(false),
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
        }
        t.limit = limit.clamp(1, MAX_LABEL_VALUES);
        self.active.store(!t.fields.is_empty(), Ordering::Release);
    }
}

/// Collects the configured fields' values of one span.
struct Collect<'a> {
    fields: &'a [Arc<str>],
    found: Vec<(usize, String)>,
}

impl Collect<'_> {
    fn put(&mut self, field: &Field, value: impl FnOnce(&mut String)) {
        let Some(i) = self.fields.iter().position(|f| **f == *field.name()) else {
            return;
        };
        let mut s = String::new();
        value(&mut s);
        if s.chars().count() > MAX_LABEL_VALUE_CHARS {
            s = s.chars().take(MAX_LABEL_VALUE_CHARS).collect();
        }
        self.found.push((i, s));
    }
}

impl Visit for Collect<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, |s| s.push_str(value));
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
        let fields: Vec<Arc<str>> = {
            let guard = self.table();
            let Some(t) = guard.as_ref() else { return 0 };
            let meta = attrs.metadata().fields();
            if !t.fields.iter().any(|f| meta.field(&**f).is_some()) {
                return 0;
            }
            t.fields.clone()
        };
        let mut c = Collect {
            fields: &fields,
            found: Vec::new(),
        };
        attrs.record(&mut c);
        if c.found.is_empty() {
            return 0;
        }
        c.found.sort_by_key(|f| f.0);
        c.found.dedup_by_key(|f| f.0);
        let mut guard = self.table();
        let Some(t) = guard.as_mut() else { return 0 };
        if t.fields != fields {
            return 0; // reconfigured meanwhile
        }
        let limit = t.limit;
        let other = t.other.get_or_insert_with(|| Arc::from(OTHER)).clone();
        let key: Vec<(usize, Arc<str>)> = c
            .found
            .into_iter()
            .map(|(i, v)| {
                let values = &mut t.values[i];
                let value = match values.get(&v) {
                    Some(a) => a.clone(),
                    None if values.len() < limit => {
                        let a: Arc<str> = Arc::from(v.as_str());
                        values.insert(v, a.clone());
                        a
                    }
                    None => other.clone(),
                };
                (i, value)
            })
            .collect();
        if let Some(&id) = t.sets.get(&key) {
            return id;
        }
        let pairs: Vec<(Arc<str>, Arc<str>)> = key
            .iter()
            .map(|(i, v)| (t.fields[*i].clone(), v.clone()))
            .collect();
        t.by_id.push(pairs);
        let id = t.by_id.len() as u32;
        t.sets.insert(key, id);
        id
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
