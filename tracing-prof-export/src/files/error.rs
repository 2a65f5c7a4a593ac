//! [`FileError`]: what a file export could not do, and to which path.

use std::path::{Path, PathBuf};
use tracing_prof_model::{ModelError, ProfileKind};

/// A file export that failed; says what was being done to which path.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// A flame graph could not be drawn.
    #[error("cannot draw the {kind} flame graph: {source}")]
    Flamegraph {
        /// The profile kind.
        kind: ProfileKind,
        /// Why.
        #[source]
        source: ModelError,
    },
    /// The directory is one that another local user could swap files in: owned by another
    /// user (not root), or writable by others without the sticky bit (a `/tmp/profiles` that
    /// someone else made first).
    #[error("refusing to write profiles into {}: {reason}", path.display())]
    Unsafe {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it, and what to do.
        reason: String,
    },
    /// A file-system operation failed. The message names the directory, not the file (whose
    /// name changes at every export), so one cause reads the same at every interval.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done ("create directory", "write a profile in", ...).
        action: &'static str,
        /// The directory (or, for "create directory", the directory asked for).
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl FileError {
    /// Whether it failed for want of space (a full disk, a quota reached): a condition of the
    /// moment rather than a setting.
    pub fn is_out_of_space(&self) -> bool {
        matches!(self, FileError::Io { source, .. } if matches!(
            source.kind(),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
        ))
    }
}

// `fn main() -> Result<(), Box<dyn Error>>` prints an error it returns with `Debug`: the
// message, not the variant's structure, is what the user must read.
impl std::fmt::Debug for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Maps an I/O error of `action` on `path` to a [`FileError::Io`].
pub(super) fn io_error(
    action: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> FileError {
    let path = path.to_owned();
    move |source| FileError::Io {
        action,
        path,
        source,
    }
}
