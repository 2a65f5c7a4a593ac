//! The loaded modules as files: each one's symbol table (function names), and, for those with
//! DWARF debug information, its sections and an index from addresses to compilation units.
//!
//! Each module's file is mapped read-only and private, once, for the life of the process;
//! only the parts that are read get into memory, and [`Module::release`] hands them back to the
//! kernel after each batch (`MADV_DONTNEED`: the next read fetches them again from the page
//! cache). What is kept: a sorted table of the functions (start, size and where the name is:
//! 16 bytes each, the name read only when an address is looked up) and of the compilation
//! units' address ranges (from `.debug_aranges`, consecutive ranges of one unit merged: the
//! cheap benchmark's 17 400 ranges, in 454 units, are 9 900; 16 bytes each).
//!
//! Loading is the first export's peak of memory, so it reads each table in two passes (count,
//! then fill a vector of exactly that size), and hands the file's pages back as it goes; of the
//! program's symbol names (about 600 KiB in the cheap benchmark) only the aliases' are read.
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

/// One function of a symbol table: `[start, start + size)` in the module's own addresses (size
/// 0: up to the next function). Its name is an offset into the table's strings, read only when
/// an address is looked up, so that loading the table reads no name (16 bytes a function).
#[derive(Clone, Copy)]
struct Function {
    start: u64,
    size: u32,
    name: u32,
}

/// A symbol table's functions, sorted by address, one per address, and its strings.
#[derive(Default)]
struct Functions {
    list: Vec<Function>,
    strings: object::read::StringTable<'static, &'static [u8]>,
}

impl Functions {
    fn name(&self, f: &Function) -> Option<&'static [u8]> {
        self.strings.get(f.name).ok()
    }
}

/// A compilation unit's address range, from `.debug_aranges` (16 bytes).
struct UnitRange {
    start: u64,
    len: u32,
    /// Offset of the unit in `.debug_info`.
    unit: u32,
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
    functions: Functions,
    /// Whether `functions` are its exported ones only (no symbol table).
    exported_only: bool,
    units: Vec<UnitRange>,
    /// Where the units of `units` start in `.debug_info`, sorted: every unit with code.
    code_units: Vec<u32>,
    /// The parsed file, for DWARF sections (borrowed from the mapping).
    pub(super) object: Option<object::File<'static, &'static [u8]>>,
}

impl Module {
    /// The function containing `svma` (a module address): its start and its symbol's name, as
    /// the table has it (mangled). `None` also when that name cannot be read.
    pub(super) fn function(&self, svma: u64) -> Option<(u64, &'static [u8])> {
        let list = &self.functions.list;
        let f = list.get(list.partition_point(|f| f.start <= svma).checked_sub(1)?)?;
        let inside = svma - f.start < u64::from(f.size) || f.size == 0;
        inside.then(|| Some((f.start, self.functions.name(f)?)))?
    }

    /// The compilation unit whose range holds `svma`.
    pub(super) fn unit(&self, svma: u64) -> Option<usize> {
        let i = self.units.partition_point(|u| u.start <= svma);
        let u = self.units.get(i.checked_sub(1)?)?;
        (svma - u.start < u64::from(u.len)).then_some(u.unit as usize)
    }

    /// Where the compilation unit that holds `offset` of `.debug_info` starts: from the last
    /// unit with code at or before it (known from `.debug_aranges`), the units' headers are
    /// read forward until one reaches past `offset`, as `gimli` lists units (they follow each
    /// other). Units without code (functions only ever inlined elsewhere, whose names other
    /// units refer to) are usually a few headers away; listing every unit from the start reads
    /// a page of each, the whole section.
    pub(super) fn unit_at(
        &self,
        offset: usize,
        dwarf: &gimli::Dwarf<gimli::EndianSlice<'static, gimli::RunTimeEndian>>,
    ) -> Option<usize> {
        let known = &self.code_units;
        let i = known.partition_point(|&s| s as usize <= offset);
        let mut start = i.checked_sub(1).map_or(0, |i| known[i] as usize);
        loop {
            let h = dwarf
                .debug_info
                .header_from_offset(gimli::DebugInfoOffset(start))
                .ok()?;
            let end = start + h.length_including_self();
            if offset < end {
                return Some(start);
            }
            start = end;
        }
    }

    /// Names the symbol-table function at `start` with the symbol called `name` (tests: the
    /// alias a linker may list first for folded functions).
    #[cfg(test)]
    pub(super) fn rename_function(&mut self, start: u64, name: &[u8]) {
        use object::{Object, ObjectSymbol};
        let Some(object) = &self.object else {
            return;
        };
        let strings = self.functions.strings;
        let offset = object.symbols().find_map(|s| {
            let at = s.name_bytes().ok().filter(|n| *n == name)?.as_ptr();
            // The name's offset in the string table, from where the table says its first
            // string (offset 0, the empty one) is.
            let base = strings.get(0).ok()?.as_ptr();
            u32::try_from((at as usize).checked_sub(base as usize)?).ok()
        });
        for f in self.functions.list.iter_mut().filter(|f| f.start == start) {
            f.name = offset.expect("the name is in the symbol table");
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
        } else if self.functions.list.is_empty() || self.exported_only {
            // Without a symbol table, the few exported functions name almost nothing.
            Symbols::Stripped
        } else {
            Symbols::SymbolTable
        }
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

/// Symbol-table entries (24 bytes each in ELF64) read between two hand-backs of the pages
/// read: a program's table is several hundred KiB.
const SYMBOLS_PER_RELEASE: usize = 4096;

/// The functions of an ELF file's symbol table (`dynamic`: of its dynamic one). The table is
/// read twice, to count and then to fill a vector of the right size; no name is read but
/// those of aliases; pages go back every [`SYMBOLS_PER_RELEASE`] entries.
fn elf_functions<Elf: object::read::elf::FileHeader<Endian = object::Endianness>>(
    file: &object::read::elf::ElfFile<'static, Elf, &'static [u8]>,
    dynamic: bool,
    release: &dyn Fn(),
) -> Functions {
    use object::read::elf::Sym;
    let endian = file.endian();
    let table = if dynamic {
        file.elf_dynamic_symbol_table()
    } else {
        file.elf_symbol_table()
    };
    let symbols = table.symbols();
    let is_function = |s: &Elf::Sym| {
        matches!(
            s.st_type(),
            object::elf::STT_FUNC | object::elf::STT_GNU_IFUNC
        ) && s.st_value(endian).into() != 0
    };
    let mut count = 0;
    for (i, s) in symbols.iter().enumerate() {
        if i % SYMBOLS_PER_RELEASE == SYMBOLS_PER_RELEASE - 1 {
            release();
        }
        count += usize::from(is_function(s));
    }
    let mut list = Vec::with_capacity(count);
    for (i, s) in symbols.iter().enumerate() {
        if i % SYMBOLS_PER_RELEASE == SYMBOLS_PER_RELEASE - 1 {
            release();
        }
        if is_function(s) {
            list.push(Function {
                start: s.st_value(endian).into(),
                size: u32::try_from(s.st_size(endian).into()).unwrap_or(u32::MAX),
                name: s.st_name(endian),
            });
        }
    }
    release();
    let mut functions = Functions {
        list,
        strings: table.strings(),
    };
    select_aliases(&mut functions);
    release();
    functions
}

/// Sorts `functions` by address and keeps one per address: of aliases (`__clone3` and
/// `clone3`, `__libc_malloc` and `malloc`), the largest, then the public name (the fewest
/// leading underscores; a name that cannot be read never wins), then the first in the symbol
/// table (a stable sort: identical functions folded into one, as glibc's `pthread_spin_unlock`
/// and `pthread_spin_init`, keep the name they always had here).
fn select_aliases(functions: &mut Functions) {
    let strings = functions.strings;
    let underscores = |f: &Function| match strings.get(f.name) {
        Ok(name) => name.iter().take_while(|&&b| b == b'_').count(),
        Err(()) => usize::MAX,
    };
    let list = &mut functions.list;
    list.sort_by_key(|f| (f.start, std::cmp::Reverse(f.size)));
    list.dedup_by(|next, kept| {
        if next.start != kept.start {
            return false;
        }
        if next.size == kept.size && underscores(next) < underscores(kept) {
            *kept = *next;
        }
        true
    });
}

/// The functions of `obj`'s symbol table (`dynamic`: its dynamic one).
fn functions_of(
    obj: &object::File<'static, &'static [u8]>,
    dynamic: bool,
    release: &dyn Fn(),
) -> Functions {
    match obj {
        object::File::Elf32(f) => elf_functions(f, dynamic, release),
        object::File::Elf64(f) => elf_functions(f, dynamic, release),
        _ => Functions::default(),
    }
}

/// `.debug_aranges` entries read between two hand-backs of the pages read.
const RANGES_PER_RELEASE: usize = 8192;

/// The compilation units' address ranges from `.debug_aranges`, sorted, one per run of a unit.
/// The section is read twice, to count and then to fill a vector of the right size.
///
/// A unit's ranges (one per function) mostly follow each other, with alignment padding
/// between: one range per run of a unit (the cheap benchmark's 17 400 ranges, in 454 units,
/// are 9 900). The gaps it covers hold no other unit's code (the ranges are sorted); an address
/// there that no unit describes (code without debug information) finds no function in this
/// unit's tree, nor a row of its line program, and gets the symbol table's name, as before. A
/// unit past 4 GiB into `.debug_info` is left out: its addresses get the symbol table's names.
fn unit_ranges(aranges: &'static [u8], release: &dyn Fn()) -> Vec<UnitRange> {
    let aranges = gimli::DebugAranges::new(aranges, gimli::LittleEndian);
    let ranges = |f: &mut dyn FnMut(UnitRange)| {
        let mut read = 0;
        let mut headers = aranges.headers();
        while let Ok(Some(h)) = headers.next() {
            let Ok(unit) = u32::try_from(h.debug_info_offset().0) else {
                continue;
            };
            let mut entries = h.entries();
            while let Ok(Some(e)) = entries.next() {
                read += 1;
                if read % RANGES_PER_RELEASE == 0 {
                    release();
                }
                let r = e.range();
                // A range at 0 is a function the linker dropped (its relocations resolved
                // to 0): several units list one there, and no code is.
                if let Ok(len) = u32::try_from(r.end.saturating_sub(r.begin))
                    && len > 0
                    && r.begin > 0
                {
                    f(UnitRange {
                        start: r.begin,
                        len,
                        unit,
                    });
                }
            }
        }
        release();
    };
    let mut count = 0;
    ranges(&mut |_| count += 1);
    let mut units = Vec::with_capacity(count);
    ranges(&mut |u| units.push(u));
    units.sort_unstable_by_key(|u| (u.start, u.len, u.unit));
    units.dedup_by(|next, run| {
        let end = (next.start + u64::from(next.len)).max(run.start + u64::from(run.len));
        match u32::try_from(end - run.start) {
            Ok(len) if run.unit == next.unit => {
                run.len = len;
                true
            }
            _ => false,
        }
    });
    units.shrink_to_fit();
    units
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
    let mut units = Vec::new();
    if let Some(obj) = &object {
        functions = functions_of(obj, false, &|| release(&[&mapping]));
        if functions.list.is_empty() {
            // A stripped library: the full symbol table may be in a separate debug file
            // (Debian's `-dbg` packages), else its exported functions are all there is.
            debug_file = separate_debug_file(obj, path);
            if let Some(d) = debug_file
                .as_ref()
                .and_then(|m| object::File::parse(m.bytes()).ok())
            {
                functions = functions_of(&d, false, &|| release(&[&debug_file]));
            }
        }
        if functions.list.is_empty() {
            functions = functions_of(obj, true, &|| release(&[&mapping]));
            exported_only = true;
        }
        if let Some(aranges) = obj
            .section_by_name(".debug_aranges")
            .and_then(|s| s.data().ok())
        {
            units = unit_ranges(aranges, &|| release(&[&mapping]));
        }
    }
    let mut code_units: Vec<u32> = units.iter().map(|u| u.unit).collect();
    code_units.sort_unstable();
    code_units.dedup();
    code_units.shrink_to_fit();
    let module = Module {
        file_name: path.rsplit('/').next().unwrap_or(path).to_owned(),
        bias,
        text,
        mapping,
        debug_file,
        functions,
        exported_only,
        units,
        code_units,
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use object::{Object, ObjectSection, ObjectSymbol};
    use std::collections::{HashMap, HashSet};

    /// This test binary's module, loaded as the symbolizer loads it, and its file read whole.
    fn program() -> (Arc<Module>, Vec<u8>) {
        let here = program as *const () as u64;
        let module = loaded_modules(&[])
            .into_iter()
            .find(|m| m.text.contains(&here))
            .expect("the test binary");
        (
            module,
            std::fs::read(std::env::current_exe().unwrap()).unwrap(),
        )
    }

    /// The function table, read through symbol-table offsets, agrees with `object`'s own
    /// reading of every text symbol: one function per address, named by one of the names the
    /// symbol table gives that address, and the largest of them.
    #[test]
    fn functions_agree_with_the_symbol_table() {
        let (module, exe) = program();
        let file = object::File::parse(&*exe).unwrap();
        let mut by_start: HashMap<u64, Vec<(u64, Vec<u8>)>> = HashMap::new();
        for s in file.symbols() {
            if s.kind() == object::SymbolKind::Text && s.address() != 0 {
                let name = s.name_bytes().unwrap().to_vec();
                by_start
                    .entry(s.address())
                    .or_default()
                    .push((s.size(), name));
            }
        }
        assert!(by_start.len() > 1000, "{} functions", by_start.len());
        assert_eq!(module.functions.list.len(), by_start.len());
        for (&start, symbols) in &by_start {
            let (found, name) = module.function(start).expect("a function at its start");
            assert_eq!(found, start);
            let longest = symbols.iter().map(|s| s.0).max().unwrap();
            assert!(
                symbols
                    .iter()
                    .any(|(size, n)| *size == longest && n == name),
                "{:?} at {start:#x}: {:?}",
                String::from_utf8_lossy(name),
                symbols
            );
            if longest > 1 {
                let last = start + longest - 1;
                assert_eq!(module.function(last).map(|f| f.0), Some(start));
            }
        }
        // Of aliases, the public name: the fewest leading underscores.
        let underscores = |n: &[u8]| n.iter().take_while(|&&b| b == b'_').count();
        for (&start, symbols) in by_start.iter().filter(|(_, s)| s.len() > 1) {
            let (_, name) = module.function(start).unwrap();
            let longest = symbols.iter().map(|s| s.0).max().unwrap();
            let fewest = symbols
                .iter()
                .filter(|s| s.0 == longest)
                .map(|s| underscores(&s.1))
                .min()
                .unwrap();
            assert_eq!(
                underscores(name),
                fewest,
                "{}",
                String::from_utf8_lossy(name)
            );
        }
    }

    /// Of aliases: the largest function, then the fewest leading underscores, then the first
    /// in the symbol table; a name that cannot be read never wins (the test binary's own
    /// aliases differ in none of these, so the rule is checked on a table made here).
    #[test]
    fn aliases_are_chosen_by_size_underscores_then_table_order() {
        // Offsets: 1 "__a", 5 "b", 7 "_c", 10 "d", 12 "e"; 100 is past the end.
        static STRINGS: &[u8] = b"\0__a\0b\0_c\0d\0e\0";
        let f = |start, size, name| Function { start, size, name };
        let mut functions = Functions {
            list: vec![
                f(0x30, 8, 7),   // "_c"
                f(0x10, 8, 1),   // "__a"
                f(0x10, 8, 5),   // "b": fewer underscores than "__a"
                f(0x10, 4, 10),  // "d": smaller
                f(0x20, 8, 12),  // "e": listed first of two with no underscore
                f(0x20, 8, 10),  // "d"
                f(0x30, 8, 100), // unreadable: never chosen
                f(0x40, 8, 100), // unreadable, but alone
            ],
            strings: object::read::StringTable::new(STRINGS, 0, STRINGS.len() as u64),
        };
        select_aliases(&mut functions);
        let chosen: Vec<(u64, u32)> = functions.list.iter().map(|f| (f.start, f.name)).collect();
        assert_eq!(chosen, [(0x10, 5), (0x20, 12), (0x30, 7), (0x40, 100)]);
    }

    /// An offset in a unit with code is placed in it, and so is every offset of every unit
    /// `gimli` lists (from its first byte to its last), units without code included.
    #[test]
    fn units_are_found_by_offset() {
        let (module, _) = program();
        let dwarf = super::super::dwarf::dwarf_of(&module).expect("debug information");
        assert!(
            module.code_units.len() > 10,
            "{} units",
            module.code_units.len()
        );
        for &start in &module.code_units {
            let start = start as usize;
            let h = dwarf
                .debug_info
                .header_from_offset(gimli::DebugInfoOffset(start))
                .unwrap();
            let end = start + h.length_including_self();
            for offset in [start, start + h.header_size(), end - 1] {
                assert_eq!(module.unit_at(offset, &dwarf), Some(start), "{offset:#x}");
            }
        }
        let mut headers = dwarf.units();
        let mut all = 0;
        while let Some(h) = headers.next().unwrap() {
            let start = h.offset().0;
            let end = start + h.length_including_self();
            for offset in [start, end - 1] {
                assert_eq!(module.unit_at(offset, &dwarf), Some(start), "{offset:#x}");
            }
            all += 1;
        }
        // Units without code among them: their offsets are reached by reading headers forward.
        assert!(
            all > module.code_units.len(),
            "{all} units, {} with code",
            module.code_units.len()
        );
    }

    /// Every range `.debug_aranges` lists finds its own unit, at its first and last byte.
    #[test]
    fn unit_ranges_agree_with_debug_aranges() {
        let (module, exe) = program();
        let file = object::File::parse(&*exe).unwrap();
        let Some(data) = file
            .section_by_name(".debug_aranges")
            .and_then(|s| s.data().ok())
        else {
            return; // built without debug information: nothing to compare
        };
        let aranges = gimli::DebugAranges::new(data, gimli::LittleEndian);
        let mut headers = aranges.headers();
        let (mut ranges, mut units) = (0, HashSet::new());
        while let Some(h) = headers.next().unwrap() {
            let unit = h.debug_info_offset().0;
            let mut entries = h.entries();
            while let Some(e) = entries.next().unwrap() {
                let r = e.range();
                if r.end > r.begin && r.begin > 0 {
                    assert_eq!(module.unit(r.begin), Some(unit), "{:#x}", r.begin);
                    assert_eq!(module.unit(r.end - 1), Some(unit), "{:#x}", r.end - 1);
                    ranges += 1;
                    units.insert(unit);
                }
            }
        }
        assert!(ranges > 100, "{ranges} ranges");
        // Consecutive ranges of one unit are one entry.
        assert!(
            module.units.len() < ranges,
            "{} of {ranges}",
            module.units.len()
        );
        assert!(module.units.len() >= units.len());
    }
}
