//! [`Snapshot::profile`]: one kind of a snapshot as a [`Profile`].
//!
//! | kind | samples | sample types | default |
//! |------|---------|--------------|---------|
//! | `spans` | span paths | `spans/count`, `wall`, `wall_busy`, `wall_idle`, and when CPU time is measured `cpu`, `off_cpu` (and `cpu_user`, `cpu_sys` with getrusage), in nanoseconds; `errors` (spans that recorded an ERROR event); `intervals` and `durations` (counts) on samples of their own, per path and enter-to-exit length (label `interval`) or latency bucket (label `duration_le`) | `cpu`, else `wall_busy` |
//! | `cpu` | sampled code stacks under span paths (label `span_path`; `span_id` and `trace_id` on samples linked to a trace span) | `samples/count`, `cpu/nanoseconds` | `cpu` |
//! | `heap` | sampled code stacks under span paths (exact span paths when sampling is off) | `alloc_objects/count`, `alloc_space/bytes`, `inuse_objects/count`, `inuse_space/bytes` | `inuse_space` |
//! | `allocs` | as `heap` | as `heap` | `alloc_space` |
//! | `span_memory` | span paths, exact | as `heap` | `inuse_space` |
//! | `lifetimes` | sampled stacks, one sample per lifetime bucket (label `lifetime`); span paths for what outlived its span | `freed_objects/count`, `freed_space/bytes`, `temporary_objects/count`, `temporary_space/bytes`, `outlived_objects/count`, `outlived_space/bytes` | `temporary_space` |
//! | `threads` | one per thread (labels `thread`, `tid`), exact | as `heap` | `inuse_space` |
//!
//! The sampled kinds are Go's profiles exactly: `heap` has period type `space/bytes`, period =
//! the sampling rate and a numeric label `bytes` (the mean sampled size); `cpu` has period type
//! `cpu/nanoseconds` and period = 1e9 / Hz. Stacks are span frames, root first, then code frames.
//! A window gives its start and its length, as Go's CPU profiles do; so does the `cpu` kind
//! of a cumulative snapshot (from the profiler's start). The other kinds of a cumulative
//! snapshot have no duration (their counters run since the process started), and their time
//! is when they were collected, as Go's heap profiles have it.

mod sink;

use crate::kind::ProfileKind;
use crate::pprof::Encoder;
use crate::profile::{Frame, FrameKind, Label, Profile, SampleType};
use crate::snapshot::{
    ALL_TRIMMED_FRAME, CodeFrame, CodeStack, CpuSource, DURATION_BOUNDS_NS, LIFETIME_BUCKET_NAMES,
    MemoryStats, NOTHING_UNWOUND_FRAME, PathProfile, Snapshot, SpanFrame, Symbols,
    TABLE_FULL_FRAME,
};
pub(crate) use sink::{LabelRef, Samples, Stack};

/// Sample types of the memory kinds, in Go's order and with Go's names.
pub const MEMORY_SAMPLE_TYPES: [(&str, &str); 4] = [
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
];

/// Sample types of [`ProfileKind::Lifetimes`].
pub const LIFETIME_SAMPLE_TYPES: [(&str, &str); 6] = [
    ("freed_objects", "count"),
    ("freed_space", "bytes"),
    ("temporary_objects", "count"),
    ("temporary_space", "bytes"),
    ("outlived_objects", "count"),
    ("outlived_space", "bytes"),
];

/// Sample types of [`ProfileKind::Cpu`], as Go's CPU profiles have them.
pub const CPU_SAMPLE_TYPES: [(&str, &str); 2] = [("samples", "count"), ("cpu", "nanoseconds")];

fn types(t: &[(&str, &str)]) -> Vec<SampleType> {
    t.iter().map(|&(n, u)| SampleType::new(n, u)).collect()
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn memory_values(m: &MemoryStats) -> [i64; 4] {
    [
        m.alloc_objects,
        m.alloc_bytes,
        m.inuse_objects,
        m.inuse_bytes,
    ]
    .map(int)
}

/// The frame of a span callsite.
pub(crate) fn span_frame(f: &SpanFrame) -> Frame {
    let mut frame = Frame::new(FrameKind::Span, f.qualified_name(), f.file.clone(), f.line);
    // A synthetic frame (`(no span)`) goes by its own name.
    if !f.is_synthetic() {
        frame.path_name = Some(f.path_name.clone());
    }
    frame
}

/// The frame of a code function.
pub(crate) fn code_frame(f: &CodeFrame) -> Frame {
    Frame::new(FrameKind::Code, f.function.clone(), f.file.clone(), f.line)
}

/// The field labels of a span path (see [`SpanFrame::fields`]): one per field name, the
/// innermost span's value where several spans of the path set the same field.
pub(crate) fn field_labels(frames: &[SpanFrame]) -> Vec<Label> {
    field_label_refs(frames)
        .into_iter()
        .map(LabelRef::owned)
        .collect()
}

/// [`field_labels`], borrowed from the frames.
fn field_label_refs(frames: &[SpanFrame]) -> Vec<LabelRef<'_>> {
    let mut out: Vec<LabelRef<'_>> = Vec::new();
    for f in frames.iter().rev() {
        for (k, v) in &f.fields {
            if !out
                .iter()
                .any(|l| matches!(l, LabelRef::Str(key, _) if *key == &**k))
            {
                out.push(LabelRef::Str(k, v));
            }
        }
    }
    out
}

/// The field labels of `frames`, then `ours`: borrowed as they are when the spans have no
/// field labels (the common case, and no allocation per sampled stack).
fn with_fields<'a>(
    frames: &'a [SpanFrame],
    ours: &'a [LabelRef<'a>],
) -> std::borrow::Cow<'a, [LabelRef<'a>]> {
    let mut fields = field_label_refs(frames);
    if fields.is_empty() {
        return ours.into();
    }
    fields.extend_from_slice(ours);
    fields.into()
}

/// The label of a suspected leak.
const LEAK: LabelRef<'static> = LabelRef::Str("leak", "suspected");

/// The label keys the profiles set themselves: a span field of one of these names cannot be a
/// label (it would stand beside ours, or be read as ours: `span_id` and `trace_id` as a trace
/// link, `service.name` as the service by Pyroscope's OTLP ingestion).
pub const PROFILE_LABELS: [&str; 13] = [
    "span_path",
    "duration_le",
    "span_id",
    "trace_id",
    "long_poll",
    "long_polls",
    "interval",
    "lifetime",
    "leak",
    "bytes",
    "thread",
    "tid",
    "service.name",
];

impl ProfileKind {
    /// Whether this kind shows sampled code stacks for `snapshot` (else exact span paths).
    pub fn is_sampled(self, snapshot: &Snapshot) -> bool {
        match self {
            ProfileKind::Heap | ProfileKind::Allocs => snapshot.sample_rate > 0,
            ProfileKind::Lifetimes | ProfileKind::Cpu => true,
            _ => false,
        }
    }

    /// Whether `snapshot` has anything for this kind at all (the `cpu` kind needs CPU
    /// sampling, whichever way per-span CPU time is measured).
    pub fn is_available(self, snapshot: &Snapshot) -> bool {
        self != ProfileKind::Cpu || snapshot.cpu_sample_rate() > 0
    }
}

/// The sample types of the `spans` kind for a snapshot whose CPU time came from `cpu`.
pub fn span_sample_types(cpu: CpuSource) -> Vec<SampleType> {
    let mut t = types(&[
        ("spans", "count"),
        ("wall", "nanoseconds"),
        ("wall_busy", "nanoseconds"),
        ("wall_idle", "nanoseconds"),
    ]);
    if cpu.is_measured() {
        t.push(SampleType::new("cpu", "nanoseconds"));
        t.push(SampleType::new("off_cpu", "nanoseconds"));
    }
    if cpu == CpuSource::Rusage {
        t.push(SampleType::new("cpu_user", "nanoseconds"));
        t.push(SampleType::new("cpu_sys", "nanoseconds"));
    }
    // Spans that recorded an ERROR event, on the path's sample.
    t.push(SampleType::new("errors", "count"));
    // Counted on samples of their own, one per path and length (label `interval`).
    t.push(SampleType::new("intervals", "count"));
    // The same for closed spans by wall time (numeric label `duration_le`).
    t.push(SampleType::new("durations", "count"));
    t
}

fn span_values(p: &PathProfile, cpu: CpuSource) -> Vec<i64> {
    let t = &p.time;
    let mut v = vec![int(t.spans), int(t.wall_ns), int(t.busy_ns), int(t.idle_ns)];
    if cpu.is_measured() {
        v.push(int(t.cpu_ns));
        v.push(int(t.off_cpu_ns()));
    }
    if cpu == CpuSource::Rusage {
        v.push(int(t.cpu_user_ns));
        v.push(int(t.cpu_sys_ns));
    }
    v.push(int(t.errors));
    v.push(0); // intervals: on the samples of their own
    v.push(0); // durations: the same
    v
}

impl Snapshot {
    /// The `kind` profile of this snapshot; see the module docs for what each kind holds.
    pub fn profile(&self, kind: ProfileKind) -> Profile {
        let mut out = self.header(kind);
        self.samples(kind, &mut out);
        out
    }

    /// The `kind` profile of this snapshot as a gzip'd pprof file: what
    /// `self.profile(kind).encode()` gives (the same message once decoded, its fields in
    /// another order), written sample by sample as the snapshot holds them. No [`Profile`] is
    /// built: an export costs the compressed output, one entry per distinct frame and string,
    /// and no allocation per sample but its labels, where `profile(kind)` holds every sample's
    /// frames twice over.
    pub fn encode(&self, kind: ProfileKind) -> Vec<u8> {
        let header = self.header(kind);
        let mut out = Encoder::new(&header);
        self.samples(kind, &mut out);
        out.finish(&header)
    }

    /// Everything of the `kind` profile but its samples.
    fn header(&self, kind: ProfileKind) -> Profile {
        let sampled = kind.is_sampled(self);
        let (sample_types, period_type, period) = match kind {
            ProfileKind::Spans => (span_sample_types(self.cpu), ("spans", "count"), 1),
            ProfileKind::Cpu => (
                types(&CPU_SAMPLE_TYPES),
                ("cpu", "nanoseconds"),
                self.cpu_period_ns().max(1),
            ),
            ProfileKind::Lifetimes => (types(&LIFETIME_SAMPLE_TYPES), ("space", "bytes"), 1),
            ProfileKind::Heap | ProfileKind::Allocs if sampled => (
                types(&MEMORY_SAMPLE_TYPES),
                ("space", "bytes"),
                self.sample_rate.max(1),
            ),
            ProfileKind::Heap
            | ProfileKind::Allocs
            | ProfileKind::SpanMemory
            | ProfileKind::Threads => (types(&MEMORY_SAMPLE_TYPES), ("space", "bytes"), 1),
        };
        let mut out = Profile::new(sample_types);
        out.period_type = Some(SampleType::new(period_type.0, period_type.1));
        out.period = int(period);
        out.default_sample_type = Some(
            match kind {
                ProfileKind::Spans if self.cpu.is_measured() => "cpu",
                ProfileKind::Spans => "wall_busy",
                ProfileKind::Cpu => "cpu",
                ProfileKind::Heap | ProfileKind::SpanMemory | ProfileKind::Threads => "inuse_space",
                ProfileKind::Allocs => "alloc_space",
                ProfileKind::Lifetimes => "temporary_space",
            }
            .to_owned(),
        );
        // As Go's profiles: a window's time is when it started, and its duration follows; so
        // are a CPU profile's (cumulative ones cover the time since the profiler started); a
        // cumulative heap profile's time is when it was collected, with no duration.
        let spans_time = self.window || kind == ProfileKind::Cpu;
        out.time = Some(if spans_time {
            self.time.checked_sub(self.duration).unwrap_or(self.time)
        } else {
            self.time
        });
        out.duration = spans_time.then_some(self.duration);
        out.binary = self.binary.clone();
        out.comments.extend(self.comments(kind));
        out
    }

    /// The `kind` profile's samples, into `out`.
    fn samples(&self, kind: ProfileKind, out: &mut impl Samples) {
        match kind {
            ProfileKind::Spans => self.span_samples(out),
            ProfileKind::Cpu => self.cpu_samples(out),
            ProfileKind::Threads => self.thread_samples(out),
            ProfileKind::Lifetimes => self.lifetime_samples(out),
            ProfileKind::Heap | ProfileKind::Allocs if kind.is_sampled(self) => {
                self.heap_samples(out)
            }
            ProfileKind::Heap | ProfileKind::Allocs | ProfileKind::SpanMemory => {
                self.memory_path_samples(out)
            }
        }
    }

    fn span_samples(&self, out: &mut impl Samples) {
        for path in &self.paths {
            let values = span_values(path, self.cpu);
            if values.iter().all(|&v| v == 0) {
                continue;
            }
            let mut labels = field_label_refs(&path.frames);
            if self.is_suspected_leak(path) {
                labels.push(LEAK);
            }
            if path.time.long_polls > 0 {
                labels.push(LabelRef::Num("long_polls", int(path.time.long_polls), None));
            }
            out.push(Stack::Path(&path.frames, None), &values, &labels);
        }
        // The intervals' lengths: per path, a sample for each length bucket, with only
        // `intervals`, labelled `interval=<10ms` and so on (`-sample_index=intervals -tags`).
        let n = span_sample_types(self.cpu).len();
        let mut values = vec![0; n];
        for path in &self.paths {
            for (count, name) in path.time.intervals.iter().zip(LIFETIME_BUCKET_NAMES) {
                if *count == 0 {
                    continue;
                }
                values[n - 2] = int(*count);
                let mut labels = field_label_refs(&path.frames);
                labels.push(LabelRef::Str("interval", name));
                out.push(Stack::Path(&path.frames, None), &values, &labels);
            }
        }
        // The latency histogram: per path, a sample for each bucket spans closed in, with only
        // `durations`, labelled with the bucket's bound (`duration_le`, nanoseconds; the last
        // bucket, past every bound, `i64::MAX`): what `/metrics` serves, in the files too.
        let mut values = vec![0; n];
        for path in &self.paths {
            for (i, count) in path.time.durations.iter().enumerate() {
                if *count == 0 {
                    continue;
                }
                values[n - 1] = int(*count);
                let le = DURATION_BOUNDS_NS.get(i).map_or(i64::MAX, |&b| int(b));
                let mut labels = field_label_refs(&path.frames);
                labels.push(LabelRef::Num("duration_le", le, Some("nanoseconds")));
                out.push(Stack::Path(&path.frames, None), &values, &labels);
            }
        }
    }

    fn cpu_samples(&self, out: &mut impl Samples) {
        for s in &self.cpu_stacks {
            if s.samples == 0 {
                continue;
            }
            let span_path = crate::snapshot::display_path(&s.frames);
            let ours = [
                LabelRef::Str("span_path", &span_path),
                LabelRef::Str("long_poll", "true"),
            ];
            let labels = with_fields(&s.frames, &ours[..if s.long_poll { 2 } else { 1 }]);
            let stack = Stack::Path(&s.frames, Some(&s.code));
            // CPU time of `n` of the stack's samples (each sample's share of `cpu_ns`).
            let cpu =
                |n: u64| (u128::from(s.cpu_ns) * u128::from(n) / u128::from(s.samples)) as u64;
            // Samples linked to a trace span on samples of their own, labelled as Pyroscope's
            // span profiles and Grafana's "profiles for this span" expect.
            for l in &s.links {
                let (span_id, trace_id) = (l.link.span_id_hex(), l.link.trace_id_hex());
                let mut linked = labels.to_vec();
                linked.push(LabelRef::Str("span_id", &span_id));
                linked.push(LabelRef::Str("trace_id", &trace_id));
                out.push(stack, &[int(l.samples), int(cpu(l.samples))], &linked);
            }
            let rest = s.unlinked_samples();
            if rest > 0 {
                let linked_cpu: u64 = s.links.iter().map(|l| cpu(l.samples)).sum();
                let values = [int(rest), int(s.cpu_ns.saturating_sub(linked_cpu))];
                out.push(stack, &values, &labels);
            }
        }
    }

    /// One sample per span path, exact memory counters.
    fn memory_path_samples(&self, out: &mut impl Samples) {
        for path in &self.paths {
            let values = memory_values(&path.memory);
            if values.iter().all(|&v| v == 0) {
                continue;
            }
            let mut labels = field_label_refs(&path.frames);
            if self.is_suspected_leak(path) {
                labels.push(LEAK);
            }
            out.push(Stack::Path(&path.frames, None), &values, &labels);
        }
    }

    /// Go's heap profile: one sample per sampled code stack under its span path.
    fn heap_samples(&self, out: &mut impl Samples) {
        for s in &self.stacks {
            let values = memory_values(&s.memory);
            if values.iter().all(|&v| v == 0) {
                continue;
            }
            let ours = [
                LabelRef::Num("bytes", int(s.mean_size()), Some("bytes")),
                LEAK,
            ];
            let suspected =
                self.is_suspected_stack_leak(s) || self.is_suspected_path(s.kind, &s.frames);
            let labels = with_fields(&s.frames, &ours[..if suspected { 2 } else { 1 }]);
            out.push(Stack::Path(&s.frames, Some(&s.code)), &values, &labels);
        }
    }

    /// Frees of sampled allocations per stack and lifetime bucket; temporaries in a sample of
    /// their own per stack (label `lifetime=temporary`), so that each sample type sums right;
    /// and per span path what outlived its span.
    fn lifetime_samples(&self, out: &mut impl Samples) {
        for s in &self.stacks {
            let l = &s.lifetimes;
            if l.freed() == 0 {
                continue;
            }
            let stack = Stack::Path(&s.frames, Some(&s.code));
            let fields = field_label_refs(&s.frames);
            for (k, name) in LIFETIME_BUCKET_NAMES.iter().enumerate() {
                if l.freed_objects[k] == 0 && l.freed_bytes[k] == 0 {
                    continue;
                }
                let mut labels = fields.clone();
                labels.push(LabelRef::Str("lifetime", name));
                let values = [int(l.freed_objects[k]), int(l.freed_bytes[k]), 0, 0, 0, 0];
                out.push(stack, &values, &labels);
            }
            // No `lifetime` label on the temporary and outlived samples: their sample types
            // say what they are, and a label with a zero value would be listed by
            // `go tool pprof -tags` under every other sample type.
            if l.temporary_objects > 0 {
                let values = [0, 0, int(l.temporary_objects), int(l.temporary_bytes), 0, 0];
                out.push(stack, &values, &fields);
            }
        }
        for path in self.paths.iter().filter(|p| p.outlived.0 > 0) {
            let values = [0, 0, 0, 0, int(path.outlived.0), int(path.outlived.1)];
            let labels = field_label_refs(&path.frames);
            out.push(Stack::Path(&path.frames, None), &values, &labels);
        }
    }

    /// One sample per thread, its name as the only frame.
    fn thread_samples(&self, out: &mut impl Samples) {
        for t in &self.threads {
            let values = memory_values(&t.memory);
            if values.iter().all(|&v| v == 0) {
                continue;
            }
            // The table index keeps threads of one name (a pool's workers) apart. pprof drops
            // parenthesised parts of names, so the state goes inside the brackets.
            let function = if t.alive || t.index == 0 {
                format!("thread {} [{}]", t.name, t.index)
            } else {
                format!("thread {} [{}, exited]", t.name, t.index)
            };
            let labels = [
                LabelRef::Str("thread", &t.name),
                LabelRef::Num("tid", int(t.tid), None),
            ];
            out.push(Stack::Thread(&function), &values, &labels);
        }
    }

    fn comments(&self, kind: ProfileKind) -> Vec<String> {
        let mut out = Vec::new();
        for leak in &self.suspected_leaks {
            out.push(format!(
                "tracing-prof: suspected leak: {}: in-use grew in {} captures without falling, by {} bytes, to {} bytes",
                leak.labeled_path(),
                leak.snapshots,
                leak.growth_bytes,
                leak.inuse_bytes
            ));
        }
        if self.window {
            out.push(format!(
                "tracing-prof: window of {:.3} s: counters grew by these values in it; in-use is as of its end",
                self.duration.as_secs_f64()
            ));
        } else if self.peak.is_some() {
            out.push(
                "tracing-prof: cumulative: counters since the profiler started; in-use is as of the peak"
                    .to_owned(),
            );
        } else {
            out.push(
                "tracing-prof: cumulative: counters since the profiler started; in-use is as of the capture"
                    .to_owned(),
            );
        }
        let memory_kind = matches!(kind, ProfileKind::Heap | ProfileKind::SpanMemory);
        if let Some(peak) = &self.peak
            && memory_kind
        {
            out.push(format!("tracing-prof: {}", peak.describe()));
        }
        if let Some(m) = &self.process_memory
            && memory_kind
            && self.peak.is_none()
        {
            out.push(format!("tracing-prof: process memory: {}", m.describe()));
        }
        if self.overflowed_spans > 0 {
            out.push(format!(
                "tracing-prof: {} spans were counted under (other span paths): raise the span path cap",
                self.overflowed_spans
            ));
        }
        let table_full = |code: &CodeStack| {
            code.first()
                .is_some_and(|f| &*f.function == TABLE_FULL_FRAME)
        };
        if kind.is_sampled(self) {
            match self.symbols {
                Symbols::SymbolTable => out.push(
                    "tracing-prof: the program has no debug information: code frames are named from its symbol table, without inlined functions, files and lines (set debug = \"limited\" in the Cargo profile you build with)".to_owned(),
                ),
                Symbols::Stripped => out.push(
                    "tracing-prof: the program is stripped (no symbol table, no debug information): code frames are addresses (build without strip, and with debug = \"limited\" for names, files and lines)".to_owned(),
                ),
                _ => {}
            }
        }
        match kind {
            ProfileKind::Heap | ProfileKind::Allocs if kind.is_sampled(self) => {
                if let Some(full) = self.stacks.iter().find(|s| table_full(&s.code)) {
                    out.push(format!(
                        "tracing-prof: {} samples found the stack table full and are counted under {TABLE_FULL_FRAME}",
                        full.samples
                    ));
                }
                out.push(format!(
                    "tracing-prof: sampled: a sample point every {} bytes allocated on average; values are unbiased estimates (each sample stands for the points it covered)",
                    self.sample_rate
                ));
            }
            ProfileKind::Lifetimes => out.push(format!(
                "tracing-prof: temporary = freed within {:?} of allocation",
                self.temporary_threshold
            )),
            ProfileKind::Cpu => {
                if let Some(full) = self.cpu_stacks.iter().find(|s| table_full(&s.code)) {
                    out.push(format!(
                        "tracing-prof: {} CPU samples found the stack table full and are counted under {TABLE_FULL_FRAME}",
                        full.samples
                    ));
                }
                for (frame, why) in [
                    (NOTHING_UNWOUND_FRAME, "had no return address the sampler could walk to"),
                    (ALL_TRIMMED_FRAME, "were taken in tracing's own entry into their span"),
                ] {
                    let n: u64 = self
                        .cpu_stacks
                        .iter()
                        .filter(|s| s.code.len() == 1 && s.code.first().is_some_and(|f| *f.function == *frame))
                        .map(|s| s.samples)
                        .sum();
                    if n > 0 {
                        out.push(format!("tracing-prof: {n} CPU samples {why}: counted under {frame}"));
                    }
                }
                let hz = self.cpu_sample_rate();
                if hz > 0 {
                    out.push(format!(
                        "tracing-prof: sampled: {hz} samples per second of CPU time on each thread; each stands for {} ns",
                        self.cpu_period_ns()
                    ));
                }
            }
            ProfileKind::Spans => match self.cpu {
                CpuSource::Sampled { hz } => out.push(format!(
                    "tracing-prof: cpu is sampled ({hz} Hz, estimates); off_cpu = wall_busy - cpu: time entered but not running (blocked, waiting, descheduled)"
                )),
                CpuSource::ThreadClock | CpuSource::Rusage => out.push(
                    "tracing-prof: cpu is measured on every enter and exit; off_cpu = wall_busy - cpu: time entered but not running (blocked, waiting, descheduled)"
                        .to_owned(),
                ),
                _ => {}
            },
            _ => {}
        }
        out
    }
}

#[cfg(test)]
mod tests;
