//! Allocation sites of one thread, recorded exactly while a closure runs: what allocation
//! budgets in tests report. Every allocation the thread makes in the closure takes the
//! sampler's slow path and has its stack captured (microseconds each), into a table the caller
//! owns: nothing is shared with other threads, so parallel tests never see each other's sites.

use crate::tag::STATE;

/// Frames kept per site, innermost first.
pub const SITE_FRAMES: usize = 32;
/// Distinct stacks a [`SiteRecorder`] holds; more are counted in [`SiteRecorder::other`].
pub const MAX_SITES: usize = 256;

/// One allocation site: a code stack and what was allocated there.
#[derive(Clone, Copy, Debug)]
struct Site {
    key: u64,
    depth: u32,
    ips: [usize; SITE_FRAMES],
    count: u64,
    bytes: u64,
}

const EMPTY: Site = Site {
    key: 0,
    depth: 0,
    ips: [0; SITE_FRAMES],
    count: 0,
    bytes: 0,
};

/// A fixed table of allocation sites, filled by [`record_sites`].
#[derive(Debug)]
pub struct SiteRecorder {
    sites: Box<[Site; MAX_SITES]>,
    other: (u64, u64),
}

impl Default for SiteRecorder {
    fn default() -> Self {
        SiteRecorder {
            sites: Box::new([EMPTY; MAX_SITES]),
            other: (0, 0),
        }
    }
}

impl SiteRecorder {
    /// An empty table (allocates its storage now, never while recording).
    pub fn new() -> Self {
        SiteRecorder::default()
    }

    /// `(return addresses innermost first, allocations, bytes)` per site, in no order.
    /// Realloc counts as an allocation of its new size.
    pub fn sites(&self) -> impl Iterator<Item = (&[usize], u64, u64)> {
        self.sites
            .iter()
            .filter(|s| s.key != 0)
            .map(|s| (&s.ips[..s.depth as usize], s.count, s.bytes))
    }

    /// Allocations and bytes of sites that found no room in the table.
    pub fn other(&self) -> (u64, u64) {
        self.other
    }

    /// Adds one allocation of `size` bytes at the current stack.
    pub(crate) fn add(&mut self, size: usize) {
        let mut ips = [0usize; SITE_FRAMES];
        let depth = crate::unwind::capture(&mut ips);
        let key = crate::sample::hash(0, &ips[..depth]);
        let start = key as usize % MAX_SITES;
        for probe in 0..MAX_SITES {
            let s = &mut self.sites[(start + probe) % MAX_SITES];
            if s.key == 0 {
                *s = Site {
                    key,
                    depth: depth as u32,
                    ips,
                    count: 0,
                    bytes: 0,
                };
            }
            if s.key == key {
                s.count += 1;
                s.bytes += size as u64;
                return;
            }
        }
        self.other.0 += 1;
        self.other.1 += size as u64;
    }
}

/// Runs `f`, recording into `recorder` the stack of every allocation this thread makes in it.
/// Nested calls record into the innermost recorder only.
pub fn record_sites<T>(recorder: &mut SiteRecorder, f: impl FnOnce() -> T) -> T {
    struct Restore(*mut SiteRecorder);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = STATE.try_with(|s| {
                s.recorder.set(self.0);
                // Back to sampling: a fresh countdown.
                s.sample_gen.set(0);
                s.sample_left.set(-1);
            });
        }
    }
    let previous = STATE
        .try_with(|s| {
            let previous = s.recorder.replace(std::ptr::from_mut(recorder));
            s.sample_left.set(-1);
            previous
        })
        .unwrap_or(std::ptr::null_mut());
    let _restore = Restore(previous);
    f()
}
