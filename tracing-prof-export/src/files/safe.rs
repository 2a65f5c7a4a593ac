//! Writing into a directory other users may share: temporary files with `O_CREAT | O_EXCL`
//! and unpredictable names (the `tempfile` crate), renamed into place, so that no link planted
//! in the directory is ever followed; and the refusal of a directory someone else controls.

use super::{FileError, io_error};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Temporary files are `{TMP_PREFIX}{random}{TMP_SUFFIX}`, made with `O_CREAT | O_EXCL` (the
/// `tempfile` crate): a name nobody can guess ahead, never a file or link already there.
pub(super) const TMP_PREFIX: &str = ".tracing-prof.";
pub(super) const TMP_SUFFIX: &str = ".tmp";

/// How our temporary files are made: a random name between [`TMP_PREFIX`] and [`TMP_SUFFIX`],
/// created with `O_CREAT | O_EXCL` and the mode of a plain create (`0666` less the umask;
/// `tempfile`'s own default, `0600`, would keep a sidecar that ships profiles from reading
/// them).
pub(super) fn tmp_builder() -> tempfile::Builder<'static, 'static> {
    let mut b = tempfile::Builder::new();
    b.prefix(TMP_PREFIX)
        .suffix(TMP_SUFFIX)
        .permissions(fs::Permissions::from_mode(0o666));
    b
}

/// A new temporary file in `dir`.
pub(super) fn tmp_file(dir: &Path) -> Result<tempfile::NamedTempFile, FileError> {
    tmp_builder()
        .tempfile_in(dir)
        .map_err(|e| io_error("create a file in", dir)(os_error(e)))
}

/// The OS error without the random path `tempfile` appends (`... at path "..."`), which would
/// make one cause read differently at every export (the profiler says each distinct message).
pub(super) fn os_error(e: std::io::Error) -> std::io::Error {
    let text = e.to_string();
    match text.split_once(" at path \"") {
        Some((cause, _)) => std::io::Error::new(e.kind(), cause),
        None => e,
    }
}

/// Writes `bytes` into `tmp` and renames it to `path` (a link at `path` is replaced, never
/// followed); on failure the temporary file is deleted.
pub(super) fn write_all(
    mut tmp: tempfile::NamedTempFile,
    bytes: &[u8],
    path: &Path,
    dir: &Path,
) -> Result<(), FileError> {
    // Through the file itself: `NamedTempFile`'s own `Write` adds its random path to errors.
    tmp.as_file_mut()
        .write_all(bytes)
        .map_err(|e| io_error("write a file in", dir)(os_error(e)))?;
    tmp.persist(path)
        .map(drop)
        .map_err(|e| io_error("rename a file in", dir)(os_error(e.error)))
}

/// Refuses a directory another local user could swap files in: owned by someone else than
/// us or root, or writable by others without the sticky bit. A link to a directory is
/// judged by the link's owner too (the sticky `/tmp` protects links, not their targets).
pub(super) fn check_owner(dir: &Path) -> Result<(), FileError> {
    let unsafe_dir = |reason: String| FileError::Unsafe {
        path: dir.to_owned(),
        reason,
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let owner_ok = |uid: u32| uid == me || uid == 0;
    let link = fs::symlink_metadata(dir).map_err(io_error("look at", dir))?;
    if link.file_type().is_symlink() && !owner_ok(link.uid()) {
        return Err(unsafe_dir(format!(
            "it is a link owned by user {}, not by us ({me}) or root",
            link.uid()
        )));
    }
    let dir = fs::metadata(dir).map_err(io_error("look at", dir))?;
    if !owner_ok(dir.uid()) {
        return Err(unsafe_dir(format!(
            "it is owned by user {}, not by us ({me}) or root, who could replace our files \
             with links; use a directory of our own",
            dir.uid()
        )));
    }
    let mode = dir.permissions().mode();
    if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        return Err(unsafe_dir(format!(
            "anyone may write in it (mode {:o}) and it has no sticky bit, so any local user \
             could replace our files; chmod o-w or +t it, or use a directory of our own",
            mode & 0o7777
        )));
    }
    Ok(())
}
