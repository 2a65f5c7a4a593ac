//! A pool of long-lived threads for thread-scaling benchmarks: started once, one thread after
//! another, then asked to run a job on any number of them at once.
//!
//! Threads spawned for each measurement, as `std::thread::scope` would, put their spawning and
//! their first-touch costs into every measurement, and take per-thread ids (`tracing`'s
//! registry slots, sharded-slab's shards, an allocator's tables) in whatever order they happen
//! to start. A service's runtime workers live long and took their ids one after another; the
//! pool is that. Which of its threads run a job is chosen by stride: consecutive threads
//! (neighbouring ids), or every `stride`-th one (ids that many apart).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A job: runs `n` operations on the calling pool thread.
pub type Job = fn(u64);

#[derive(Clone, Copy)]
struct Order {
    serial: u64,
    threads: usize,
    stride: usize,
    job: Job,
    n: u64,
}

/// The threads and what they are asked to do.
pub struct Pool {
    order: Mutex<(Order, bool)>,
    start: Condvar,
    /// (serial of the job, participants done with it).
    done: Mutex<(u64, usize)>,
    all_done: Condvar,
    size: usize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

fn nothing(_: u64) {}

impl Pool {
    /// `size` threads, started one after another: thread `i` has run `warm(i)` (where it takes
    /// its per-thread ids) before thread `i + 1` starts.
    pub fn start(size: usize, warm: fn(usize)) -> Arc<Pool> {
        let pool = Arc::new(Pool {
            order: Mutex::new((
                Order {
                    serial: 0,
                    threads: 0,
                    stride: 1,
                    job: nothing,
                    n: 0,
                },
                false,
            )),
            start: Condvar::new(),
            done: Mutex::new((0, 0)),
            all_done: Condvar::new(),
            size,
        });
        for i in 0..size {
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let pool = Arc::clone(&pool);
            std::thread::Builder::new()
                .name(format!("bench-{i}"))
                .spawn(move || {
                    warm(i);
                    let _ = ready_tx.send(());
                    pool.work(i);
                })
                .expect("spawn a pool thread");
            ready_rx.recv().expect("a pool thread started");
        }
        pool
    }

    fn work(&self, me: usize) {
        let mut seen = 0;
        loop {
            let order = {
                let mut g = self.order.lock().unwrap();
                while g.0.serial == seen && !g.1 {
                    g = self.start.wait(g).unwrap();
                }
                if g.1 {
                    return;
                }
                g.0
            };
            seen = order.serial;
            if me.is_multiple_of(order.stride) && me / order.stride < order.threads {
                // A panic would leave the count short and `run` waiting: end the process
                // instead, which fails the benchmark.
                if std::panic::catch_unwind(|| (order.job)(order.n)).is_err() {
                    std::process::abort();
                }
                let mut d = self.done.lock().unwrap();
                if d.0 == order.serial {
                    d.1 += 1;
                } else {
                    *d = (order.serial, 1);
                }
                if d.1 == order.threads {
                    self.all_done.notify_one();
                }
            }
        }
    }

    /// Runs `job(n)` on `threads` threads whose indices are `stride` apart (0, stride, 2 *
    /// stride, ...), all at once; returns the time from waking them to the last one's end
    /// (the wake-up of the whole pool included: well under 1% of a 20 ms measurement).
    ///
    /// # Panics
    /// If the pool has fewer than `(threads - 1) * stride + 1` threads, or `threads` or
    /// `stride` is 0.
    pub fn run(&self, threads: usize, stride: usize, job: Job, n: u64) -> Duration {
        assert!(
            threads > 0 && stride > 0 && (threads - 1) * stride < self.size,
            "{threads} threads {stride} apart need more than the pool's {}",
            self.size
        );
        let serial = {
            let mut g = self.order.lock().unwrap();
            g.0 = Order {
                serial: g.0.serial + 1,
                threads,
                stride,
                job,
                n,
            };
            g.0.serial
        };
        let t = Instant::now();
        self.start.notify_all();
        let mut d = self.done.lock().unwrap();
        while !(d.0 == serial && d.1 == threads) {
            d = self.all_done.wait(d).unwrap();
        }
        t.elapsed()
    }

    /// Lets the threads end.
    pub fn stop(&self) {
        self.order.lock().unwrap().1 = true;
        self.start.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    static OPS: AtomicU64 = AtomicU64::new(0);
    static RAN_ON: Mutex<Vec<String>> = Mutex::new(Vec::new());

    fn count(n: u64) {
        OPS.fetch_add(n, Ordering::Relaxed);
        let name = std::thread::current().name().unwrap_or("").to_owned();
        RAN_ON.lock().unwrap().push(name);
    }

    #[test]
    fn a_job_runs_on_exactly_the_threads_asked_for() {
        let pool = Pool::start(6, |_| {});
        pool.run(3, 2, count, 5);
        assert_eq!(OPS.load(Ordering::Relaxed), 15);
        let mut ran = std::mem::take(&mut *RAN_ON.lock().unwrap());
        ran.sort();
        assert_eq!(ran, ["bench-0", "bench-2", "bench-4"]);
        pool.run(2, 1, count, 1);
        assert_eq!(OPS.load(Ordering::Relaxed), 17);
        let mut ran = std::mem::take(&mut *RAN_ON.lock().unwrap());
        ran.sort();
        assert_eq!(ran, ["bench-0", "bench-1"]);
        pool.stop();
    }

    #[test]
    #[should_panic(expected = "need more than the pool's 4")]
    fn more_threads_than_the_pool_has_is_refused() {
        Pool::start(4, |_| {}).run(2, 4, count, 1);
    }
}
