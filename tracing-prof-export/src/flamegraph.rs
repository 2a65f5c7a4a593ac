//! Folded stacks and flame graph SVGs (via inferno) for any profile kind and sample type.
//!
//! Folded format: one line per stack, `root;child;leaf VALUE`, root first, as `flamegraph.pl`
//! and inferno read it. The stacks are those of the kind's pprof samples (span paths; for the
//! sampled kinds, span frames and then code frames), so a flame graph shows what `go tool pprof`
//! shows. Names are the pprof function names; a `;` or a line break inside a name becomes `:` or
//! a space, since the format has no escaping.

use crate::ProfileKind;
use std::collections::HashMap;
use std::fmt::Write as _;
use tracing_prof_core::Profile;

/// Why a flame graph could not be drawn.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlamegraphError {
    /// The kind has no such sample type.
    #[error("the {kind} profile has no sample type {sample_type:?} (it has: {known})")]
    UnknownSampleType {
        /// The profile kind.
        kind: &'static str,
        /// What was asked for.
        sample_type: String,
        /// What exists.
        known: String,
    },
    /// Every path has 0 for this sample type: there is nothing to draw.
    #[error("nothing to draw: every span path has 0 {sample_type} in this {kind} profile")]
    Empty {
        /// The profile kind.
        kind: &'static str,
        /// The sample type.
        sample_type: String,
    },
    /// inferno refused the input.
    #[error("inferno could not draw the flame graph: {0}")]
    Inferno(String),
}

fn column(kind: ProfileKind, sample_type: &str) -> Result<usize, FlamegraphError> {
    kind.sample_types()
        .iter()
        .position(|(t, _)| *t == sample_type)
        .ok_or_else(|| FlamegraphError::UnknownSampleType {
            kind: kind.name(),
            sample_type: sample_type.to_owned(),
            known: kind
                .sample_types()
                .iter()
                .map(|(t, _)| *t)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

fn clean(name: &str) -> String {
    name.replace(';', ":").replace(['\n', '\r'], " ")
}

/// The folded stacks of `sample_type` in the `kind` profile of `profile`, one line per stack with
/// a non-zero value (samples with the same stack summed), in the order of the pprof samples.
pub fn folded(
    profile: &Profile,
    kind: ProfileKind,
    sample_type: &str,
) -> Result<String, FlamegraphError> {
    let col = column(kind, sample_type)?;
    let p = crate::pprof::to_proto(profile, kind);
    let location: HashMap<u64, String> = crate::pprof::location_names(&p)
        .into_iter()
        .map(|(id, name)| (id, clean(name)))
        .collect();
    let mut order: Vec<String> = Vec::new();
    let mut sums: HashMap<String, i64> = HashMap::new();
    for sample in &p.sample {
        let v = sample.value.get(col).copied().unwrap_or(0);
        if v <= 0 {
            continue;
        }
        let names: Vec<&str> = sample
            .location_id
            .iter()
            .rev()
            .map(|id| location.get(id).map_or("?", String::as_str))
            .collect();
        let key = names.join(";");
        let sum = sums.entry(key.clone()).or_insert_with(|| {
            order.push(key);
            0
        });
        *sum += v;
    }
    let mut out = String::new();
    for key in order {
        let _ = writeln!(out, "{key} {}", sums[&key]);
    }
    Ok(out)
}

/// A flame graph SVG of `sample_type` in the `kind` profile of `profile`.
pub fn flamegraph_svg(
    profile: &Profile,
    kind: ProfileKind,
    sample_type: &str,
) -> Result<Vec<u8>, FlamegraphError> {
    let lines = folded(profile, kind, sample_type)?;
    if lines.is_empty() {
        return Err(FlamegraphError::Empty {
            kind: kind.name(),
            sample_type: sample_type.to_owned(),
        });
    }
    let unit = kind.sample_types()[column(kind, sample_type)?].1;
    let mut options = inferno::flamegraph::Options::default();
    options.title = format!(
        "tracing-prof {} profile: {sample_type}{}",
        kind.name(),
        if profile.window {
            format!(" (last {:.1} s)", profile.duration.as_secs_f64())
        } else {
            String::new()
        }
    );
    options.count_name = unit.to_owned();
    options.deterministic = true;
    let mut svg = Vec::with_capacity(16 * 1024);
    inferno::flamegraph::from_lines(&mut options, lines.lines(), &mut svg)
        .map_err(|e| FlamegraphError::Inferno(e.to_string()))?;
    Ok(svg)
}
