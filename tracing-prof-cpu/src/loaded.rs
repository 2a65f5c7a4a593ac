//! The loaded modules (the program, its shared libraries, the vDSO) as the dynamic loader
//! lists them: for the DWARF unwinder of this crate (`modules.rs`) and for core's symbolizer,
//! one list read one way.

use std::ffi::{CStr, c_void};
use std::ops::Range;

/// What `dl_iterate_phdr` says about one loaded module (the program, a shared library, the
/// vDSO). Ranges are as stated in the module: add `bias` for addresses in memory.
#[derive(Clone, Debug, Default)]
pub struct LoadedModule {
    /// Its path as the loader names it: empty for the program itself (the first module).
    pub name: String,
    /// Where it is loaded: its addresses in memory minus its stated addresses.
    pub bias: u64,
    /// Its executable `PT_LOAD` segments, from the lowest start to the highest end.
    pub text: Option<Range<u64>>,
    /// Its `PT_GNU_EH_FRAME` segment (`.eh_frame_hdr`).
    pub eh_frame_hdr: Option<Range<u64>>,
    /// Its `PT_LOAD` segments, the first [`MAX_SEGMENTS`] of them.
    pub segments: Vec<Range<u64>>,
}

/// Modules read per call; more are left out (unwound with frame pointers, and not
/// symbolized). The callback copies each into a fixed array on the caller's stack (32 bytes a
/// module), so that it never allocates while the loader's lock is held.
pub const MAX_MODULES: usize = 512;
/// Loaded segments kept per module (a program or library has two to four).
pub const MAX_SEGMENTS: usize = 8;

/// One module as the callback copies it: plain data, so the callback never allocates while
/// the loader's lock is held.
#[derive(Clone, Copy)]
struct Raw {
    name: *const libc::c_char,
    bias: u64,
    phdr: *const libc::Elf64_Phdr,
    phnum: usize,
}

/// Every loaded module (at most [`MAX_MODULES`]), in the loader's order, the program first;
/// and the loader's count of modules added and removed, which changes when the set does. For
/// the DWARF unwinder here and for core's symbolizer. Not for a signal handler: it allocates
/// (after the loader's lock is released).
pub fn loaded_modules() -> (Vec<LoadedModule>, u64) {
    struct State {
        raw: [Raw; MAX_MODULES],
        n: usize,
        generation: u64,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: `dl_iterate_phdr` passes a valid `dl_phdr_info` for the duration of the
        // call, and `data` is the `&mut State` that `loaded_modules` passed.
        let (info, state) = unsafe { (&*info, &mut *data.cast::<State>()) };
        state.generation = info.dlpi_adds.wrapping_add(info.dlpi_subs);
        if state.n < MAX_MODULES {
            state.raw[state.n] = Raw {
                name: info.dlpi_name,
                bias: info.dlpi_addr,
                phdr: info.dlpi_phdr.cast(),
                phnum: info.dlpi_phnum.into(),
            };
            state.n += 1;
        }
        0
    }
    let empty = Raw {
        name: std::ptr::null(),
        bias: 0,
        phdr: std::ptr::null(),
        phnum: 0,
    };
    let mut state = State {
        raw: [empty; MAX_MODULES],
        n: 0,
        generation: 0,
    };
    // SAFETY: `visit` matches the callback contract, never unwinds and never allocates;
    // `state` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut state).cast()) };
    let found = state.raw[..state.n]
        .iter()
        .map(|r| {
            let name = if r.name.is_null() {
                String::new()
            } else {
                // SAFETY: a non-null `dlpi_name` is a NUL-terminated string owned by the
                // loader, valid while the module stays loaded.
                unsafe { CStr::from_ptr(r.name) }
                    .to_string_lossy()
                    .into_owned()
            };
            let headers: &[libc::Elf64_Phdr] = if r.phdr.is_null() {
                &[]
            } else {
                // SAFETY: `dlpi_phdr` points to `dlpi_phnum` program headers of a loaded
                // object, mapped for as long as it stays loaded.
                unsafe { std::slice::from_raw_parts(r.phdr, r.phnum) }
            };
            let mut f = LoadedModule {
                name,
                bias: r.bias,
                ..LoadedModule::default()
            };
            for h in headers {
                let range = h.p_vaddr..h.p_vaddr.saturating_add(h.p_memsz);
                match h.p_type {
                    libc::PT_LOAD => {
                        if h.p_flags & libc::PF_X != 0 {
                            f.text = Some(match f.text.take() {
                                Some(t) => t.start.min(range.start)..t.end.max(range.end),
                                None => range.clone(),
                            });
                        }
                        if f.segments.len() < MAX_SEGMENTS {
                            f.segments.push(range);
                        }
                    }
                    libc::PT_GNU_EH_FRAME => f.eh_frame_hdr = Some(range),
                    _ => {}
                }
            }
            f
        })
        .collect();
    (found, state.generation)
}
