//! The running program: its path and GNU build id, for the profiles' `File:` and `Build ID:`
//! lines (and for `go tool pprof` to name the files it saves after the service).

use std::sync::OnceLock;
use tracing_prof_model::Binary;

/// The running program, read once.
pub(crate) fn current() -> Option<Binary> {
    static BINARY: OnceLock<Option<Binary>> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            let _profiler = tracing_prof_alloc::TagGuard::new(tracing_prof_alloc::Tag::PROFILER);
            let path = std::env::current_exe().ok()?;
            Some(Binary::new(path.to_string_lossy(), build_id()))
        })
        .clone()
}

/// The GNU build id of the main program, from its `PT_NOTE` segments.
#[cfg(target_os = "linux")]
fn build_id() -> Option<String> {
    use std::ffi::c_void;

    const NT_GNU_BUILD_ID: u32 = 3;

    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        out: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: `dl_iterate_phdr` passes a valid `dl_phdr_info` for the duration of the call,
        // and `out` is the `&mut Option<String>` that `build_id` passed.
        let (info, out) = unsafe { (&*info, &mut *out.cast::<Option<String>>()) };
        // The main program comes first, with an empty name.
        // SAFETY: `dlpi_phdr` points to `dlpi_phnum` program headers of a loaded object.
        let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
        for h in headers.iter().filter(|h| h.p_type == libc::PT_NOTE) {
            let start = (info.dlpi_addr as usize).wrapping_add(h.p_vaddr as usize);
            // SAFETY: a PT_NOTE segment of a loaded object is mapped and readable for
            // `p_memsz` bytes at its load address.
            let notes =
                unsafe { std::slice::from_raw_parts(start as *const u8, h.p_memsz as usize) };
            if let Some(id) = find_build_id(notes) {
                *out = Some(id);
                break;
            }
        }
        1 // only the first object: the main program
    }

    fn find_build_id(mut notes: &[u8]) -> Option<String> {
        let word = |b: &[u8], i: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?))
        };
        let align4 = |n: usize| (n + 3) & !3;
        while notes.len() >= 12 {
            let (namesz, descsz, kind) = (
                word(notes, 0)? as usize,
                word(notes, 4)? as usize,
                word(notes, 8)?,
            );
            let name_end = 12 + align4(namesz);
            let desc_end = name_end + align4(descsz);
            if desc_end > notes.len() {
                return None;
            }
            if kind == NT_GNU_BUILD_ID && notes.get(12..12 + namesz) == Some(b"GNU\0") {
                let desc = &notes[name_end..name_end + descsz];
                return Some(desc.iter().map(|b| format!("{b:02x}")).collect());
            }
            notes = &notes[desc_end..];
        }
        None
    }

    let mut out: Option<String> = None;
    // SAFETY: `visit` matches the callback contract, never unwinds, and `out` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut out).cast()) };
    out
}

#[cfg(not(target_os = "linux"))]
fn build_id() -> Option<String> {
    None
}
