//! The per-thread view: exact memory per thread, with the names the OS knows the threads by.
//!
//! The allocator keeps one counter table per thread and credits every free to the table of the
//! thread that allocated the block, whichever thread frees it. Names are the OS thread names
//! (Linux; the name given to `std::thread::Builder::name`, cut to 15 bytes by the kernel): read
//! from `/proc/self/task/<tid>/comm` while the thread lives, and stored by the allocator when the
//! thread adopts its table and when it exits, so that an exited thread keeps its name.
//!
//! Limitation: a table is handed to the next new thread once its thread exits, with its counts
//! (sums stay exact that way). A table's numbers are therefore those of all the threads that
//! used it; for the long-lived worker threads of a service that is the thread itself.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use tracing_prof_model::{MemoryStats, ThreadProfile};

/// The last known (tid, name) of each of the allocator's thread tables: a part of
/// [`crate::runtime::Runtime`].
pub(crate) struct ThreadNames(Mutex<Option<HashMap<u32, (u64, String)>>>);

fn os_name(tid: u64) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
    Some(comm.trim_end_matches('\n').to_owned())
}

impl ThreadNames {
    pub(crate) const fn new() -> Self {
        ThreadNames(Mutex::new(None))
    }

    /// The names' lock, for `fork` (see `crate::fork`).
    pub(crate) fn lock_for_fork(&'static self) -> Box<dyn std::any::Any> {
        Box::new(self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Every thread table's memory, named.
    pub(crate) fn threads(&self) -> Vec<ThreadProfile> {
        let totals = tracing_prof_alloc::__private::read_threads();
        let mut guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let names = guard.get_or_insert_with(HashMap::new);
        totals
            .into_iter()
            .filter(|t| t.alloc_objects > 0 || t.inuse_bytes > 0)
            .map(|t| {
                let name = if t.index == 0 {
                    "(no thread table)".to_owned()
                } else {
                    let stored = {
                        let end = t.name.iter().position(|&b| b == 0).unwrap_or(t.name.len());
                        String::from_utf8_lossy(&t.name[..end]).into_owned()
                    };
                    let known = names.get(&t.index).filter(|(tid, _)| *tid == t.tid);
                    match known {
                        // A live thread may have been renamed since; an exited one's last name
                        // was stored at its exit.
                        Some((_, n)) if t.alive || stored.is_empty() => n.clone(),
                        _ => {
                            let n = if t.alive && t.tid != 0 {
                                os_name(t.tid)
                            } else {
                                None
                            }
                            .or_else(|| (!stored.is_empty()).then(|| stored.clone()))
                            .unwrap_or_else(|| format!("thread-{}", t.index));
                            names.insert(t.index, (t.tid, n.clone()));
                            n
                        }
                    }
                };
                let mut p = ThreadProfile::new(t.index, t.tid, name, t.alive);
                let mut m = MemoryStats::default();
                m.alloc_objects = t.alloc_objects;
                m.alloc_bytes = t.alloc_bytes;
                m.inuse_objects = t.inuse_objects;
                m.inuse_bytes = t.inuse_bytes;
                p.memory = m;
                p
            })
            .collect()
    }
}
