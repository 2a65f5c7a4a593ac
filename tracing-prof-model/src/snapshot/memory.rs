//! The process's memory beside the heap: the heap's high-water mark ([`Peak`]) and what the
//! resident set is made of ([`ProcessMemory`]).

use crate::units::{format_bytes, format_utc};
use std::time::{Duration, SystemTime};

/// The heap at its high-water mark: a snapshot with [`Snapshot::peak`](super::Snapshot::peak)
/// set holds the exact memory per span path as it was read at the highest total, and the
/// sampled heap stacks as read at `stacks_at`.
///
/// There is no global in-use counter (each thread counts its own, and a free lands in the
/// freeing thread's table), so the peak is found by reading every thread's table every
/// `every`: a spike that rises and falls between two readings is not seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Peak {
    /// When the heap's total in use was read at its highest.
    pub at: SystemTime,
    /// Bytes in use then, every span path summed (exact).
    pub inuse_bytes: u64,
    /// When the sampled heap stacks were read: at the peak, or at an earlier reading of the
    /// same rise (they are read again only when the total has grown by 1/32 since, or a second
    /// has passed).
    pub stacks_at: SystemTime,
    /// Bytes in use at `stacks_at`.
    pub stacks_inuse_bytes: u64,
    /// How often the heap is read for its peak.
    pub every: Duration,
}

impl Peak {
    /// A peak of `inuse_bytes` read at `at`, its stacks read then, the heap read every `every`.
    pub fn new(at: SystemTime, inuse_bytes: u64, every: Duration) -> Self {
        Peak {
            at,
            inuse_bytes,
            stacks_at: at,
            stacks_inuse_bytes: inuse_bytes,
            every,
        }
    }

    /// The profiles' comment: `at the peak of 64.0 MiB in use, at 2026-11-28 01:02:03.456 UTC
    /// (the application's heap: ...)`, with when its stacks were read and what a shorter spike
    /// can hide.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "at the peak of {} in use, at {} (the application's heap: the profiler's own left out)",
            format_bytes(self.inuse_bytes),
            format_utc(self.at)
        );
        if self.stacks_at != self.at {
            s.push_str(&format!(
                "; heap stacks as read at {} ({} in use)",
                format_utc(self.stacks_at),
                format_bytes(self.stacks_inuse_bytes)
            ));
        }
        s.push_str(&format!(
            "; the heap is read every {} ms, a spike shorter than that may be missed",
            self.every.as_millis()
        ));
        s
    }
}

/// What the process's resident memory is made of at a capture (Linux:
/// `/proc/self/smaps_rollup`), beside the heap the profiler counts and what the inner
/// allocator says it holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProcessMemory {
    /// Resident set size.
    pub rss_bytes: u64,
    /// Resident anonymous memory (heap, stacks, anonymous mappings).
    pub anon_bytes: u64,
    /// Resident file-backed memory (code, mapped files).
    pub file_bytes: u64,
    /// The heap in use: every block the tagging allocator handed out and not freed (requested
    /// sizes, exact).
    pub heap_inuse_bytes: u64,
    /// What the inner allocator says, where it can be asked.
    pub allocator: Option<AllocatorMemory>,
    /// The memory limit of the process's cgroup and its usage, where one is set.
    pub cgroup: Option<CgroupMemory>,
}

/// The memory limit of the process's cgroup (the level, from its own up, with the least room
/// left) and its usage as the OOM killer and the kubelet see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CgroupMemory {
    /// cgroup v1 or v2.
    pub version: u8,
    /// The cgroup whose limit this is, in its hierarchy (`/kubepods/pod1`).
    pub level: String,
    /// `memory.max` (v2) or `memory.limit_in_bytes` (v1).
    pub limit_bytes: u64,
    /// `memory.current` or `memory.usage_in_bytes`: page cache included.
    pub usage_bytes: u64,
    /// The usage less inactive file pages (`inactive_file`, v1's `total_inactive_file`): what
    /// the kubelet evicts on and what reclaim cannot give back cheaply.
    pub working_set_bytes: u64,
    /// OOM kills in that cgroup so far (`memory.events` or `memory.oom_control`), where the
    /// kernel says.
    pub oom_kills: Option<u64>,
}

impl CgroupMemory {
    /// A v`version` cgroup `level` limited to `limit_bytes`, nothing used yet.
    pub fn new(version: u8, level: impl Into<String>, limit_bytes: u64) -> Self {
        CgroupMemory {
            version,
            level: level.into(),
            limit_bytes,
            ..CgroupMemory::default()
        }
    }

    /// The working set as a share of the limit (0 to 1 and beyond).
    pub fn used(&self) -> f64 {
        self.working_set_bytes as f64 / self.limit_bytes.max(1) as f64
    }

    /// `cgroup v1 /kubepods/pod1: working set 250.0 MiB of its 512.0 MiB limit (48.8%; usage
    /// 450.0 MiB with page cache)`.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "cgroup v{} {}: working set {} of its {} limit ({:.1}%; usage {} with page cache)",
            self.version,
            self.level,
            format_bytes(self.working_set_bytes),
            format_bytes(self.limit_bytes),
            self.used() * 100.0,
            format_bytes(self.usage_bytes)
        );
        if let Some(n) = self.oom_kills.filter(|&n| n > 0) {
            s.push_str(&format!("; {n} OOM kills in it so far"));
        }
        s
    }
}

/// What an allocator says of its own memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AllocatorMemory {
    /// Which allocator, and how it was asked (`glibc mallinfo2`).
    pub name: String,
    /// Bytes in blocks handed out, as the allocator counts them (with its rounding and our
    /// 8-byte headers).
    pub allocated_bytes: u64,
    /// Bytes the allocator holds from the system: handed out, cached and fragmented.
    pub held_bytes: u64,
}

impl AllocatorMemory {
    /// An allocator's report.
    pub fn new(name: impl Into<String>, allocated_bytes: u64, held_bytes: u64) -> Self {
        AllocatorMemory {
            name: name.into(),
            allocated_bytes,
            held_bytes,
        }
    }
}

impl ProcessMemory {
    /// Resident anonymous memory the heap in use does not account for: allocator caches and
    /// fragmentation, thread stacks, direct `mmap`s, C libraries' `malloc` (negative when
    /// part of the heap is not resident).
    pub fn unexplained_bytes(&self) -> i64 {
        self.anon_bytes as i64 - self.heap_inuse_bytes as i64
    }

    /// One line for people: `RSS 51.0 MiB (anonymous 44.2 MiB, file 6.8 MiB); heap in use
    /// 13.1 MiB (exact); ...`.
    pub fn describe(&self) -> String {
        let b = format_bytes;
        let signed = |v: i64| {
            if v < 0 {
                format!("-{}", b(v.unsigned_abs()))
            } else {
                b(v as u64)
            }
        };
        let mut s = format!(
            "RSS {} (anonymous {}, file {}); heap in use {} (exact)",
            b(self.rss_bytes),
            b(self.anon_bytes),
            b(self.file_bytes),
            b(self.heap_inuse_bytes)
        );
        match &self.allocator {
            Some(a) => s.push_str(&format!(
                "; {} holds {} ({} allocated): its caches and fragmentation {}, \
                 anonymous memory no allocator block explains (thread stacks, direct mmap, \
                 other allocators) {}",
                a.name,
                b(a.held_bytes),
                b(a.allocated_bytes),
                signed(a.held_bytes as i64 - self.heap_inuse_bytes as i64),
                signed(self.anon_bytes as i64 - a.held_bytes as i64)
            )),
            None => s.push_str(&format!(
                "; anonymous memory the heap does not explain {} (allocator caches and \
                 fragmentation, thread stacks, direct mmap)",
                signed(self.unexplained_bytes())
            )),
        }
        if let Some(c) = &self.cgroup {
            s.push_str("; ");
            s.push_str(&c.describe());
        }
        s
    }
}
