//! Folded stacks and flame graph SVGs (via inferno) for any profile kind and sample type.
//!
//! Folded format: one line per span path, `root;child;leaf VALUE`, root first, as
//! `flamegraph.pl` and inferno read it. Names are the pprof function names (`target::name`);
//! a `;` or a line break inside a name becomes `:` or a space, since the format has no escaping.

use crate::ProfileKind;
use std::fmt::Write as _;
use tracing_prof_core::{PathProfile, Profile};

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

fn stack(p: &PathProfile) -> String {
    let names: Vec<String> = p
        .frames
        .iter()
        .map(|f| clean(&f.qualified_name()))
        .collect();
    names.join(";")
}

/// The folded stacks of `sample_type` in the `kind` profile of `profile`, one line per span path
/// with a non-zero value, in the profile's path order.
pub fn folded(
    profile: &Profile,
    kind: ProfileKind,
    sample_type: &str,
) -> Result<String, FlamegraphError> {
    let col = column(kind, sample_type)?;
    let mut out = String::new();
    for p in &profile.paths {
        let v = kind.values(p)[col];
        if v > 0 {
            let _ = writeln!(out, "{} {v}", stack(p));
        }
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
