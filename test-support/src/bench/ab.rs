//! A/B timing for `cargo bench` on a noisy shared machine.
//!
//! Each round measures every variant once, back to back, in an order that rotates every round,
//! each measurement lasting about `TARGET`. Reported: the median time per operation of each
//! variant and, for each variant against the first (the baseline), the median and the
//! interquartile range of the per-round ratios. Ratios taken within a round share the machine's
//! state of that moment, which is what makes them stable when absolute times drift.

use std::time::{Duration, Instant};

const TARGET: Duration = Duration::from_millis(20);

/// One variant: a name and a closure running `n` operations.
pub struct Variant<'a> {
    /// Its name in the table.
    pub name: &'a str,
    /// Runs `n` operations.
    pub run: Box<dyn FnMut(u64) + 'a>,
}

impl std::fmt::Debug for Variant<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Variant")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A variant named `name` that runs `run(n)`.
pub fn variant<'a>(name: &'a str, run: impl FnMut(u64) + 'a) -> Variant<'a> {
    Variant {
        name,
        run: Box::new(run),
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn quartiles(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 4], v[v.len() * 3 / 4])
}

/// Runs `rounds` alternating rounds and prints a markdown table; returns the median ns/op.
pub fn compare(title: &str, rounds: usize, mut variants: Vec<Variant<'_>>) -> Vec<f64> {
    // Calibrate: operations per measurement so that the baseline takes about TARGET.
    let mut n = 1u64;
    loop {
        let t = Instant::now();
        (variants[0].run)(n);
        if t.elapsed() >= TARGET / 4 || n >= 1 << 30 {
            let per = t.elapsed().as_secs_f64() / n as f64;
            n = ((TARGET.as_secs_f64() / per.max(1e-12)) as u64).max(1);
            break;
        }
        n *= 2;
    }
    for v in &mut variants {
        (v.run)(n / 4 + 1); // warm-up
    }
    let k = variants.len();
    let mut ns = vec![Vec::with_capacity(rounds); k];
    for round in 0..rounds {
        for j in 0..k {
            let i = (round + j) % k;
            let t = Instant::now();
            (variants[i].run)(n);
            ns[i].push(t.elapsed().as_nanos() as f64 / n as f64);
        }
    }
    println!("\n### {title}\n");
    println!("{rounds} alternating rounds of {n} operations per variant.\n");
    println!(
        "| variant | median ns/op | ratio to {} (median) | ratio IQR |",
        variants[0].name
    );
    println!("|---|---:|---:|---:|");
    let medians: Vec<f64> = ns.iter().map(|v| median(&mut v.clone())).collect();
    for i in 0..k {
        let mut ratios: Vec<f64> = ns[i].iter().zip(&ns[0]).map(|(b, a)| b / a).collect();
        let (q1, q3) = quartiles(&mut ratios);
        println!(
            "| {} | {:.2} | {:.3} | {:.3}..{:.3} |",
            variants[i].name,
            medians[i],
            median(&mut ratios),
            q1,
            q3
        );
    }
    medians
}

/// Whether `cargo bench -- NAME` asked for this benchmark (no filter: all).
pub fn wanted(name: &str) -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
}
