//! The heap sampler's stack table: a bucket per (span path tag, code stack) with its samples'
//! counts and estimates, lock-free for the allocating threads.
//!
//! [`MAX_STACKS`] buckets of up to [`MAX_HEAP_FRAMES`] frames, about 6 MiB of address space
//! mapped when sampling is first enabled. Buckets are handed out in order and found through an
//! index of slots by the stack's hash, so only the first buckets become memory, 752 bytes per
//! distinct stack. Samples whose stack finds no bucket are counted in bucket 0, the overflow.

use super::LIFETIME_BUCKETS;
use crate::Tag;
use std::sync::atomic::{AtomicPtr, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Stack buckets in the sample table (bucket 0 counts samples that found no room).
pub const MAX_STACKS: usize = 8192;
/// Frames kept per stack, innermost first.
pub const MAX_HEAP_FRAMES: usize = 64;

static TABLE: AtomicPtr<SampleTable> = AtomicPtr::new(std::ptr::null_mut());
/// Samples that found no bucket for their stack (counted in bucket 0).
static TABLE_FULL: AtomicU64 = AtomicU64::new(0);

/// Probes before a stack gives up looking for a bucket.
const MAX_PROBES: usize = 64;

pub(super) struct Bucket {
    /// Hash of (tag, stack), written with the stack before the bucket is published in a slot.
    key: AtomicU64,
    tag: AtomicU32,
    depth: AtomicU32,
    ips: [AtomicUsize; MAX_HEAP_FRAMES],
    samples: AtomicU64,
    sampled_bytes: AtomicU64,
    freed_samples: AtomicU64,
    freed_sampled_bytes: AtomicU64,
    alloc_objects_fp: AtomicU64,
    alloc_bytes: AtomicU64,
    free_objects_fp: AtomicU64,
    free_bytes: AtomicU64,
    life_objects_fp: [AtomicU64; LIFETIME_BUCKETS],
    life_bytes: [AtomicU64; LIFETIME_BUCKETS],
    temp_objects_fp: AtomicU64,
    temp_bytes: AtomicU64,
}

pub(super) struct SampleTable {
    buckets: [Bucket; MAX_STACKS],
    /// Where each stack is: open addressing by the stack's hash over [`SLOTS`] slots, each 0
    /// (free) or the index of the stack's bucket. Buckets are handed out in order (`next`), so
    /// the table's memory is its first buckets, as many as there are stacks: hashed straight
    /// into the buckets, each stack of a service's few hundred landed on a page of its own
    /// (a bucket is 752 bytes), and the table cost a page of memory per stack.
    slots: [AtomicU16; SLOTS],
    /// The next bucket to hand out (from 1: bucket 0 is the overflow).
    next: AtomicUsize,
    /// The buckets claimed so far, in the order they were claimed: `claimed` of them, each
    /// written once its bucket's stack is (0 until then). The readers go through this list
    /// rather than over every bucket, which would touch the whole 6 MiB table (every page of
    /// it, mapped on the first read) at each export, however few stacks it holds.
    claimed_list: [AtomicU16; MAX_STACKS],
    claimed: AtomicUsize,
}

/// Slots of the index: twice the buckets, so that probes stay short when the table is full.
const SLOTS: usize = 2 * MAX_STACKS;
/// The table, once made.
pub(super) fn table() -> Option<&'static SampleTable> {
    let t = TABLE.load(Ordering::Acquire);
    // SAFETY: TABLE only ever holds null or a fully initialised (zeroed) table that is never
    // freed.
    (!t.is_null()).then(|| unsafe { &*t })
}

/// Maps the table if it is not there yet (a mapping of its own, whose pages become memory
/// only as stacks fill it: `calloc` may hand back reused memory and clear all 6 MiB); false
/// when the kernel refuses.
pub(super) fn make_table() -> bool {
    if table().is_some() {
        return true;
    }
    let len = size_of::<SampleTable>();
    let raw = crate::counters::map_zeroed(len).cast::<SampleTable>();
    if raw.is_null() {
        return false;
    }
    if TABLE
        .compare_exchange(
            std::ptr::null_mut(),
            raw,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // SAFETY: `raw` is our own mapping of `len` bytes, and nobody else saw it.
        unsafe { libc::munmap(raw.cast(), len) };
    }
    true
}

/// Hash of a span path tag and a stack, never 0.
pub(crate) fn hash(tag: u32, ips: &[usize]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325_u64 ^ u64::from(tag);
    for &ip in ips {
        h = (h ^ ip as u64).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    h | 1
}

impl SampleTable {
    /// The bucket of (`tag`, `ips`), handed out if the stack is new; 0 (the overflow) when
    /// no bucket is left or none is found within [`MAX_PROBES`].
    pub(super) fn find_or_insert(&self, tag: u32, ips: &[usize]) -> usize {
        let key = hash(tag, ips);
        let start = key as usize % SLOTS;
        // A bucket taken from `next` and written with this stack, not yet published in a slot.
        let mut mine: Option<usize> = None;
        for probe in 0..MAX_PROBES {
            let slot = &self.slots[(start + probe) % SLOTS];
            let mut at = usize::from(slot.load(Ordering::Acquire));
            if at == 0 {
                let i = match mine {
                    Some(i) => i,
                    None => {
                        let i = self.next.fetch_add(1, Ordering::Relaxed) + 1;
                        if i >= MAX_STACKS {
                            break; // every bucket handed out
                        }
                        let b = &self.buckets[i];
                        b.tag.store(tag, Ordering::Relaxed);
                        b.depth.store(ips.len() as u32, Ordering::Relaxed);
                        for (slot, &ip) in b.ips.iter().zip(ips) {
                            slot.store(ip, Ordering::Relaxed);
                        }
                        b.key.store(key, Ordering::Relaxed);
                        mine = Some(i);
                        i
                    }
                };
                // Published with the slot: whoever reads the slot sees the bucket written.
                match slot.compare_exchange(0, i as u16, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        // Listed once, each bucket being published once and never freed, so there
                        // are fewer than MAX_STACKS claims.
                        let n = self.claimed.fetch_add(1, Ordering::Relaxed);
                        if let Some(entry) = self.claimed_list.get(n) {
                            entry.store(i as u16, Ordering::Release);
                        }
                        return i;
                    }
                    // Another stack took the slot first (maybe this one, from another thread).
                    Err(taken) => at = usize::from(taken),
                }
            }
            if self.buckets[at % MAX_STACKS].key.load(Ordering::Relaxed) == key {
                // (A bucket this thread wrote and could not publish stays unused: one per race
                // of two threads over one free slot.)
                return at;
            }
        }
        TABLE_FULL.fetch_add(1, Ordering::Relaxed);
        0
    }

    /// Bucket `i` (an index a sample header holds).
    pub(super) fn bucket(&self, i: usize) -> &Bucket {
        &self.buckets[i % MAX_STACKS]
    }
}

impl Bucket {
    /// Adds a sampled allocation of `size` bytes that stands for `objects` (fixed point) and
    /// `bytes`.
    pub(super) fn add_alloc(&self, size: usize, objects: u64, bytes: u64) {
        self.samples.fetch_add(1, Ordering::Relaxed);
        self.sampled_bytes.fetch_add(size as u64, Ordering::Relaxed);
        self.alloc_objects_fp.fetch_add(objects, Ordering::Relaxed);
        self.alloc_bytes.fetch_add(bytes, Ordering::Release);
    }

    /// Adds the free of a sampled allocation of `size` bytes that stood for `objects` and
    /// `bytes`, which lived in lifetime bucket `life` (and less than the temporary threshold).
    pub(super) fn add_free(
        &self,
        size: usize,
        objects: u64,
        bytes: u64,
        life: usize,
        temporary: bool,
    ) {
        self.life_objects_fp[life].fetch_add(objects, Ordering::Relaxed);
        self.life_bytes[life].fetch_add(bytes, Ordering::Relaxed);
        if temporary {
            self.temp_objects_fp.fetch_add(objects, Ordering::Relaxed);
            self.temp_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        self.freed_samples.fetch_add(1, Ordering::Relaxed);
        self.freed_sampled_bytes
            .fetch_add(size as u64, Ordering::Relaxed);
        self.free_objects_fp.fetch_add(objects, Ordering::Relaxed);
        self.free_bytes.fetch_add(bytes, Ordering::Release);
    }
}

/// The sampled allocations of one stack bucket: a code stack and a span path tag.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct StackTotals {
    /// The bucket's index; stable for the life of the process.
    pub bucket: u32,
    /// The span path current when the samples were taken.
    pub tag: Tag,
    /// Return addresses, innermost first (the first few are the allocator's own frames).
    /// Empty for bucket 0, which holds samples that found no room in the table.
    pub ips: Vec<usize>,
    /// Allocations sampled.
    pub samples: u64,
    /// Bytes of the sampled allocations (their actual sizes).
    pub sampled_bytes: u64,
    /// Sampled allocations freed since.
    pub freed_samples: u64,
    /// Bytes of those.
    pub freed_sampled_bytes: u64,
    /// Estimated allocations (each sample weighted by `1 / (1 - e^(-size/rate))`).
    pub alloc_objects: f64,
    /// Estimated bytes allocated.
    pub alloc_bytes: u64,
    /// Estimated allocations freed.
    pub free_objects: f64,
    /// Estimated bytes freed.
    pub free_bytes: u64,
    /// Estimated frees by lifetime, bucketed by [`LIFETIME_BOUNDS_NS`](super::LIFETIME_BOUNDS_NS).
    pub lifetime_objects: [f64; LIFETIME_BUCKETS],
    /// Estimated bytes freed by lifetime.
    pub lifetime_bytes: [u64; LIFETIME_BUCKETS],
    /// Estimated frees sooner than the temporary threshold after allocation.
    pub temporary_objects: f64,
    /// Estimated bytes of those.
    pub temporary_bytes: u64,
}

impl StackTotals {
    /// Estimated allocations not freed yet.
    pub fn inuse_objects(&self) -> f64 {
        (self.alloc_objects - self.free_objects).max(0.0)
    }

    /// Estimated bytes not freed yet.
    pub fn inuse_bytes(&self) -> u64 {
        self.alloc_bytes.saturating_sub(self.free_bytes)
    }
}

/// The overflow bucket and every bucket claimed so far whose claim is complete, in bucket order.
fn claimed_buckets(table: &SampleTable) -> Vec<usize> {
    let n = table.claimed.load(Ordering::Acquire).min(MAX_STACKS);
    let mut buckets: Vec<usize> = std::iter::once(0)
        .chain(
            table.claimed_list[..n]
                .iter()
                .map(|e| usize::from(e.load(Ordering::Acquire)))
                // 0: claimed, not yet listed (read again at the next export).
                .filter(|&i| i != 0),
        )
        .collect();
    buckets.sort_unstable();
    buckets
}

/// Every stack bucket with samples, in bucket order. Never blocks allocating threads; frees
/// are read before allocations, so in-use never reads negative.
pub fn read_stacks() -> Vec<StackTotals> {
    let Some(table) = table() else {
        return Vec::new();
    };
    let load = |c: &AtomicU64| c.load(Ordering::Acquire);
    let objects = |c: &AtomicU64| load(c) as f64 / crate::FP;
    let mut out = Vec::new();
    for i in claimed_buckets(table) {
        // Listed, so its stack is written (see `claimed_list`).
        let b = &table.buckets[i];
        let mut t = StackTotals {
            bucket: i as u32,
            freed_samples: load(&b.freed_samples),
            freed_sampled_bytes: load(&b.freed_sampled_bytes),
            free_objects: objects(&b.free_objects_fp),
            free_bytes: load(&b.free_bytes),
            lifetime_objects: std::array::from_fn(|k| objects(&b.life_objects_fp[k])),
            lifetime_bytes: std::array::from_fn(|k| load(&b.life_bytes[k])),
            temporary_objects: objects(&b.temp_objects_fp),
            temporary_bytes: load(&b.temp_bytes),
            ..StackTotals::default()
        };
        t.samples = load(&b.samples);
        if t.samples == 0 {
            continue;
        }
        t.sampled_bytes = load(&b.sampled_bytes);
        t.alloc_objects = objects(&b.alloc_objects_fp);
        t.alloc_bytes = load(&b.alloc_bytes);
        if i != 0 {
            t.tag = Tag::new(b.tag.load(Ordering::Relaxed));
            let depth = (b.depth.load(Ordering::Relaxed) as usize).min(MAX_HEAP_FRAMES);
            t.ips = b.ips[..depth]
                .iter()
                .map(|ip| ip.load(Ordering::Relaxed))
                .collect();
        }
        out.push(t);
    }
    out
}

/// Counters about the sampler itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeapSamplerStats {
    /// Mean bytes between samples (0: off).
    pub rate: u64,
    /// Stack buckets in use, out of [`MAX_STACKS`] - 1.
    pub stacks: usize,
    /// Samples counted in bucket 0 because their stack found no free bucket.
    pub table_full: u64,
}

/// Counters about the sampler itself.
pub fn sampler_stats() -> HeapSamplerStats {
    let stacks = table().map_or(0, |t| t.claimed.load(Ordering::Relaxed).min(MAX_STACKS - 1));
    HeapSamplerStats {
        rate: super::sample_rate(),
        stacks,
        table_full: TABLE_FULL.load(Ordering::Relaxed),
    }
}
