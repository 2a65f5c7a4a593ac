//! A single-producer, single-consumer ring of 64-bit words: the signal handler of one thread
//! writes sample records, the reader drains them.
//!
//! The producer is the thread's SIGPROF handler (a signal is blocked while its own handler
//! runs, so there is one writer at a time); the consumer is whoever holds the drain lock.
//! Words are atomics with relaxed order; `head` (written by the producer) and `tail` (written
//! by the consumer) carry release and acquire order, so the words of a record are visible
//! before the head that publishes it. No `unsafe`, no allocation, no lock, no syscall.
//!
//! A record is a header word followed by `len` words. Records never wrap around the end of the
//! buffer: when one does not fit before the end, a [`WRAP`] word (or nothing, when the end is
//! reached exactly) sends the reader back to the start.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Words in a ring: 16 KiB, room for about 60 records of 30 frames.
pub(crate) const WORDS: usize = 2048;

/// A header word that says "the next record starts at the beginning of the buffer".
const WRAP: u64 = u64::MAX;

pub(crate) struct Ring {
    /// Words ever written (the producer's position, not wrapped).
    head: AtomicUsize,
    /// Words ever read (the consumer's position, not wrapped).
    tail: AtomicUsize,
    words: [AtomicU64; WORDS],
}

impl Ring {
    /// An empty ring (all zeroes: a `Ring` can also come from zeroed memory).
    #[cfg(test)]
    pub(crate) fn new() -> Box<Ring> {
        Box::new(Ring {
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            words: [const { AtomicU64::new(0) }; WORDS],
        })
    }

    /// Appends a record: `header` (never [`WRAP`]), then `prefix` and `body` as one body.
    /// Returns false, writing nothing, when the ring has no room for it. Producer only.
    pub(crate) fn push(&self, header: u64, prefix: &[u64], body: &[u64]) -> bool {
        debug_assert!(header != WRAP);
        let need = 1 + prefix.len() + body.len();
        if need > WORDS / 2 {
            return false;
        }
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Acquire);
        let at = head % WORDS;
        // Words skipped at the end of the buffer when the record does not fit before it.
        let skip = if at + need > WORDS { WORDS - at } else { 0 };
        if head - tail + skip + need > WORDS {
            return false;
        }
        if skip > 0 {
            self.words[at].store(WRAP, Ordering::Relaxed);
        }
        let start = (head + skip) % WORDS;
        self.words[start].store(header, Ordering::Relaxed);
        let words = prefix.iter().chain(body);
        for (slot, &w) in self.words[start + 1..start + need].iter().zip(words) {
            slot.store(w, Ordering::Relaxed);
        }
        self.head.store(head + skip + need, Ordering::Release);
        true
    }

    /// Reads every record published so far, oldest first: `f(header, body)`, where `len(header)`
    /// gives the body's length. Consumer only (the caller serializes consumers).
    pub(crate) fn drain(&self, len: impl Fn(u64) -> usize, mut f: impl FnMut(u64, &[u64])) {
        let head = self.head.load(Ordering::Acquire);
        let mut tail = self.tail.load(Ordering::Relaxed);
        let mut body = [0u64; WORDS / 2];
        while tail < head {
            let at = tail % WORDS;
            let header = self.words[at].load(Ordering::Relaxed);
            if header == WRAP {
                tail += WORDS - at;
                continue;
            }
            let n = len(header).min(WORDS / 2 - 1);
            if at + 1 + n > WORDS || tail + 1 + n > head {
                // Cannot happen for records written by `push`; never read out of bounds.
                tail = head;
                break;
            }
            for (b, w) in body.iter_mut().zip(&self.words[at + 1..at + 1 + n]) {
                *b = w.load(Ordering::Relaxed);
            }
            f(header, &body[..n]);
            tail += 1 + n;
        }
        self.tail.store(tail, Ordering::Release);
    }

    /// Whether every published record has been read.
    pub(crate) fn is_empty(&self) -> bool {
        self.tail.load(Ordering::Acquire) >= self.head.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_in_order_across_wraps() {
        let ring = Ring::new();
        let mut next = 0u64;
        let mut expect = 0u64;
        for round in 0..200 {
            // Push records of varying length until full, then drain.
            loop {
                let len = (next % 37) as usize + 1;
                let body: Vec<u64> = (0..len as u64).map(|i| next * 1000 + i).collect();
                let (prefix, rest) = body.split_at(len / 3);
                if !ring.push(next << 8 | len as u64, prefix, rest) {
                    break;
                }
                next += 1;
            }
            ring.drain(
                |h| (h & 0xff) as usize,
                |h, body| {
                    assert_eq!(h >> 8, expect, "round {round}");
                    let len = (h & 0xff) as usize;
                    assert_eq!(body.len(), len);
                    assert!(
                        body.iter()
                            .enumerate()
                            .all(|(i, &w)| w == expect * 1000 + i as u64)
                    );
                    expect += 1;
                },
            );
            assert!(ring.is_empty());
        }
        assert_eq!(expect, next);
        assert!(next > 200 * 50, "{next} records");
    }

    #[test]
    fn a_full_ring_refuses_and_keeps_what_it_has() {
        let ring = Ring::new();
        let body = [7u64; 100];
        let mut n = 0;
        while ring.push(1, &[], &body) {
            n += 1;
        }
        assert_eq!(n, WORDS / 101);
        let mut seen = 0;
        ring.drain(
            |_| 100,
            |_, b| {
                assert_eq!(b, &body[..]);
                seen += 1;
            },
        );
        assert_eq!(seen, n);
        assert!(
            !ring.push(1, &[0u64; 2], &[0u64; WORDS / 2 - 2]),
            "a record may take at most half the ring"
        );
    }
}
