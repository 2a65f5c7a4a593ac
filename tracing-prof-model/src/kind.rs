//! The kinds of profile a [`Snapshot`](crate::Snapshot) holds.

/// Which profile of a snapshot: each is one pprof file, one flame graph, one endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ProfileKind {
    /// Time per span path: count, wall, busy, idle, CPU and off-CPU time.
    Spans,
    /// Go's CPU profile: sampled code stacks under their span paths.
    Cpu,
    /// Go's heap profile: sampled code stacks under their span paths, in-use space shown by
    /// default (exact span paths when heap sampling is off).
    Heap,
    /// As [`ProfileKind::Heap`], allocated space shown by default (like Go's `allocs`).
    Allocs,
    /// Exact memory per span path (no code stacks), in-use space shown by default.
    SpanMemory,
    /// Frees of sampled allocations by lifetime, and temporary allocations, per code stack.
    Lifetimes,
    /// Exact memory per thread.
    Threads,
}

impl ProfileKind {
    /// Every kind.
    pub const ALL: [ProfileKind; 7] = [
        ProfileKind::Spans,
        ProfileKind::Cpu,
        ProfileKind::Heap,
        ProfileKind::Allocs,
        ProfileKind::SpanMemory,
        ProfileKind::Lifetimes,
        ProfileKind::Threads,
    ];

    /// Every kind with numbers of its own, in the order files list them (`allocs` is `heap` with
    /// another default sample type): what the file exporter writes by default and what the
    /// flight recorder keeps.
    pub const DISTINCT: [ProfileKind; 6] = [
        ProfileKind::Spans,
        ProfileKind::Cpu,
        ProfileKind::SpanMemory,
        ProfileKind::Heap,
        ProfileKind::Lifetimes,
        ProfileKind::Threads,
    ];

    /// The name used in file names and URLs: `spans`, `cpu`, `heap`, `allocs`, `span_memory`,
    /// `lifetimes`, `threads`.
    pub fn name(self) -> &'static str {
        match self {
            ProfileKind::Spans => "spans",
            ProfileKind::Cpu => "cpu",
            ProfileKind::Heap => "heap",
            ProfileKind::Allocs => "allocs",
            ProfileKind::SpanMemory => "span_memory",
            ProfileKind::Lifetimes => "lifetimes",
            ProfileKind::Threads => "threads",
        }
    }

    /// The kind named `name` (see [`ProfileKind::name`]).
    pub fn from_name(name: &str) -> Option<ProfileKind> {
        ProfileKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// What the kind shows, in a few words.
    pub fn description(self) -> &'static str {
        match self {
            ProfileKind::Spans => "time per span path: count, wall, busy, idle, CPU, off-CPU",
            ProfileKind::Cpu => "CPU time by code stack under span path, sampled",
            ProfileKind::Heap => {
                "memory held now, by code stack under span path, sampled (inuse_space)"
            }
            ProfileKind::Allocs => "memory allocated since start, as heap (alloc_space)",
            ProfileKind::SpanMemory => "memory per span path, exact (inuse_space)",
            ProfileKind::Lifetimes => {
                "frees by lifetime and temporary allocations, by code stack, sampled"
            }
            ProfileKind::Threads => "memory per thread, exact (inuse_space)",
        }
    }
}

impl std::fmt::Display for ProfileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
