//! A child of `fork` has only the forking thread: after `after_fork_in_child`, only its record
//! is claimed, with the child's own thread id, and a thread the child starts takes one of the
//! records the parent's other threads left (it runs, and gets its own id).

use std::sync::{Arc, Barrier};

fn owned() -> Vec<usize> {
    let mut v = Vec::new();
    tracing_prof_thread::for_each(|r| v.push(r as *const _ as usize));
    v
}

fn gettid() -> u64 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

/// What the child checks; its exit status (0: all held).
fn child(parent_tid: u64, parents: &[usize]) -> i32 {
    tracing_prof_thread::after_fork_in_child();
    let me = tracing_prof_thread::current().expect("the forking thread keeps its record");
    if me.tid() == parent_tid || me.tid() != gettid() {
        return 2;
    }
    let left = owned();
    if left != [me as *const _ as usize] {
        return 3;
    }
    // Idempotent: the profiler's handlers may both call it.
    tracing_prof_thread::after_fork_in_child();
    if owned() != left {
        return 4;
    }
    // A new thread takes one of the records the parent's threads left.
    let t = std::thread::spawn(|| {
        tracing_prof_thread::current().map(|r| (r as *const _ as usize, r.tid()))
    });
    match t.join() {
        Ok(Some((r, tid))) if tid != 0 && tid != me.tid() && parents.contains(&r) => {}
        _ => return 5,
    }
    0
}

#[test]
fn a_child_of_fork_keeps_only_its_own_record() {
    let main = tracing_prof_thread::current().unwrap();
    let hold = Arc::new(Barrier::new(4));
    let release = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let (hold, release) = (Arc::clone(&hold), Arc::clone(&release));
            std::thread::spawn(move || {
                tracing_prof_thread::current().unwrap().set_listed(true);
                hold.wait();
                release.wait();
            })
        })
        .collect();
    hold.wait();
    assert!(owned().len() >= 4, "{:?}", owned());
    let parent_tid = main.tid();
    let parents: Vec<usize> = owned()
        .into_iter()
        .filter(|&r| r != main as *const _ as usize)
        .collect();
    // SAFETY: the child only makes system calls, reads and stores atomics, starts and joins a
    // thread, and leaves with `_exit`.
    let status =
        unsafe { tracing_prof_test_support::fork_and_wait(|| child(parent_tid, &parents)) };
    release.wait();
    for t in threads {
        t.join().unwrap();
    }
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the child's check that failed"
    );
    // The parent's own records are untouched.
    assert_eq!(main.tid(), gettid());
}
