//! A module's function table, from its ELF symbol table: which function an address is in, and
//! its name.
//!
//! A function is 16 bytes (start, size and where its name is in the table's strings): loading
//! the table reads no name but those of aliases, and the name is read when an address is looked
//! up. The table is read in two passes (count, then fill a vector of exactly that size), and
//! the file's pages go back as it goes: loading is the first export's peak of memory.

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
pub(super) struct Functions {
    list: Vec<Function>,
    strings: object::read::StringTable<'static, &'static [u8]>,
}

impl Functions {
    /// The functions of `obj`'s symbol table (`dynamic`: its dynamic one), handing the file's
    /// pages back with `release` as it reads.
    pub(super) fn read(
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

    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The function containing `svma` (a module address): its start and its symbol's name, as
    /// the table has it (mangled). `None` also when that name cannot be read.
    pub(super) fn at(&self, svma: u64) -> Option<(u64, &'static [u8])> {
        let list = &self.list;
        let f = list.get(list.partition_point(|f| f.start <= svma).checked_sub(1)?)?;
        let inside = svma - f.start < u64::from(f.size) || f.size == 0;
        inside.then(|| Some((f.start, self.name(f)?)))?
    }

    fn name(&self, f: &Function) -> Option<&'static [u8]> {
        self.strings.get(f.name).ok()
    }

    /// Names the function at `start` with the symbol of `obj` called `name` (tests: the alias
    /// a linker may list first for folded functions).
    #[cfg(test)]
    pub(super) fn rename(
        &mut self,
        start: u64,
        name: &[u8],
        obj: &object::File<'static, &'static [u8]>,
    ) {
        use object::{Object, ObjectSymbol};
        let strings = self.strings;
        let offset = obj.symbols().find_map(|s| {
            let at = s.name_bytes().ok().filter(|n| *n == name)?.as_ptr();
            // The name's offset in the string table, from where the table says its first
            // string (offset 0, the empty one) is.
            let base = strings.get(0).ok()?.as_ptr();
            u32::try_from((at as usize).checked_sub(base as usize)?).ok()
        });
        for f in self.list.iter_mut().filter(|f| f.start == start) {
            f.name = offset.expect("the name is in the symbol table");
        }
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use object::{Object, ObjectSymbol};
    use std::collections::HashMap;

    /// The function table, read through symbol-table offsets, agrees with `object`'s own
    /// reading of every text symbol: one function per address, named by one of the names the
    /// symbol table gives that address, and the largest of them.
    #[test]
    fn functions_agree_with_the_symbol_table() {
        let (module, exe) = super::super::elf::test_program();
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
            let (found, name) = module.functions.at(start).expect("a function at its start");
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
                assert_eq!(module.functions.at(last).map(|f| f.0), Some(start));
            }
        }
        // Of aliases, the public name: the fewest leading underscores.
        let underscores = |n: &[u8]| n.iter().take_while(|&&b| b == b'_').count();
        for (&start, symbols) in by_start.iter().filter(|(_, s)| s.len() > 1) {
            let (_, name) = module.functions.at(start).unwrap();
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
}
