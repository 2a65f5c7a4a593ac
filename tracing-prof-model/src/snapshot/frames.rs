//! The frames of a snapshot's stacks: a span callsite in a span path ([`SpanFrame`]), a
//! function of the code ([`CodeFrame`]), the synthetic frames, and how a path is written.

use std::sync::Arc;

/// Frame name of work done while no span was entered.
pub const NO_SPAN_FRAME: &str = "(no span)";
/// Frame name of the profiler's own allocations.
pub const PROFILER_FRAME: &str = "(tracing-prof)";
/// Frame name standing for span paths beyond the cap.
pub const OVERFLOW_FRAME: &str = "(other span paths)";
/// Code frame of samples whose stack found no room in a stack table.
pub const TABLE_FULL_FRAME: &str = "(stack table full)";
/// Code frame of CPU samples whose stack could not be walked at all: the sampler found no
/// return address (code without unwind information it could use, or a corrupt frame).
pub const NOTHING_UNWOUND_FRAME: &str = "(no code stack: nothing unwound)";
/// Code frame of CPU samples each of whose frames was trimmed as outside the span: taken in
/// `tracing`'s own entry into the span, which the span frames already stand for.
pub const ALL_TRIMMED_FRAME: &str = "(span entry: every code frame trimmed)";

/// One span callsite in a span path.
///
/// Two frames are equal when they stand for the same callsite with the same field values:
/// [`SpanFrame::path_name`] is how the callsite is shown, not what it is.
#[derive(Clone, Debug)]
pub struct SpanFrame {
    /// The span's target, usually its module path; empty for synthetic frames.
    pub target: Arc<str>,
    /// The span's name.
    pub name: Arc<str>,
    /// The name this callsite goes by in span paths (`request -> render`): its
    /// [`name`](Self::name), or, where another callsite of the program has the same name,
    /// `target::name` (with ` (file:line)` where the target is the same too). The profiler
    /// sets it; [`SpanFrame::new`] makes it the name.
    pub path_name: Arc<str>,
    /// Source file of the callsite, when known.
    pub file: Option<Arc<str>>,
    /// Source line of the callsite, when known.
    pub line: Option<u32>,
    /// The values of the span's fields chosen as labels (`route` = `/users`), in the order
    /// they were configured; empty unless labels were asked for. Spans of one callsite with
    /// different values are different paths, shown as one frame with different labels.
    pub fields: Vec<(Arc<str>, Arc<str>)>,
}

impl SpanFrame {
    /// The fields that say which callsite and values this is (all but the path name).
    #[allow(
        clippy::type_complexity,
        reason = "a tuple of the fields, for comparisons"
    )]
    fn identity(
        &self,
    ) -> (
        &str,
        &str,
        Option<&str>,
        Option<u32>,
        &[(Arc<str>, Arc<str>)],
    ) {
        (
            &self.target,
            &self.name,
            self.file.as_deref(),
            self.line,
            &self.fields,
        )
    }
}

compared_by_identity!(SpanFrame);

impl SpanFrame {
    /// The frame of a callsite, with no field labels, going by its name in span paths.
    pub fn new(target: &str, name: &str, file: Option<&str>, line: Option<u32>) -> Self {
        let name: Arc<str> = Arc::from(name);
        SpanFrame {
            target: Arc::from(target),
            path_name: name.clone(),
            name,
            file: file.map(Arc::from),
            line,
            fields: Vec::new(),
        }
    }

    /// A frame that stands for no callsite, such as [`NO_SPAN_FRAME`].
    pub fn synthetic(name: &str) -> Self {
        SpanFrame::new("", name, None, None)
    }

    /// Whether this frame stands for no callsite.
    pub fn is_synthetic(&self) -> bool {
        self.target.is_empty() && self.file.is_none()
    }

    /// `target::name`, or just `name` for synthetic frames.
    pub fn qualified_name(&self) -> String {
        if self.target.is_empty() {
            self.name.to_string()
        } else {
            format!("{}::{}", self.target, self.name)
        }
    }
}

/// One function in a code stack.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CodeFrame {
    /// The demangled function name without its hash, in full (generic arguments included):
    /// `my_app::handler::parse`, `<alloc::vec::Vec<T,A> as core::clone::Clone>::clone`.
    /// Viewers show [`CodeFrame::short_name`].
    pub function: Arc<str>,
    /// Source file, when the binary has line tables.
    pub file: Option<Arc<str>>,
    /// Source line, when the binary has line tables.
    pub line: Option<u32>,
}

impl CodeFrame {
    /// A frame with a name only.
    pub fn named(function: &str) -> Self {
        CodeFrame {
            function: Arc::from(function),
            file: None,
            line: None,
        }
    }

    /// The function's short name ([`short_function_name`](crate::short_function_name)): what
    /// pprof files and tables show.
    pub fn short_name(&self) -> std::borrow::Cow<'_, str> {
        crate::names::short_function_name(&self.function)
    }

    /// `function (file:line)` with the short name and the file shortened to its last two
    /// components, or just the short name when the location is unknown.
    pub fn location(&self) -> String {
        let function = self.short_name();
        match (&self.file, self.line) {
            (Some(file), Some(line)) => {
                let short: Vec<&str> = file.rsplit('/').take(2).collect();
                let short = if short.len() == 2 {
                    format!("{}/{}", short[1], short[0])
                } else {
                    short[0].to_owned()
                };
                format!("{function} ({short}:{line})")
            }
            _ => function.into_owned(),
        }
    }
}

/// The path names of `frames` (see [`SpanFrame::path_name`]), root first, joined by ` -> `.
pub fn display_path(frames: &[SpanFrame]) -> String {
    // One allocation: a profile makes one of these per sampled stack.
    let len = frames.iter().map(|f| f.path_name.len()).sum::<usize>()
        + PATH_SEPARATOR.len() * frames.len().saturating_sub(1);
    let mut out = String::with_capacity(len);
    for (i, f) in frames.iter().enumerate() {
        if i > 0 {
            out.push_str(PATH_SEPARATOR);
        }
        out.push_str(&f.path_name);
    }
    out
}

/// The label values of `frames`' spans in braces after a space (` {route=/users}`); empty
/// when they have none.
pub(crate) fn fields_of(frames: &[SpanFrame]) -> String {
    let f: Vec<String> = frames
        .iter()
        .flat_map(|f| f.fields.iter().map(|(k, v)| format!("{k}={v}")))
        .collect();
    if f.is_empty() {
        String::new()
    } else {
        format!(" {{{}}}", f.join(", "))
    }
}

/// What joins the span names of a path: `request -> render`.
pub const PATH_SEPARATOR: &str = " -> ";

/// Whether each frame is named `names[i]`, by its name or its path name.
pub(super) fn names_are(frames: &[SpanFrame], names: &[&str]) -> bool {
    frames.len() == names.len()
        && frames
            .iter()
            .zip(names)
            .all(|(f, n)| &*f.name == *n || &*f.path_name == *n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{PathKind, SuspectedLeak};

    /// Paths of one callsite chain that differ by their label values read apart in a
    /// suspected leak's labeled path, as in every listing that shows them.
    #[test]
    fn a_leaks_path_shows_its_label_values() {
        let frames = |route: Option<&str>| {
            let mut store = SpanFrame::new("svc", "session_store", None, None);
            if let Some(r) = route {
                store.fields = vec![(Arc::from("route"), Arc::from(r))];
            }
            vec![SpanFrame::new("svc", "request", None, None), store]
        };
        let leak = |route| SuspectedLeak::new(PathKind::Span, frames(route), Vec::new(), 1, 1, 3);
        let labeled = leak(Some("/users"));
        assert_eq!(
            labeled.labeled_path(),
            "request -> session_store {route=/users}"
        );
        // `path` names the path as the `span_path` label does.
        assert_eq!(labeled.path, "request -> session_store");
        assert_eq!(leak(None).labeled_path(), "request -> session_store");
    }
}
