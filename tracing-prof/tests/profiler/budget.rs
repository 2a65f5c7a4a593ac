//! Allocation budgets in tests: within budget the value comes back; over budget the report names
//! the span paths that allocated, with exact numbers; parallel budgets do not see each other.

use tracing_prof::core::{BudgetError, BudgetReport};
use tracing_prof::{Budget, ProfileLayer};
use tracing_subscriber::prelude::*;

/// 8 allocations of 1000 bytes in a `parse` span, 2 of 500 outside it; keeps nothing.
fn work() -> usize {
    let parsed = tracing::info_span!("parse").in_scope(|| {
        (0..8)
            .map(|i| std::hint::black_box(vec![i as u8; 1000]).len())
            .sum::<usize>()
    });
    let rest = (0..2)
        .map(|_| std::hint::black_box(vec![0u8; 500]).len())
        .sum::<usize>();
    parsed + rest
}

fn report(e: BudgetError) -> BudgetReport {
    match e {
        BudgetError::Exceeded(r) => r,
        other => panic!("expected an exceeded budget, got {other}"),
    }
}

#[test]
fn budgets_pass_fail_and_explain() {
    if crate::isolated(module_path!(), "budgets_pass_fail_and_explain") {
        return;
    }
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(ProfileLayer::new()),
    )
    .unwrap();
    // Warm-up: the registry's one-time allocations for spans on this thread.
    let _ = Budget::new().check(work);

    assert_eq!(
        Budget::new()
            .max_allocations(10)
            .max_bytes(9000)
            .check(work)
            .unwrap(),
        9000
    );

    let r = report(Budget::new().max_bytes(4096).check(work).unwrap_err());
    assert_eq!((r.allocations, r.bytes), (10, 9000));
    assert_eq!(
        r.by_path,
        [
            ("budget -> parse".to_owned(), 8, 8000),
            ("budget".to_owned(), 2, 1000)
        ]
    );
    let text = r.to_string();
    assert!(
        text.contains("10 allocations (budget: no limit), 9000 bytes (budget: 4096)"),
        "{text}"
    );
    // The top allocation sites, by code location.
    let sites: Vec<(u64, u64)> = r.sites.iter().map(|s| (s.allocations, s.bytes)).collect();
    assert_eq!(sites, [(8, 8000), (2, 1000)], "{text}");
    assert!(
        r.sites[0].location.contains("tests/profiler/budget.rs:12"),
        "{text}"
    );
    assert!(
        r.sites[1].location.contains("tests/profiler/budget.rs:16"),
        "{text}"
    );
    assert!(text.contains("top allocation sites"), "{text}");
    assert!(
        text.contains("8000 bytes in      8 allocations  budget -> parse"),
        "{text}"
    );

    let r = report(Budget::new().max_allocations(9).check(work).unwrap_err());
    assert_eq!(r.allocations, 10);

    let panic =
        std::panic::catch_unwind(|| Budget::new().max_allocations(1).assert(work)).unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(
        message.contains("allocation budget exceeded") && message.contains("budget -> parse"),
        "{message}"
    );

    // Two threads measuring at once each see exactly their own allocations.
    let handles: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(|| {
                let _ = Budget::new().check(work); // this thread's warm-up
                (0..50)
                    .map(|_| Budget::new().measure(work).unwrap().1)
                    .all(|r| (r.allocations, r.bytes) == (10, 9000))
            })
        })
        .collect();
    for h in handles {
        assert!(
            h.join().unwrap(),
            "a budget saw another thread's allocations"
        );
    }
}

#[test]
fn without_a_profile_layer_the_error_says_so() {
    if crate::isolated(module_path!(), "without_a_profile_layer_the_error_says_so") {
        return;
    }
    let none = tracing::Dispatch::none();
    tracing::dispatcher::with_default(&none, || {
        let e = Budget::new().max_bytes(1).check(work).unwrap_err();
        assert_eq!(e, BudgetError::NoProfiler);
        assert!(e.to_string().contains("ProfileLayer"));
    });
}
