//! Where a kind's samples go: [`Samples`], borrowed from the snapshot as they are made.
//!
//! The builders of [`Snapshot::profile`](crate::Snapshot::profile) hand each sample over as
//! slices of the snapshot's own frames and labels that borrow its strings; a [`Profile`] makes
//! them owned, the streaming pprof encoder ([`Snapshot::encode`](crate::Snapshot::encode))
//! writes them out at once and keeps nothing of a sample but the ids of frames it had not met.

use super::{code_frame, span_frame};
use crate::profile::{Frame, FrameKind, Label, Profile, Sample};
use crate::snapshot::{CodeStack, SpanFrame};

/// A sample's stack, root first.
#[derive(Clone, Copy)]
pub(crate) enum Stack<'a> {
    /// A span path and the code stack sampled under it (none for a span path alone).
    Path(&'a [SpanFrame], Option<&'a CodeStack>),
    /// A thread, by the name its one frame shows.
    Thread(&'a str),
}

impl Stack<'_> {
    /// The frames, root first, as a [`Profile`] has them.
    pub(crate) fn frames(self) -> Vec<Frame> {
        match self {
            Stack::Path(spans, code) => spans
                .iter()
                .map(span_frame)
                .chain(code.into_iter().flatten().map(code_frame))
                .collect(),
            Stack::Thread(name) => vec![Frame::new(FrameKind::Thread, name, None, None)],
        }
    }
}

/// A label that borrows its key and value.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LabelRef<'a> {
    /// `key=value`.
    Str(&'a str, &'a str),
    /// `key=value` in `unit`.
    Num(&'a str, i64, Option<&'a str>),
}

impl LabelRef<'_> {
    /// As a [`Profile`] has it.
    pub(crate) fn owned(self) -> Label {
        match self {
            LabelRef::Str(k, v) => Label::str(k, v),
            LabelRef::Num(k, v, unit) => Label::num(k, v, unit),
        }
    }
}

/// Takes a kind's samples one by one.
pub(crate) trait Samples {
    /// One sample: its stack, one value per sample type, its labels.
    fn push(&mut self, stack: Stack<'_>, values: &[i64], labels: &[LabelRef<'_>]);
}

impl Samples for Profile {
    fn push(&mut self, stack: Stack<'_>, values: &[i64], labels: &[LabelRef<'_>]) {
        self.samples.push(Sample {
            stack: stack.frames(),
            values: values.to_vec(),
            labels: labels.iter().map(|l| l.owned()).collect(),
        });
    }
}
