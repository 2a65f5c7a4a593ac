//! [`CodeStack`]: a sampled code stack, which may share its frames with the other stacks of a
//! snapshot.

use super::frames::CodeFrame;
use std::cmp::Ordering;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A code stack, root first, ending at the innermost function.
///
/// Cheap to clone. A stack is either its own list of frames, or indices into a table of frames
/// shared with other stacks: the profiler's CPU store keeps each stack as 4 bytes a frame
/// rather than 40 (an axum service's thousand CPU stacks, 80 frames deep, held 3.5 MB as lists
/// of frames). Both compare, hash and order by their frames, in order, whatever their form.
#[derive(Clone)]
pub struct CodeStack(Form);

#[derive(Clone)]
enum Form {
    Own(Arc<[CodeFrame]>),
    Shared {
        table: Arc<[CodeFrame]>,
        ids: Arc<[u32]>,
    },
}

impl CodeStack {
    /// The stack of the frames at `ids` (root first) in `table`; `None` when an id is past the
    /// table's end.
    pub fn shared(table: Arc<[CodeFrame]>, ids: Arc<[u32]>) -> Option<Self> {
        ids.iter()
            .all(|&i| (i as usize) < table.len())
            .then_some(CodeStack(Form::Shared { table, ids }))
    }

    /// How many frames it has.
    pub fn len(&self) -> usize {
        match &self.0 {
            Form::Own(frames) => frames.len(),
            Form::Shared { ids, .. } => ids.len(),
        }
    }

    /// Whether it has no frame.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The frame at `i` (0 is the root).
    pub fn get(&self, i: usize) -> Option<&CodeFrame> {
        match &self.0 {
            Form::Own(frames) => frames.get(i),
            Form::Shared { table, ids } => ids.get(i).and_then(|&id| table.get(id as usize)),
        }
    }

    /// The outermost frame.
    pub fn first(&self) -> Option<&CodeFrame> {
        self.get(0)
    }

    /// The innermost frame: the function that was running, or that allocated.
    pub fn last(&self) -> Option<&CodeFrame> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    /// The frames, root first.
    pub fn iter(&self) -> Frames<'_> {
        Frames {
            stack: self,
            front: 0,
            back: self.len(),
        }
    }

    /// The frames as a list of their own.
    pub fn to_vec(&self) -> Vec<CodeFrame> {
        self.iter().cloned().collect()
    }

    /// Whether both are the same stack in memory (not only equal).
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        match (&a.0, &b.0) {
            (Form::Own(x), Form::Own(y)) => Arc::ptr_eq(x, y),
            (Form::Shared { table: t, ids: i }, Form::Shared { table: u, ids: j }) => {
                Arc::ptr_eq(t, u) && Arc::ptr_eq(i, j)
            }
            _ => false,
        }
    }
}

impl Default for CodeStack {
    fn default() -> Self {
        CodeStack(Form::Own(Arc::from([])))
    }
}

impl From<Arc<[CodeFrame]>> for CodeStack {
    fn from(frames: Arc<[CodeFrame]>) -> Self {
        CodeStack(Form::Own(frames))
    }
}

impl From<Vec<CodeFrame>> for CodeStack {
    fn from(frames: Vec<CodeFrame>) -> Self {
        CodeStack(Form::Own(frames.into()))
    }
}

impl From<&[CodeFrame]> for CodeStack {
    fn from(frames: &[CodeFrame]) -> Self {
        CodeStack(Form::Own(frames.into()))
    }
}

impl<const N: usize> From<[CodeFrame; N]> for CodeStack {
    fn from(frames: [CodeFrame; N]) -> Self {
        CodeStack(Form::Own(Arc::from(frames)))
    }
}

impl FromIterator<CodeFrame> for CodeStack {
    fn from_iter<I: IntoIterator<Item = CodeFrame>>(frames: I) -> Self {
        CodeStack(Form::Own(frames.into_iter().collect()))
    }
}

impl<'a> IntoIterator for &'a CodeStack {
    type Item = &'a CodeFrame;
    type IntoIter = Frames<'a>;

    fn into_iter(self) -> Frames<'a> {
        self.iter()
    }
}

impl PartialEq for CodeStack {
    fn eq(&self, other: &Self) -> bool {
        Self::ptr_eq(self, other) || (self.len() == other.len() && self.iter().eq(other.iter()))
    }
}

impl Eq for CodeStack {}

impl PartialEq<[CodeFrame]> for CodeStack {
    fn eq(&self, other: &[CodeFrame]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Hash for CodeStack {
    /// As a slice of its frames hashes.
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_usize(self.len());
        for f in self {
            f.hash(state);
        }
    }
}

impl PartialOrd for CodeStack {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for CodeStack {
    /// Frame by frame from the root, as slices order.
    fn cmp(&self, other: &Self) -> Ordering {
        self.iter().cmp(other.iter())
    }
}

impl std::fmt::Debug for CodeStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The frames of a [`CodeStack`], root first.
#[derive(Clone, Debug)]
pub struct Frames<'a> {
    stack: &'a CodeStack,
    front: usize,
    back: usize,
}

impl<'a> Iterator for Frames<'a> {
    type Item = &'a CodeFrame;

    fn next(&mut self) -> Option<&'a CodeFrame> {
        if self.front >= self.back {
            return None;
        }
        self.front += 1;
        self.stack.get(self.front - 1)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back.saturating_sub(self.front);
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Frames<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.front >= self.back {
            return None;
        }
        self.back -= 1;
        self.stack.get(self.back)
    }
}

impl ExactSizeIterator for Frames<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;

    fn hash(x: &impl Hash) -> u64 {
        let mut h = DefaultHasher::new();
        x.hash(&mut h);
        h.finish()
    }

    #[test]
    fn both_forms_are_the_same_stack() {
        let a = CodeFrame::named("a");
        let b = CodeFrame::named("b");
        let c = CodeFrame::named("c");
        let table: Arc<[CodeFrame]> = vec![c.clone(), a.clone(), b.clone()].into();
        let shared = CodeStack::shared(table.clone(), Arc::from([1, 2, 0])).expect("ids in range");
        let own = CodeStack::from(vec![a.clone(), b.clone(), c.clone()]);
        assert_eq!(shared, own);
        assert_eq!(hash(&shared), hash(&own));
        assert_eq!(shared.cmp(&own), Ordering::Equal);
        assert_eq!(shared.len(), 3);
        assert_eq!(shared.first(), Some(&a));
        assert_eq!(shared.last(), Some(&c));
        assert_eq!(
            shared.iter().rev().cloned().collect::<Vec<_>>(),
            vec![c.clone(), b.clone(), a.clone()]
        );
        assert_eq!(shared.to_vec(), own.to_vec());
        assert_eq!(format!("{shared:?}"), format!("{own:?}"));
        // Ordered as the slices of their frames order.
        let shorter = CodeStack::shared(table.clone(), Arc::from([1])).expect("in range");
        assert_eq!(shorter.cmp(&own), [a.clone()][..].cmp(&own.to_vec()[..]));
        assert!(shorter < own);
        // An id past the table's end is refused, not read.
        assert!(CodeStack::shared(table, Arc::from([3])).is_none());
        assert!(CodeStack::default().is_empty());
        assert_eq!(CodeStack::default().last(), None);
    }
}
