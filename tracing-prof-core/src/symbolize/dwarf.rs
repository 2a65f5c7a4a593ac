//! Resolving a batch of addresses of one module: names from the symbol table; file, line and
//! inlined frames from the DWARF of only the compilation units that hold them.
//!
//! For each unit that holds an address of the batch, its line program is run once (its rows
//! kept until the batch ends) and its tree of functions walked once, descending only into
//! functions whose code ranges hold an address of the batch. Nothing else of the debug
//! information is read.

use super::elf::Module;
use gimli::{EndianSlice, RunTimeEndian};
use std::collections::HashMap;
use std::sync::Arc;
use tracing_prof_model::CodeFrame;

type R = EndianSlice<'static, RunTimeEndian>;

/// `name` demangled, without the hash; a C symbol without its version (`clock_gettime` for
/// `clock_gettime@@GLIBC_2.17`, as a separate debug file's symbol table names it).
pub(super) fn demangle(name: &[u8]) -> String {
    let s = String::from_utf8_lossy(name);
    match rustc_demangle::try_demangle(&s) {
        Ok(d) => format!("{d:#}"),
        Err(_) => match s.split_once('@') {
            Some((plain, _)) if !plain.is_empty() => plain.to_owned(),
            _ => s.into_owned(),
        },
    }
}

/// A file:line place.
#[derive(Clone, Debug, Default)]
struct Place {
    file: Option<Arc<str>>,
    line: Option<u32>,
}

/// A function or inlined function holding some of the batch's addresses.
struct Scope {
    name: Option<String>,
    /// Whether `name` is a path (from a linkage name), not a short name.
    qualified: bool,
    /// Where it was inlined from (inlined functions only).
    call: Place,
    /// An inlined function known only by its short name (`{async_fn#0}`, `new`): what a
    /// `line-tables-only` build carries. Its own code ranges (its ranges less those of the
    /// functions inlined into it) are kept to find its first line, which then tells it apart
    /// from every other function of that name (see [`distinct_name`]).
    short: Option<Short>,
}

/// The code of an inlined function known only by its short name.
#[derive(Default)]
struct Short {
    ranges: Vec<(u64, u64)>,
    /// Ranges of the functions inlined into it, removed from `ranges` after the walk.
    nested: Vec<(u64, u64)>,
    /// Per file (index in the line program) its lines are in: how many of its rows and
    /// inlining places, and the lowest line.
    files: Vec<(u64, u32, u32)>,
}

impl Short {
    /// Notes a line of its code: (line, file index).
    fn note(&mut self, (line, file): (u32, u64)) {
        match self.files.iter_mut().find(|f| f.0 == file) {
            Some(f) => {
                f.1 += 1;
                f.2 = f.2.min(line);
            }
            None => self.files.push((file, 1, line)),
        }
    }

    /// Its first line, and the file: the file most of its lines are in (optimized code may
    /// give an instruction of an inlined function its caller's place), and the lowest line
    /// there.
    fn first(&self) -> Option<(u32, u64)> {
        self.files
            .iter()
            .max_by_key(|f| (f.1, std::cmp::Reverse(f.0)))
            .map(|f| (f.2, f.0))
    }
}

pub(super) fn dwarf_of(module: &Module) -> Option<gimli::Dwarf<R>> {
    use object::{Object, ObjectSection};
    let obj = module.object.as_ref()?;
    obj.section_by_name(".debug_info")?;
    let endian = if obj.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let load = |id: gimli::SectionId| -> Result<R, ()> {
        let data = obj
            .section_by_name(id.name())
            .and_then(|s| s.data().ok())
            .unwrap_or(&[]);
        Ok(EndianSlice::new(data, endian))
    };
    gimli::Dwarf::load(load).ok()
}

/// Resolves `addrs` (module addresses, sorted) of `module`: frames innermost first per address.
pub(super) fn resolve(
    module: &Module,
    addrs: &[u64],
    names: &mut super::Names,
) -> HashMap<u64, Vec<CodeFrame>> {
    let mut out: HashMap<u64, Vec<CodeFrame>> = HashMap::with_capacity(addrs.len());
    let mut by_unit: HashMap<usize, Vec<u64>> = HashMap::new();
    for &a in addrs {
        match module.units.of(a) {
            Some(u) => by_unit.entry(u).or_default().push(a),
            None => {
                out.insert(a, vec![symbol_frame(module, a, Place::default(), names)]);
            }
        }
    }
    let dwarf = if by_unit.is_empty() {
        None
    } else {
        dwarf_of(module)
    };
    for (unit_offset, addrs) in by_unit {
        let frames = dwarf
            .as_ref()
            .and_then(|d| resolve_unit(module, d, unit_offset, &addrs, names).ok());
        // Hand the unit's pages back before the next: the resident debug information is one
        // unit's at most, not the batch's (a re-read is a page-cache hit).
        module.release();
        for (i, &a) in addrs.iter().enumerate() {
            let f = frames
                .as_ref()
                .and_then(|f| f.get(i).cloned())
                .unwrap_or_else(|| vec![symbol_frame(module, a, Place::default(), names)]);
            out.insert(a, f);
        }
    }
    out
}

/// The symbol table's function at `a`, at `place`; `module+0xADDR` where it has none.
fn symbol_frame(module: &Module, a: u64, place: Place, names: &mut super::Names) -> CodeFrame {
    let function = match module.functions.at(a) {
        Some((_, name)) => demangle(name),
        // Code of a module without a symbol for it (a stripped library's own functions):
        // the module and the offset, as `addr2line` would be given them.
        None => format!("{}+0x{a:x}", module.file_name),
    };
    CodeFrame {
        function: super::intern_str(names, &function),
        file: place.file,
        line: place.line,
    }
}

/// Frames of each of `addrs` (sorted), all in the unit at `unit_offset`.
fn resolve_unit(
    module: &Module,
    dwarf: &gimli::Dwarf<R>,
    unit_offset: usize,
    addrs: &[u64],
    names: &mut super::Names,
) -> gimli::Result<Vec<Vec<CodeFrame>>> {
    let header = dwarf
        .debug_info
        .header_from_offset(gimli::DebugInfoOffset(unit_offset))?;
    let unit = dwarf.unit(header)?;
    let unit = unit.unit_ref(dwarf);
    // Per address, the functions holding it, outermost first.
    let mut chains: Vec<Vec<usize>> = vec![Vec::new(); addrs.len()];
    let mut scopes: Vec<Scope> = Vec::new();
    let mut files: HashMap<u64, Option<Arc<str>>> = HashMap::new();
    let mut tree = unit.entries_tree(None)?;
    let idx: Vec<usize> = (0..addrs.len()).collect();
    let mut others = Others {
        module,
        dwarf,
        units: HashMap::new(),
        released_at: 0,
    };
    walk(
        unit,
        tree.root()?,
        addrs,
        &idx,
        &mut Walked {
            scopes: &mut scopes,
            chains: &mut chains,
            files: &mut files,
            ranges: Vec::new(),
        },
        &mut others,
        None,
        0,
    )?;
    // The entries' pages back before the line program is read.
    module.release();
    let places = line_places(unit, addrs, &mut scopes)
        .unwrap_or_else(|_| vec![Place::default(); addrs.len()]);
    for scope in &mut scopes {
        if let (Some(name), Some(short)) = (&scope.name, &scope.short) {
            scope.name = Some(distinct_name(unit, name, short, &mut files));
        }
    }
    Ok(addrs
        .iter()
        .enumerate()
        .map(|(i, &a)| {
            let chain = &chains[i];
            if chain.is_empty() {
                return vec![symbol_frame(module, a, places[i].clone(), names)];
            }
            // Innermost first: the deepest scope at the line table's place, each outer one at
            // the place the scope inside it was inlined from.
            let mut frames = Vec::with_capacity(chain.len());
            let mut place = places[i].clone();
            for (depth, &s) in chain.iter().enumerate().rev() {
                let scope = &scopes[s];
                let name = if depth == 0 {
                    // The outermost is a real function. Its debug information names it by
                    // its linkage name, qualified; the symbol table may name another function
                    // folded into the same code (`<&UnixStream as Write>::write` for
                    // `<&TcpStream as Write>::write`: the linker keeps one copy of identical
                    // functions under both names). Without a qualified name here (a
                    // `line-tables-only` build), the symbol table names it.
                    scope
                        .name
                        .clone()
                        .filter(|_| scope.qualified)
                        .or_else(|| module.functions.at(a).map(|(_, n)| demangle(n)))
                        .or_else(|| scope.name.clone())
                } else {
                    scope.name.clone()
                };
                frames.push(CodeFrame {
                    function: super::intern_str(names, name.as_deref().unwrap_or("?")),
                    file: place.file.clone(),
                    line: place.line,
                });
                place = scope.call.clone();
            }
            frames
        })
        .collect())
}

/// The line table's place of each of `addrs` (sorted), and the first line of each function
/// of `scopes` known by its short name. The program is run once and no row is kept: each row
/// covers the addresses up to the next row of its sequence.
fn line_places(
    unit: gimli::UnitRef<'_, R>,
    addrs: &[u64],
    scopes: &mut [Scope],
) -> gimli::Result<Vec<Place>> {
    let mut out = vec![Place::default(); addrs.len()];
    let Some(program) = unit.line_program.clone() else {
        return Ok(out);
    };
    // The own code of each function known by its short name: disjoint (a function inlined
    // into another is cut out of it), sorted.
    let mut own: Vec<(u64, u64, usize)> = Vec::new();
    for (k, scope) in scopes.iter_mut().enumerate() {
        if let Some(short) = &mut scope.short {
            own.extend(
                subtract(&short.ranges, &mut short.nested)
                    .into_iter()
                    .map(|(b, e)| (b, e, k)),
            );
        }
    }
    own.sort_unstable();
    let mut found: Vec<Option<(u64, u32)>> = vec![None; addrs.len()];
    let mut rows = program.rows();
    // The previous row of the current sequence: (address, file, line).
    let mut prev: Option<(u64, u64, u32)> = None;
    while let Some((_, row)) = rows.next_row()? {
        let address = row.address();
        if let Some((start, file, line)) = prev {
            let from = addrs.partition_point(|&a| a < start);
            let to = addrs.partition_point(|&a| a < address);
            for f in &mut found[from..to] {
                *f = Some((file, line));
            }
            if line > 0 {
                let mut k = own.partition_point(|o| o.1 <= start);
                while let Some(&(begin, _, s)) = own.get(k)
                    && begin < address
                {
                    if let Some(short) = &mut scopes[s].short {
                        short.note((line, file));
                    }
                    k += 1;
                }
            }
        }
        prev = if row.end_sequence() {
            None
        } else {
            let line = row
                .line()
                .map_or(0, |l| u32::try_from(l.get()).unwrap_or(0));
            Some((address, row.file_index(), line))
        };
    }
    let header = rows.header();
    let mut files: HashMap<u64, Option<Arc<str>>> = HashMap::new();
    for (place, f) in out.iter_mut().zip(found) {
        if let Some((file, line)) = f {
            place.file = files
                .entry(file)
                .or_insert_with(|| file_path(unit, header, file))
                .clone();
            place.line = (line > 0).then_some(line);
        }
    }
    Ok(out)
}

/// `ranges` less `holes` (which it sorts).
fn subtract(ranges: &[(u64, u64)], holes: &mut [(u64, u64)]) -> Vec<(u64, u64)> {
    holes.sort_unstable();
    let mut out = Vec::with_capacity(ranges.len());
    for &(mut begin, end) in ranges {
        for &(hb, he) in holes.iter() {
            if he <= begin || hb >= end {
                continue;
            }
            if hb > begin {
                out.push((begin, hb));
            }
            begin = begin.max(he);
        }
        if begin < end {
            out.push((begin, end));
        }
    }
    out
}

/// The name of an inlined function known only by its short name, made distinct from every
/// other function of that name: `{async_fn#0} at myapp/src/orders.rs:42`, the file and first
/// line of its code. A `line-tables-only` build names two different `async fn`s' bodies both
/// `{async_fn#0}` and every constructor `new`; pprof's views group by name, so without this
/// they would be one row. The line is the lowest of the code inlined here, which is the
/// function's first line or close to it; the same function inlined elsewhere with less of its
/// code may read another line.
fn distinct_name(
    unit: gimli::UnitRef<'_, R>,
    name: &str,
    short: &Short,
    files: &mut HashMap<u64, Option<Arc<str>>>,
) -> String {
    let Some((line, file)) = short.first() else {
        return name.to_owned();
    };
    let path = files
        .entry(file)
        .or_insert_with(|| file_path(unit, unit.line_program.as_ref()?.header(), file))
        .clone();
    match path {
        Some(path) => format!("{name} at {}:{line}", crate_relative(&path)),
        None => name.to_owned(),
    }
}

/// A source path from its crate's directory on (`myapp/src/orders.rs`,
/// `tokio-1.48.0/src/runtime/park.rs`, `core/src/option.rs`): short, and still telling which
/// crate. A path without a `src` directory: its file name.
fn crate_relative(path: &str) -> &str {
    if let Some(src) = path.rfind("/src/")
        && let Some(dir) = path[..src].rfind('/')
    {
        return &path[dir + 1..];
    }
    path.rsplit('/').next().unwrap_or(path)
}

fn file_path(
    unit: gimli::UnitRef<'_, R>,
    header: &gimli::LineProgramHeader<R>,
    index: u64,
) -> Option<Arc<str>> {
    let file = header.file(index)?;
    let name = unit.attr_string(file.path_name()).ok()?;
    let name = String::from_utf8_lossy(name.slice());
    if name.starts_with('/') {
        return Some(Arc::from(name.as_ref()));
    }
    let dir = file
        .directory(header)
        .and_then(|d| unit.attr_string(d).ok())
        .map(|d| String::from_utf8_lossy(d.slice()).into_owned())
        .unwrap_or_default();
    let dir = if dir.starts_with('/') || dir.is_empty() {
        dir
    } else {
        let comp = unit
            .comp_dir
            .map(|c| String::from_utf8_lossy(c.slice()).into_owned())
            .unwrap_or_default();
        format!("{comp}/{dir}")
    };
    Some(Arc::from(if dir.is_empty() {
        name.into_owned()
    } else {
        format!("{}/{name}", dir.trim_end_matches('/'))
    }))
}

/// What a walk of a unit's tree records.
struct Walked<'a> {
    scopes: &'a mut Vec<Scope>,
    /// Per address, the scopes holding it, outermost first.
    chains: &'a mut [Vec<usize>],
    files: &'a mut HashMap<u64, Option<Arc<str>>>,
    /// The ranges of the function being looked at: one buffer for the whole walk, which looks
    /// at every function of the unit and keeps few (a buffer per function was most of the
    /// profiler's own allocations on an axum service).
    ranges: Vec<(u64, u64)>,
}

/// Walks the tree below `node`, descending into functions only where they hold some of the
/// addresses `idx` (indices into `addrs`), and records the chains. `parent` is the scope the
/// node is inside.
#[allow(
    clippy::too_many_arguments,
    reason = "a recursive walk threading its accumulators"
)]
fn walk(
    unit: gimli::UnitRef<'_, R>,
    node: gimli::EntriesTreeNode<'_, '_, R>,
    addrs: &[u64],
    idx: &[usize],
    out: &mut Walked<'_>,
    others: &mut Others<'_>,
    parent: Option<usize>,
    depth: usize,
) -> gimli::Result<()> {
    if depth > 256 || idx.is_empty() {
        return Ok(());
    }
    let entry = node.entry();
    others.progress(entry.offset().0);
    let inside: Vec<usize>;
    let mut parent = parent;
    let idx = match entry.tag() {
        gimli::DW_TAG_subprogram | gimli::DW_TAG_inlined_subroutine => {
            let inlined = entry.tag() == gimli::DW_TAG_inlined_subroutine;
            let mut ranges = unit.die_ranges(entry)?;
            out.ranges.clear();
            while let Some(r) = ranges.next()? {
                out.ranges.push((r.begin, r.end));
            }
            let own = &out.ranges[..];
            if own.is_empty() {
                return Ok(()); // a declaration or an abstract instance: no code here
            }
            // Code inlined into a function known by its short name is not that function's own,
            // but the place it was inlined at is one of its lines (a function whose code is all
            // inlined calls has no line of its own in the line table).
            if inlined && let Some(short) = parent.and_then(|p| out.scopes[p].short.as_mut()) {
                short.nested.extend_from_slice(own);
                if let Some(at) = call_index(entry) {
                    short.note(at);
                }
            }
            // Allocates only for a function that holds some of the addresses.
            inside = idx
                .iter()
                .copied()
                .filter(|&i| own.iter().any(|&(b, e)| b <= addrs[i] && addrs[i] < e))
                .collect();
            if inside.is_empty() {
                return Ok(());
            }
            let call = if inlined {
                call_place(unit, entry, out.files)
            } else {
                Place::default()
            };
            let name = others.name(unit, entry, 0);
            let short = (inlined && name.as_ref().is_some_and(|n| !n.qualified)).then(|| Short {
                ranges: out.ranges.clone(),
                ..Short::default()
            });
            out.scopes.push(Scope {
                qualified: name.as_ref().is_some_and(|n| n.qualified),
                name: name.map(|n| n.text),
                call,
                short,
            });
            let scope = out.scopes.len() - 1;
            for &i in &inside {
                out.chains[i].push(scope);
            }
            parent = Some(scope);
            &inside[..]
        }
        _ => idx,
    };
    let mut children = node.children();
    while let Some(child) = children.next()? {
        walk(unit, child, addrs, idx, out, others, parent, depth + 1)?;
    }
    Ok(())
}

/// Where an inlined function was inlined: (line, file index), the line not 0.
fn call_index(entry: &gimli::DebuggingInformationEntry<R>) -> Option<(u32, u64)> {
    let file = match entry.attr_value(gimli::DW_AT_call_file)? {
        gimli::AttributeValue::FileIndex(i) => i,
        v => v.udata_value()?,
    };
    let line = entry
        .attr_value(gimli::DW_AT_call_line)
        .and_then(|v| v.udata_value())
        .and_then(|l| u32::try_from(l).ok())
        .filter(|&l| l > 0)?;
    Some((line, file))
}

fn call_place(
    unit: gimli::UnitRef<'_, R>,
    entry: &gimli::DebuggingInformationEntry<R>,
    files: &mut HashMap<u64, Option<Arc<str>>>,
) -> Place {
    let file = match entry.attr_value(gimli::DW_AT_call_file) {
        Some(gimli::AttributeValue::FileIndex(i)) => Some(i),
        Some(v) => v.udata_value(),
        None => None,
    };
    let line = entry
        .attr_value(gimli::DW_AT_call_line)
        .and_then(|v| v.udata_value())
        .and_then(|l| u32::try_from(l).ok());
    let file = file.and_then(|i| {
        files
            .entry(i)
            .or_insert_with(|| {
                let header = unit.line_program.as_ref()?.header();
                file_path(unit, header, i)
            })
            .clone()
    });
    Place {
        file,
        line: line.filter(|&l| l > 0),
    }
}

/// A function's name as its debug information gives it.
struct Name {
    text: String,
    /// From its linkage name: the whole path (`myapp::orders::apply::{{closure}}`). Otherwise
    /// the short name, all a `line-tables-only` build carries (`{async_fn#0}`).
    qualified: bool,
}

/// The units of one module that functions refer to across units (`DW_FORM_ref_addr`, as in
/// code inlined from another codegen unit), parsed once per batch.
struct Others<'a> {
    module: &'a Module,
    dwarf: &'a gimli::Dwarf<R>,
    units: HashMap<usize, Arc<gimli::Unit<R>>>,
    /// Where in the unit being walked the module's pages were last handed back.
    released_at: usize,
}

/// Bytes of a unit's entries walked between two hand-backs of the pages read: a unit is
/// parsed in order (Rust's units have no sibling links to skip by), and the biggest of a
/// program are several MiB.
///
/// Every first touch of a page of the mapping costs up to 64 KiB of resident memory, not 4: the
/// kernel maps the cached pages around a faulting one as well ("fault-around", 16 pages by
/// default; `MADV_RANDOM` does not turn it off). Names, scattered over `.debug_str` and often
/// another unit's, would each cost a window of their own: they are read with `pread` instead
/// (see [`Others::string`]). Measured on the cheap benchmark's final export, against 256 KiB
/// (and names handed back after each, as it was then): peak RSS 9.4 to 8.5 MiB, final export
/// 33.5 to 38.5 ms (medians of 6 alternated runs; the pages are read again from the page
/// cache); 16 KiB gave no lower peak, for 46 ms. What this lowers is the process's resident
/// set: the pages stay in the page cache, shared and clean. Each hand-back that unmaps pages
/// also flushes them from the TLBs of the CPUs running the process's other threads (an
/// interrupt each, which the service's threads pay): names read through the mapping had made
/// about 2,500 hand-backs in the example service's first 25 s.
const RELEASE_EVERY: usize = 1 << 16;

impl Others<'_> {
    /// Notes that the walk reached `offset` in its unit, and hands the pages read back every
    /// [`RELEASE_EVERY`] bytes: the resident debug information stays about that size, however
    /// big the unit (entries read again later, as an inlined function's origin, come back
    /// from the page cache).
    fn progress(&mut self, offset: usize) {
        if offset.saturating_sub(self.released_at) >= RELEASE_EVERY {
            self.module.release();
            self.released_at = offset;
        }
    }

    /// A function's name: its linkage name demangled, else that of the function it is an
    /// instance of (in this unit or another), else its plain name. The pages read for it are
    /// handed back once it is copied out (see [`RELEASE_EVERY`]); the walk reads its own again
    /// from the page cache.
    fn name(
        &mut self,
        unit: gimli::UnitRef<'_, R>,
        entry: &gimli::DebuggingInformationEntry<R>,
        depth: u32,
    ) -> Option<Name> {
        for at in [gimli::DW_AT_linkage_name, gimli::DW_AT_MIPS_linkage_name] {
            if let Some(v) = entry.attr_value(at)
                && let Some(s) = self.string(unit, v)
            {
                return Some(Name {
                    text: demangle(&s),
                    qualified: true,
                });
            }
        }
        if depth < 8 {
            for at in [gimli::DW_AT_abstract_origin, gimli::DW_AT_specification] {
                let name = match entry.attr_value(at) {
                    Some(gimli::AttributeValue::UnitRef(offset)) => unit
                        .entry(offset)
                        .ok()
                        .and_then(|origin| self.name(unit, &origin, depth + 1)),
                    Some(gimli::AttributeValue::DebugInfoRef(offset)) => {
                        self.name_at(offset.0, depth + 1)
                    }
                    _ => None,
                };
                if name.is_some() {
                    return name;
                }
            }
        }
        let v = entry.attr_value(gimli::DW_AT_name)?;
        let text = String::from_utf8_lossy(&self.string(unit, v)?).into_owned();
        Some(Name {
            text,
            qualified: false,
        })
    }

    /// A string attribute's bytes. One in `.debug_str` (what rustc writes for names) is read
    /// from the file, not through the mapping ([`Module::string_at`]): a first touch of a page
    /// maps 64 KiB around it, and names are scattered over the section. Others are read in
    /// place, and their pages handed back at once (see [`RELEASE_EVERY`]).
    fn string(&self, unit: gimli::UnitRef<'_, R>, v: gimli::AttributeValue<R>) -> Option<Vec<u8>> {
        if let gimli::AttributeValue::DebugStrRef(offset) = v {
            let section = gimli::Section::reader(&self.dwarf.debug_str).slice();
            return Some(self.module.string_at(section.get(offset.0..)?));
        }
        let s = unit.attr_string(v).ok()?.slice().to_vec();
        self.module.release();
        Some(s)
    }

    /// The name of the function whose entry is at `offset` in `.debug_info`.
    fn name_at(&mut self, offset: usize, depth: u32) -> Option<Name> {
        // A unit parsed in this batch first: finding one anew reads headers forward.
        let parsed = self.units.iter().find_map(|(&start, unit)| {
            (start <= offset && offset < start + unit.header.length_including_self())
                .then_some(start)
        });
        let start = match parsed {
            Some(start) => start,
            None => self.module.units.at(offset, self.dwarf)?,
        };
        if !self.units.contains_key(&start) {
            let header = self
                .dwarf
                .debug_info
                .header_from_offset(gimli::DebugInfoOffset(start))
                .ok()?;
            let mut unit = self.dwarf.unit(header).ok()?;
            // Kept while the walk goes on, for names only: not its line program's header
            // (thousands of file entries in a big unit).
            unit.line_program = None;
            self.units.insert(start, Arc::new(unit));
        }
        // A handle of its own: the recursion may add units to the map.
        let unit = Arc::clone(self.units.get(&start)?);
        let at = gimli::DebugInfoOffset(offset).to_unit_offset(&unit.header)?;
        let entry = unit.entry(at).ok()?;
        self.name(unit.unit_ref(self.dwarf), &entry, depth)
    }
}
