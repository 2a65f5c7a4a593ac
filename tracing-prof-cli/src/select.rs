//! The sample filters every command shares: `--span`, `--focus`, `--ignore`, `--tag`.

use crate::{CliError, Select};
use regex::Regex;
use tracing_prof_model::{LabelValue, Profile, Sample};

/// Regular expressions from the command line are bounded: a pathological pattern is an error,
/// not a hang or an out-of-memory.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

fn regex(pattern: &str, flag: &str) -> Result<Regex, CliError> {
    regex::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| CliError::Select(format!("{flag} {pattern:?}: {e}")))
}

/// Whether a sample is under the span path `path` (`--span`): each span frame named there by
/// its path name (`run -> app::cmd::set::apply`) or by its span name (`run -> apply`, every
/// callsite of that name).
fn under(sample: &Sample, path: &[&str]) -> bool {
    let frames: Vec<&tracing_prof_model::Frame> = sample.span_frames().collect();
    frames.len() >= path.len()
        && frames.iter().zip(path).all(|(f, want)| {
            f.span_name() == *want || f.function.rsplit("::").next() == Some(*want)
        })
}

fn has_tag(sample: &Sample, key: &str, value: &str) -> bool {
    sample.labels.iter().any(|l| {
        l.key == key
            && match &l.value {
                LabelValue::Str(s) => s == value,
                LabelValue::Num { value: v, .. } => v.to_string() == value,
            }
    })
}

/// The samples of `profile` that `select` keeps.
pub(crate) fn apply(profile: &Profile, select: &Select) -> Result<Profile, CliError> {
    let path: Option<Vec<String>> = select.span.as_ref().map(|s| {
        s.split("->")
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.is_empty())
            .collect()
    });
    let path: Option<Vec<&str>> = path
        .as_ref()
        .map(|p| p.iter().map(String::as_str).collect());
    let focus = select
        .focus
        .as_deref()
        .map(|f| regex(f, "--focus"))
        .transpose()?;
    let ignore = select
        .ignore
        .as_deref()
        .map(|f| regex(f, "--ignore"))
        .transpose()?;
    let tags = select
        .tags
        .iter()
        .map(|t| {
            t.split_once('=')
                .ok_or_else(|| CliError::Select(format!("--tag {t:?}: expected KEY=VALUE")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if path.is_none() && focus.is_none() && ignore.is_none() && tags.is_empty() {
        return Ok(profile.clone());
    }
    let matches = |re: &Regex, s: &Sample| s.stack.iter().any(|f| re.is_match(&f.display_name()));
    Ok(profile.filtered(|s| {
        path.as_ref().is_none_or(|p| under(s, p))
            && focus.as_ref().is_none_or(|re| matches(re, s))
            && ignore.as_ref().is_none_or(|re| !matches(re, s))
            && tags.iter().all(|(k, v)| has_tag(s, k, v))
    }))
}

/// The distinct span paths `--span PATH` matched in `profile`: each sample's span frames as
/// far as `PATH` goes, by their path names (`run -> app::a::apply` and `run -> app::b::apply`
/// for `run -> apply`), in order.
fn matched_paths(profile: &Profile, span: &str) -> Vec<String> {
    let depth = span.split("->").filter(|p| !p.trim().is_empty()).count();
    let mut paths: Vec<String> = profile
        .samples
        .iter()
        .map(|s| {
            let names: Vec<&str> = s.span_frames().take(depth).map(|f| f.span_name()).collect();
            names.join(tracing_prof_model::PATH_SEPARATOR)
        })
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// `" (only ...)"` naming the filters in effect, for headers; where `--span` matched several
/// span paths in `selected` (the samples kept), which ones were summed.
pub(crate) fn describe(select: &Select, selected: &Profile) -> String {
    /// Paths named at most; more are counted.
    const NAMED: usize = 5;
    let mut parts = Vec::new();
    if let Some(s) = &select.span {
        let paths = matched_paths(selected, s);
        if paths.len() > 1 {
            let mut list: Vec<String> =
                paths.iter().take(NAMED).map(|p| format!("`{p}`")).collect();
            if paths.len() > NAMED {
                list.push(format!("{} more", paths.len() - NAMED));
            }
            parts.push(format!(
                "under {s}: {} span paths summed, {}",
                paths.len(),
                list.join(", ")
            ));
        } else {
            parts.push(format!("under {s}"));
        }
    }
    if let Some(f) = &select.focus {
        parts.push(format!("with a frame matching {f:?}"));
    }
    if let Some(i) = &select.ignore {
        parts.push(format!("without a frame matching {i:?}"));
    }
    for t in &select.tags {
        parts.push(format!("tagged {t}"));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" (samples {})", parts.join(", "))
    }
}
