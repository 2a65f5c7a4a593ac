//! A module's compilation units: which one holds an address (from `.debug_aranges`), and which
//! one holds an offset of `.debug_info` (for names one unit refers to in another).

/// A compilation unit's address range, from `.debug_aranges` (16 bytes).
struct UnitRange {
    start: u64,
    len: u32,
    /// Offset of the unit in `.debug_info`.
    unit: u32,
}

/// A module's compilation units with code.
#[derive(Default)]
pub(super) struct Units {
    /// Their address ranges, sorted, one per run of a unit.
    ranges: Vec<UnitRange>,
    /// Where they start in `.debug_info`, sorted.
    starts: Vec<u32>,
}

impl Units {
    /// The units of a module's `.debug_aranges` section, handing the file's pages back with
    /// `release` as it reads.
    pub(super) fn read(aranges: &'static [u8], release: &dyn Fn()) -> Units {
        let ranges = unit_ranges(aranges, release);
        let mut starts: Vec<u32> = ranges.iter().map(|u| u.unit).collect();
        starts.sort_unstable();
        starts.dedup();
        starts.shrink_to_fit();
        Units { ranges, starts }
    }

    /// The compilation unit whose range holds `svma`.
    pub(super) fn of(&self, svma: u64) -> Option<usize> {
        let i = self.ranges.partition_point(|u| u.start <= svma);
        let u = self.ranges.get(i.checked_sub(1)?)?;
        (svma - u.start < u64::from(u.len)).then_some(u.unit as usize)
    }

    /// Where the compilation unit that holds `offset` of `.debug_info` starts: from the last
    /// unit with code at or before it (known from `.debug_aranges`), the units' headers are
    /// read forward until one reaches past `offset`, as `gimli` lists units (they follow each
    /// other). Units without code (functions only ever inlined elsewhere, whose names other
    /// units refer to) are usually a few headers away; listing every unit from the start reads
    /// a page of each, the whole section.
    pub(super) fn at(
        &self,
        offset: usize,
        dwarf: &gimli::Dwarf<gimli::EndianSlice<'static, gimli::RunTimeEndian>>,
    ) -> Option<usize> {
        let known = &self.starts;
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use object::{Object, ObjectSection};
    use std::collections::HashSet;

    /// An offset in a unit with code is placed in it, and so is every offset of every unit
    /// `gimli` lists (from its first byte to its last), units without code included.
    #[test]
    fn units_are_found_by_offset() {
        let (module, _) = super::super::elf::test_program();
        let dwarf = super::super::dwarf::dwarf_of(&module).expect("debug information");
        assert!(
            module.units.starts.len() > 10,
            "{} units",
            module.units.starts.len()
        );
        for &start in &module.units.starts {
            let start = start as usize;
            let h = dwarf
                .debug_info
                .header_from_offset(gimli::DebugInfoOffset(start))
                .unwrap();
            let end = start + h.length_including_self();
            for offset in [start, start + h.header_size(), end - 1] {
                assert_eq!(module.units.at(offset, &dwarf), Some(start), "{offset:#x}");
            }
        }
        let mut headers = dwarf.units();
        let mut all = 0;
        while let Some(h) = headers.next().unwrap() {
            let start = h.offset().0;
            let end = start + h.length_including_self();
            for offset in [start, end - 1] {
                assert_eq!(module.units.at(offset, &dwarf), Some(start), "{offset:#x}");
            }
            all += 1;
        }
        // Units without code among them: their offsets are reached by reading headers forward.
        assert!(
            all > module.units.starts.len(),
            "{all} units, {} with code",
            module.units.starts.len()
        );
    }

    /// Every range `.debug_aranges` lists finds its own unit, at its first and last byte.
    #[test]
    fn unit_ranges_agree_with_debug_aranges() {
        let (module, exe) = super::super::elf::test_program();
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
                    assert_eq!(module.units.of(r.begin), Some(unit), "{:#x}", r.begin);
                    assert_eq!(module.units.of(r.end - 1), Some(unit), "{:#x}", r.end - 1);
                    ranges += 1;
                    units.insert(unit);
                }
            }
        }
        assert!(ranges > 100, "{ranges} ranges");
        // Consecutive ranges of one unit are one entry.
        assert!(
            module.units.ranges.len() < ranges,
            "{} of {ranges}",
            module.units.ranges.len()
        );
        assert!(module.units.ranges.len() >= units.len());
    }
}
