//! The loaded modules (the program, its shared libraries, the vDSO) and their unwind tables,
//! found with `dl_iterate_phdr` **off the signal path**, for the DWARF unwinder.
//!
//! Each module's `.eh_frame_hdr` (its `PT_GNU_EH_FRAME` segment: a sorted table of functions)
//! and `.eh_frame` (the call frame information it indexes) are used in place, in the memory the
//! dynamic loader mapped: nothing is copied or parsed ahead of time beyond finding them. The
//! unwinder built from them is published through an atomic pointer and never freed, so a
//! signal handler that loaded it can use it for as long as it runs; a new one is built when
//! the set of loaded modules changes (`dlopen`), and the old one is leaked (a few hundred
//! bytes per module). A module unloaded with `dlclose` while the profiler runs leaves its
//! tables unmapped: see the crate docs.

use crate::loaded::{LoadedModule, loaded_modules};
use framehop::{ExplicitModuleSectionInfo, MustNotAllocateDuringUnwind, Unwinder as _};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// Memory the loader mapped, for as long as the module stays loaded.
#[derive(Default)]
pub(crate) struct Mapped(&'static [u8]);

impl std::ops::Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0
    }
}

pub(crate) type Unwinder = framehop::UnwinderNative<Mapped, MustNotAllocateDuringUnwind>;
pub(crate) type Cache = framehop::CacheNative<MustNotAllocateDuringUnwind>;

/// The unwinder in use (null: none yet; frame pointers are used then).
static UNWINDER: AtomicPtr<Unwinder> = AtomicPtr::new(std::ptr::null_mut());
/// `dlpi_adds + dlpi_subs` when the unwinder was built, to see when modules change.
static LOADED: AtomicU64 = AtomicU64::new(u64::MAX);

/// The unwinder, for the signal handler.
pub(crate) fn unwinder() -> Option<&'static Unwinder> {
    let p = UNWINDER.load(Ordering::Acquire);
    // SAFETY: UNWINDER holds null or a leaked, never-freed, fully built Unwinder.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Where `.eh_frame` starts, from the `eh_frame_ptr` field of `.eh_frame_hdr` at `hdr_avma`.
fn eh_frame_start(hdr: &[u8], hdr_avma: u64) -> Option<u64> {
    const DW_EH_PE_OMIT: u8 = 0xff;
    let (version, enc) = (*hdr.first()?, *hdr.get(1)?);
    if version != 1 || enc == DW_EH_PE_OMIT {
        return None;
    }
    let field = hdr.get(4..)?;
    let read = |n: usize| -> Option<[u8; 8]> {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(field.get(..n)?);
        Some(b)
    };
    let value: i64 = match enc & 0x0f {
        0x00 | 0x04 | 0x0c => i64::from_le_bytes(read(8)?), // absptr, udata8, sdata8
        0x03 => i64::from(u32::from_le_bytes(read(4)?[..4].try_into().ok()?)), // udata4
        0x0b => i64::from(i32::from_le_bytes(read(4)?[..4].try_into().ok()?)), // sdata4
        _ => return None,
    };
    let base = match enc & 0x70 {
        0x00 => 0,
        0x10 => hdr_avma + 4, // pcrel: from the field itself
        0x30 => hdr_avma,     // datarel: from the start of .eh_frame_hdr
        _ => return None,
    };
    Some(base.wrapping_add_signed(value))
}

/// A framehop module for `f`, or `None` when it has no usable unwind tables.
fn module(f: &LoadedModule) -> Option<framehop::Module<Mapped>> {
    let text = f.text.clone()?;
    let hdr_svma = f.eh_frame_hdr.clone()?;
    let hdr_len = usize::try_from(hdr_svma.end - hdr_svma.start).ok()?;
    let hdr_avma = f.bias.wrapping_add(hdr_svma.start);
    // SAFETY: the PT_GNU_EH_FRAME segment of a loaded module is mapped readable at its load
    // address for `p_memsz` bytes, for as long as the module stays loaded.
    let hdr: &'static [u8] = unsafe { std::slice::from_raw_parts(hdr_avma as *const u8, hdr_len) };
    let eh_frame_avma = eh_frame_start(hdr, hdr_avma)?;
    let eh_frame_svma = eh_frame_avma.wrapping_sub(f.bias);
    // `.eh_frame` runs to the end of the segment that holds it at most.
    let segment = f.segments.iter().find(|s| s.contains(&eh_frame_svma))?;
    let eh_len = usize::try_from(segment.end - eh_frame_svma).ok()?;
    // SAFETY: that range lies within a PT_LOAD segment of a loaded module, which the loader
    // mapped for `p_memsz` bytes; segments holding `.eh_frame` are readable.
    let eh_frame: &'static [u8] =
        unsafe { std::slice::from_raw_parts(eh_frame_avma as *const u8, eh_len) };
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: Some(text.clone()),
        eh_frame_svma: Some(eh_frame_svma..segment.end),
        eh_frame: Some(Mapped(eh_frame)),
        eh_frame_hdr_svma: Some(hdr_svma),
        eh_frame_hdr: Some(Mapped(hdr)),
        ..ExplicitModuleSectionInfo::default()
    };
    let avma = f.bias.wrapping_add(text.start)..f.bias.wrapping_add(text.end);
    Some(framehop::Module::new(f.name.clone(), avma, f.bias, info))
}

/// Builds a new unwinder when the loaded modules changed since the last one (or there is
/// none yet), and publishes it. Returns the number of modules with unwind tables.
pub(crate) fn refresh() -> usize {
    let (found, generation) = loaded_modules();
    if LOADED.load(Ordering::Relaxed) == generation && !UNWINDER.load(Ordering::Acquire).is_null() {
        return unwinder().map_or(0, |_| found.len());
    }
    let mut u = Unwinder::new();
    let mut n = 0;
    for m in found.iter().filter_map(module) {
        u.add_module(m);
        n += 1;
    }
    // Leaked on purpose: a handler may be using the previous one right now.
    let new = Box::into_raw(Box::new(u));
    UNWINDER.store(new, Ordering::Release);
    LOADED.store(generation, Ordering::Relaxed);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_program_has_unwind_tables() {
        let (found, _) = loaded_modules();
        assert!(found[0].name.is_empty(), "the program comes first");
        assert!(module(&found[0]).is_some(), "{:?}", found[0]);
        assert!(refresh() >= 2, "the program and libc at least");
    }

    #[test]
    fn eh_frame_pointers_decode() {
        // version 1, pcrel|sdata4, then -0x100 from the field at hdr+4.
        let hdr = [1u8, 0x1b, 0x03, 0x3b, 0x00, 0xff, 0xff, 0xff];
        assert_eq!(eh_frame_start(&hdr, 0x1000), Some(0x1004 - 0x100));
        assert_eq!(eh_frame_start(&[2, 0x1b, 0, 0, 0, 0, 0, 0], 0), None);
    }
}
