//! Folded stacks and flame graph SVGs (drawn by inferno) of any profile and sample type.
//!
//! Folded format: one line per stack, `root;child;leaf VALUE`, root first, as `flamegraph.pl`
//! and inferno read it; a differential file has two value columns (before, after). Names are
//! the names pprof shows (span frames carry `[span]`); a `;` or a line break inside a name
//! becomes `:` or a space, since the format has no escaping.

use crate::profile::{Profile, Sample};
use crate::{ModelError, units};
use std::collections::HashMap;
use std::fmt::Write as _;

fn clean(name: &str) -> String {
    name.replace(';', ":").replace(['\n', '\r'], " ")
}

fn key(sample: &Sample) -> String {
    let names: Vec<String> = sample
        .stack
        .iter()
        .map(|f| clean(&f.display_name()))
        .collect();
    if names.is_empty() {
        "(no stack)".to_owned()
    } else {
        names.join(";")
    }
}

/// Per distinct stack, in order of first appearance, the sum of value `index`.
fn sums(profile: &Profile, index: usize) -> (Vec<String>, HashMap<String, i64>) {
    let mut order = Vec::new();
    let mut sums: HashMap<String, i64> = HashMap::new();
    for s in &profile.samples {
        let v = s.values.get(index).copied().unwrap_or(0);
        let k = key(s);
        let sum = sums.entry(k.clone()).or_insert_with(|| {
            order.push(k);
            0
        });
        *sum = sum.saturating_add(v);
    }
    (order, sums)
}

impl Profile {
    /// The folded stacks of sample type `sample_type` (default: the profile's default), one
    /// line per stack with a positive value, in the order of the samples.
    pub fn folded(&self, sample_type: Option<&str>) -> Result<String, ModelError> {
        let index = self.sample_type_named(sample_type)?;
        let (order, sums) = sums(self, index);
        let mut out = String::new();
        for k in order {
            let v = sums[&k];
            if v > 0 {
                let _ = writeln!(out, "{k} {v}");
            }
        }
        Ok(out)
    }

    /// A differential folded file from `base` to `self`: `stack BEFORE AFTER` per stack that
    /// has a value in either, as inferno's differential flame graphs read it.
    pub fn folded_diff(
        &self,
        base: &Profile,
        sample_type: Option<&str>,
    ) -> Result<String, ModelError> {
        let index = self.sample_type_named(sample_type)?;
        let name = &self.sample_types[index].name;
        let base_index = base.sample_type_index(name).ok_or_else(|| {
            ModelError::Incompatible(format!("the base profile has no sample type {name}"))
        })?;
        let (order_new, new) = sums(self, index);
        let (order_old, old) = sums(base, base_index);
        let mut out = String::new();
        let mut seen = std::collections::HashSet::new();
        for k in order_old.iter().chain(&order_new) {
            if !seen.insert(k) {
                continue;
            }
            let (a, b) = (
                old.get(k).copied().unwrap_or(0).max(0),
                new.get(k).copied().unwrap_or(0).max(0),
            );
            if a > 0 || b > 0 {
                let _ = writeln!(out, "{k} {a} {b}");
            }
        }
        Ok(out)
    }

    /// A flame graph SVG of `sample_type` (default: the profile's default), titled `title` and
    /// with the sample type's unit in its tooltips.
    pub fn flamegraph_svg(
        &self,
        sample_type: Option<&str>,
        title: &str,
    ) -> Result<Vec<u8>, ModelError> {
        let index = self.sample_type_named(sample_type)?;
        let lines = self.folded(Some(&self.sample_types[index].name))?;
        self.draw(index, title, &lines)
    }

    /// A differential flame graph from `base` to `self`: widths are `self`'s values, red what
    /// grew, blue what shrank (inferno's differential mode).
    pub fn flamegraph_diff_svg(
        &self,
        base: &Profile,
        sample_type: Option<&str>,
        title: &str,
    ) -> Result<Vec<u8>, ModelError> {
        let index = self.sample_type_named(sample_type)?;
        let lines = self.folded_diff(base, Some(&self.sample_types[index].name))?;
        self.draw(index, title, &lines)
    }

    fn draw(&self, index: usize, title: &str, lines: &str) -> Result<Vec<u8>, ModelError> {
        let ty = &self.sample_types[index];
        if lines.is_empty() {
            return Err(ModelError::Empty(ty.name.clone()));
        }
        let total = self.total(index);
        let mut options = inferno::flamegraph::Options::default();
        options.title = title.to_owned();
        options.subtitle = Some(format!(
            "{}: {} in all",
            ty.name,
            units::format_value(total, &ty.unit)
        ));
        options.count_name = ty.unit.clone();
        options.name_type = "Frame:".to_owned();
        options.deterministic = true;
        // Roots at the top, as pprof's web UI draws them: the span frames come first on
        // screen, however deep the code under them (a runtime's idle stacks are 60 frames
        // deep, and at the bottom they pushed the span frames out of the first screen).
        options.direction = inferno::flamegraph::Direction::Inverted;
        let mut svg = Vec::with_capacity(16 * 1024);
        inferno::flamegraph::from_lines(&mut options, lines.lines(), &mut svg)
            .map_err(|e| ModelError::Flamegraph(e.to_string()))?;
        Ok(svg)
    }
}
