//! The loaded modules as files: each one's symbol table (function names), and, for those with
//! DWARF debug information, its sections and an index from addresses to compilation units.
//!
//! Each module's file is mapped read-only and private, once, for the life of the process;
//! only the parts that are read get into memory, and [`Module::release`] hands them back to the
//! kernel after each batch (`MADV_DONTNEED`: the next read fetches them again from the page
//! cache). What is kept: the table of its functions (see `functions`) and of its compilation
//! units (see `units`), each read so that loading, the first export's peak of memory, reads
//! little and keeps little; of the program's symbol names (about 600 KiB in the cheap
//! benchmark) only the aliases' are read.
//!
//! The limitation this shares with every mapping symbolizer (backtrace-rs's included): a
//! module file truncated in place while the process runs makes reading it fault (`SIGBUS`).
//! Deployments that replace binaries by renaming a new file over the old one (cargo, package
//! managers, container images) leave the mapped old file intact.

use super::functions::Functions;
use super::units::Units;
use std::ffi::c_void;
use std::ops::Range;
use std::sync::Arc;

/// A read-only, private mapping of a whole file, never unmapped, and the file, open.
pub(super) struct Mapping {
    ptr: *mut c_void,
    len: usize,
    /// For reading strings with `pread` instead of through the mapping (see
    /// [`Module::string_at`]).
    file: std::fs::File,
}

// SAFETY: the mapping is read-only and never unmapped; reading it from any thread is fine.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn open(path: &str) -> Option<Mapping> {
        let file = std::fs::File::open(path).ok()?;
        let len = usize::try_from(file.metadata().ok()?.len()).ok()?;
        if len == 0 {
            return None;
        }
        // SAFETY: mapping a file we opened for reading, read-only and private (the mapping
        // would keep the file if the descriptor were closed; it is kept for `pread`).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        (ptr != libc::MAP_FAILED).then_some(Mapping { ptr, len, file })
    }

    /// The NUL-terminated string that `at` (a slice of this mapping) starts with, read from
    /// the file with `pread` (the page cache), not through the mapping: no page of the mapping
    /// is touched. `None` if `at` is not in this mapping or the file cannot be read there.
    fn read_cstr(&self, at: &[u8]) -> Option<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let offset = (at.as_ptr() as usize).checked_sub(self.ptr as usize)?;
        if offset >= self.len {
            return None;
        }
        let end = at.len().min(MAX_STRING);
        let mut out: Vec<u8> = Vec::new();
        let mut chunk = 256;
        while out.len() < end {
            let start = out.len();
            out.resize((start + chunk).min(end), 0);
            let n = self
                .file
                .read_at(&mut out[start..], (offset + start) as u64)
                .ok()?;
            out.truncate(start + n);
            if let Some(nul) = out[start..].iter().position(|&b| b == 0) {
                out.truncate(start + nul);
                return Some(out);
            }
            if n == 0 {
                break;
            }
            chunk *= 4;
        }
        Some(out)
    }

    /// The file's bytes, for as long as the process lives (the mapping is never removed).
    fn bytes(&self) -> &'static [u8] {
        // SAFETY: `ptr..ptr+len` is a live read-only mapping that is never unmapped.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }

    /// Unmaps a mapping that was never lent out (a candidate file that did not match).
    fn close(self) {
        // SAFETY: no slice of this mapping was handed out: `bytes` was only read within
        // `separate_debug_file`'s check, whose borrows ended.
        unsafe { libc::munmap(self.ptr, self.len) };
    }

    /// Drops the pages read so far from this process's memory.
    fn release(&self) {
        // SAFETY: advising the kernel about our own read-only private file mapping; its
        // contents are read again from the file on the next access.
        unsafe { libc::madvise(self.ptr, self.len, libc::MADV_DONTNEED) };
    }
}

/// The longest string read from a module's debug information (a mangled name of deeply nested
/// generics runs to some KiB).
const MAX_STRING: usize = 1 << 16;

/// One loaded module.
pub(super) struct Module {
    /// The file's name without its folder (`libc.so.6`), naming code it has no symbol for.
    pub(super) file_name: String,
    /// Loaded address minus the module's own address.
    pub(super) bias: u64,
    /// Its code, in loaded addresses.
    pub(super) text: Range<u64>,
    mapping: Option<Mapping>,
    /// The separate debug file whose symbol table `functions` came from, if any.
    debug_file: Option<Mapping>,
    pub(super) functions: Functions,
    /// Whether `functions` are its exported ones only (no symbol table).
    exported_only: bool,
    /// Its compilation units with code, from `.debug_aranges`.
    pub(super) units: Units,
    /// The parsed file, for DWARF sections (borrowed from the mapping).
    pub(super) object: Option<object::File<'static, &'static [u8]>>,
}

impl Module {
    /// What this module says about its own code: `Unknown` when its file could not be read
    /// (replaced on disk, say), not that it is stripped.
    pub(super) fn symbols(&self) -> tracing_prof_model::Symbols {
        use object::Object;
        use tracing_prof_model::Symbols;
        let Some(object) = &self.object else {
            return Symbols::Unknown;
        };
        if object.section_by_name(".debug_info").is_some() {
            Symbols::DebugInfo
        } else if self.functions.is_empty() || self.exported_only {
            // Without a symbol table, the few exported functions name almost nothing.
            Symbols::Stripped
        } else {
            Symbols::SymbolTable
        }
    }

    /// The NUL-terminated string `at` (a slice of this module's file, as a DWARF string
    /// section's) starts with: read with `pread` where the module is a mapped file, so reading
    /// a name costs no resident memory and no hand-back (each `MADV_DONTNEED` that unmaps pages
    /// interrupts every CPU running a thread of the process to flush its TLB); read in place
    /// otherwise (the vDSO, in memory anyway).
    pub(super) fn string_at(&self, at: &'static [u8]) -> Vec<u8> {
        if let Some(s) = self.mapping.as_ref().and_then(|m| m.read_cstr(at)) {
            return s;
        }
        let end = at.iter().take(MAX_STRING).position(|&b| b == 0);
        at[..end.unwrap_or(at.len().min(MAX_STRING))].to_vec()
    }

    /// Hands back the file pages read so far.
    pub(super) fn release(&self) {
        release(&[&self.mapping, &self.debug_file]);
    }
}

/// Hands back the file pages of `mappings` read so far.
fn release(mappings: &[&Option<Mapping>]) {
    for m in mappings.iter().copied().flatten() {
        m.release();
    }
}

/// Reads one module's tables from `bytes` (a file mapping, or the vDSO in memory).
fn parse(
    bias: u64,
    text: Range<u64>,
    path: &str,
    mapping: Option<Mapping>,
    bytes: &'static [u8],
) -> Module {
    use object::{Object, ObjectSection};
    let object = object::File::parse(bytes).ok();
    let mut debug_file = None;
    let mut functions = Functions::default();
    let mut exported_only = false;
    let mut units = Units::default();
    if let Some(obj) = &object {
        functions = Functions::read(obj, false, &|| release(&[&mapping]));
        if functions.is_empty() {
            // A stripped library: the full symbol table may be in a separate debug file
            // (Debian's `-dbg` packages), else its exported functions are all there is.
            debug_file = separate_debug_file(obj, path);
            if let Some(d) = debug_file
                .as_ref()
                .and_then(|m| object::File::parse(m.bytes()).ok())
            {
                functions = Functions::read(&d, false, &|| release(&[&debug_file]));
            }
        }
        if functions.is_empty() {
            functions = Functions::read(obj, true, &|| release(&[&mapping]));
            exported_only = true;
        }
        if let Some(aranges) = obj
            .section_by_name(".debug_aranges")
            .and_then(|s| s.data().ok())
        {
            units = Units::read(aranges, &|| release(&[&mapping]));
        }
    }
    let module = Module {
        file_name: path.rsplit('/').next().unwrap_or(path).to_owned(),
        bias,
        text,
        mapping,
        debug_file,
        functions,
        exported_only,
        units,
        object,
    };
    module.release();
    module
}

/// Every module loaded now, with its tables; those of `known` still loaded at the same place
/// are kept as they are (not mapped and read again).
pub(super) fn loaded_modules(known: &[Arc<Module>]) -> Vec<Arc<Module>> {
    let (loaded, _) = tracing_prof_cpu::loaded_modules();
    loaded
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let text = r
                .text
                .as_ref()
                .map(|t| (r.bias + t.start)..(r.bias + t.end))?;
            if let Some(m) = known.iter().find(|m| m.bias == r.bias && m.text == text) {
                return Some(m.clone());
            }
            if r.name.starts_with("linux-vdso") || r.name.starts_with("linux-gate") {
                // Mapped from the kernel, whole: its section headers (and so its symbol table)
                // lie past the end of its one loaded segment, within the pages of the mapping.
                let start = r.bias + r.segments.iter().map(|s| s.start).min()?;
                // (Its loaded segment alone, if /proc/self/maps does not list it as expected:
                // the functions then come from that part only.)
                let end = vdso_mapping_end(start)
                    .unwrap_or(r.bias + r.segments.iter().map(|s| s.end).max()?);
                // SAFETY: `start..end` is the vDSO's mapping as /proc/self/maps lists it: the
                // kernel maps it readable for the life of the process, ELF header first.
                let bytes = unsafe {
                    std::slice::from_raw_parts(start as *const u8, (end - start) as usize)
                };
                return Some(Arc::new(parse(r.bias, text, &r.name, None, bytes)));
            }
            let path = if i == 0 && r.name.is_empty() {
                std::env::current_exe().ok()?.to_string_lossy().into_owned()
            } else {
                r.name.clone()
            };
            let mapping = Mapping::open(&path);
            let bytes = mapping.as_ref().map_or(&[][..], Mapping::bytes);
            Some(Arc::new(parse(r.bias, text, &path, mapping, bytes)))
        })
        .collect()
}

/// The end of the `[vdso]` mapping that starts at `start`, as `/proc/self/maps` lists it.
fn vdso_mapping_end(start: u64) -> Option<u64> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter(|l| l.ends_with("[vdso]"))
        .find_map(|l| {
            let (range, _) = l.split_once(' ')?;
            let (a, b) = range.split_once('-')?;
            let (a, b) = (
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            );
            (a == start && b > a).then_some(b)
        })
}

/// Where distributions put a stripped file's symbols: by GNU build id
/// (`/usr/lib/debug/.build-id/ab/cdef….debug`), else by `.gnu_debuglink` name, beside the
/// file, in its `.debug/` folder or under `/usr/lib/debug` (the places GDB looks, in its
/// order). A file whose build id does not match is not used.
fn separate_debug_file(obj: &object::File<'static, &'static [u8]>, path: &str) -> Option<Mapping> {
    use object::Object;
    const ROOT: &str = "/usr/lib/debug";
    let id = obj.build_id().ok().flatten().filter(|id| id.len() > 1);
    let matching = |m: Mapping| {
        let ok = object::File::parse(m.bytes())
            .is_ok_and(|d| id.is_none() || d.build_id().ok().flatten() == id);
        if ok {
            Some(m)
        } else {
            m.close();
            None
        }
    };
    if let Some(id) = id {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let candidate = format!("{ROOT}/.build-id/{}/{}.debug", &hex[..2], &hex[2..]);
        if let Some(m) = Mapping::open(&candidate).and_then(matching) {
            return Some(m);
        }
    }
    let (name, _crc) = obj.gnu_debuglink().ok().flatten()?;
    let name = std::str::from_utf8(name).ok()?;
    let dir = std::path::Path::new(path).parent()?.to_str()?;
    [
        format!("{dir}/{name}"),
        format!("{dir}/.debug/{name}"),
        format!("{ROOT}{dir}/{name}"),
    ]
    .into_iter()
    .filter(|c| c != path)
    .find_map(|c| Mapping::open(&c).and_then(matching))
}

/// This test binary's module, loaded as the symbolizer loads it, and its file read whole.
#[cfg(all(test, target_os = "linux"))]
pub(super) fn test_program() -> (Arc<Module>, Vec<u8>) {
    let here = test_program as *const () as u64;
    let module = loaded_modules(&[])
        .into_iter()
        .find(|m| m.text.contains(&here))
        .expect("the test binary");
    (
        module,
        std::fs::read(std::env::current_exe().unwrap()).unwrap(),
    )
}
