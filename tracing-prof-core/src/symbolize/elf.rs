//! The loaded modules as files: each one's symbol table (function names), and, for those with
//! DWARF debug information, its sections and an index from addresses to compilation units.
//!
//! Each module's file is mapped read-only and private, once, for the life of the process;
//! only the parts that are read get into memory, and [`Module::release`] hands them back to the
//! kernel after each batch (`MADV_DONTNEED`: the next read fetches them again from the page
//! cache). What is kept: a sorted table of the functions (start, end, name: 32 bytes each) and
//! of the compilation units' address ranges (from `.debug_aranges`, consecutive ranges of one unit
//! merged: the cheap benchmark's 17 400 ranges, in 454 units, are 9 900).
//!
//! The limitation this shares with every mapping symbolizer (backtrace-rs's included): a
//! module file truncated in place while the process runs makes reading it fault (`SIGBUS`).
//! Deployments that replace binaries by renaming a new file over the old one (cargo, package
//! managers, container images) leave the mapped old file intact.

use std::ffi::c_void;
use std::ops::Range;
use std::sync::Arc;

/// A read-only, private mapping of a whole file, never unmapped.
pub(super) struct Mapping {
    ptr: *mut c_void,
    len: usize,
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
        // SAFETY: mapping a file we opened for reading, read-only and private; the descriptor
        // may be closed afterwards (the mapping keeps the file).
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
        (ptr != libc::MAP_FAILED).then_some(Mapping { ptr, len })
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

/// One function of a symbol table: `[start, end)` in the module's own addresses.
struct Function {
    start: u64,
    end: u64,
    name: &'static [u8],
}

/// A compilation unit's address range, from `.debug_aranges`.
pub(super) struct UnitRange {
    pub(super) start: u64,
    pub(super) end: u64,
    /// Offset of the unit in `.debug_info`.
    pub(super) unit: usize,
}

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
    functions: Vec<Function>,
    /// Whether `functions` are its exported ones only (no symbol table).
    exported_only: bool,
    pub(super) units: Vec<UnitRange>,
    /// The parsed file, for DWARF sections (borrowed from the mapping).
    pub(super) object: Option<object::File<'static, &'static [u8]>>,
    /// Where each compilation unit starts in `.debug_info`, read when first needed.
    unit_starts: std::sync::OnceLock<Vec<usize>>,
}

impl Module {
    /// The function containing `svma` (a module address), as a demangled name.
    pub(super) fn function(&self, svma: u64) -> Option<(u64, &'static [u8])> {
        let i = self.functions.partition_point(|f| f.start <= svma);
        let f = self.functions.get(i.checked_sub(1)?)?;
        (svma < f.end || f.end == f.start).then_some((f.start, f.name))
    }

    /// The compilation unit whose range holds `svma`.
    pub(super) fn unit(&self, svma: u64) -> Option<usize> {
        let i = self.units.partition_point(|u| u.start <= svma);
        let u = self.units.get(i.checked_sub(1)?)?;
        (svma < u.end).then_some(u.unit)
    }

    /// Where each compilation unit starts in `.debug_info`, in order (read once: one unit
    /// header each).
    pub(super) fn unit_starts(
        &self,
        dwarf: &gimli::Dwarf<gimli::EndianSlice<'static, gimli::RunTimeEndian>>,
    ) -> &[usize] {
        self.unit_starts.get_or_init(|| {
            let mut starts = Vec::new();
            let mut headers = dwarf.units();
            // A header per unit: with a few thousand small units that is a page of
            // `.debug_info` each, the whole section (12 MiB of the example's, brought in within
            // 20 ms), so the pages go back every MiB of it.
            let mut released_at = 0;
            while let Ok(Some(h)) = headers.next() {
                let offset = h.offset().0;
                if offset - released_at >= 1 << 20 {
                    self.release();
                    released_at = offset;
                }
                starts.push(offset);
            }
            self.release();
            starts
        })
    }

    /// Names the symbol-table function at `start` `name` (tests: the alias a linker may list
    /// first for folded functions).
    #[cfg(test)]
    pub(super) fn rename_function(&mut self, start: u64, name: &'static [u8]) {
        for f in self.functions.iter_mut().filter(|f| f.start == start) {
            f.name = name;
        }
    }

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

    /// Hands back the file pages read so far.
    pub(super) fn release(&self) {
        for m in self.mapping.iter().chain(&self.debug_file) {
            m.release();
        }
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
    use object::{Object, ObjectSection, ObjectSymbol};
    let object = object::File::parse(bytes).ok();
    let mut debug_file = None;
    let mut functions = Vec::new();
    let mut exported_only = false;
    let mut units = Vec::new();
    if let Some(obj) = &object {
        let text_symbols = |syms: object::SymbolIterator<'static, '_, &'static [u8]>| {
            syms.filter(|s| s.kind() == object::SymbolKind::Text && s.address() != 0)
                .filter_map(|s| {
                    Some(Function {
                        start: s.address(),
                        end: s.address() + s.size(),
                        name: s.name_bytes().ok()?,
                    })
                })
                .collect::<Vec<_>>()
        };
        functions = text_symbols(obj.symbols());
        if functions.is_empty() {
            // A stripped library: the full symbol table may be in a separate debug file
            // (Debian's `-dbg` packages), else its exported functions are all there is.
            debug_file = separate_debug_file(obj, path);
            if let Some(d) = debug_file
                .as_ref()
                .and_then(|m| object::File::parse(m.bytes()).ok())
            {
                functions = text_symbols(d.symbols());
            }
        }
        if functions.is_empty() {
            functions = text_symbols(obj.dynamic_symbols());
            exported_only = true;
        }
        // Of aliases (`__clone3` and `clone3`, `__libc_malloc` and `malloc`), the public name.
        let underscores = |f: &Function| f.name.iter().take_while(|&&b| b == b'_').count();
        functions.sort_by_key(|f| (f.start, std::cmp::Reverse(f.end), underscores(f)));
        functions.dedup_by_key(|f| f.start);
        if let Some(aranges) = obj
            .section_by_name(".debug_aranges")
            .and_then(|s| s.data().ok())
        {
            let aranges = gimli::DebugAranges::new(aranges, gimli::LittleEndian);
            let mut headers = aranges.headers();
            while let Ok(Some(h)) = headers.next() {
                let unit = h.debug_info_offset().0;
                let mut entries = h.entries();
                while let Ok(Some(e)) = entries.next() {
                    let r = e.range();
                    if r.end > r.begin {
                        units.push(UnitRange {
                            start: r.begin,
                            end: r.end,
                            unit,
                        });
                    }
                }
            }
            units.sort_by_key(|u| u.start);
            // A unit's ranges (one per function) mostly follow each other, with alignment
            // padding between: one range per run of a unit. The gaps it covers hold no other
            // unit's code (the ranges are sorted); an address there that no unit describes
            // (code without debug information) finds no function in this unit's tree, nor a
            // row of its line program, and gets the symbol table's name, as before.
            units.dedup_by(|next, run| {
                let joins = run.unit == next.unit;
                if joins {
                    run.end = run.end.max(next.end);
                }
                joins
            });
            units.shrink_to_fit();
        }
        functions.shrink_to_fit();
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
        unit_starts: std::sync::OnceLock::new(),
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
