//! SQLite's memory through Rust's global allocator.
//!
//! In musl builds (retie's default, ADR 0416) the binary's global
//! allocator is dlmalloc, while SQLite's C code would call musl's own
//! malloc, which spreads small allocations over more fresh pages: every
//! first touch of a page is a fault, about 2 µs on a VM. [`install`] hands
//! SQLite allocation functions that go through `std::alloc` instead, so the
//! whole process shares one heap. It must run before SQLite initializes
//! (the first connection's open): every open in this crate calls it first.
//! If SQLite was initialized already (another crate opened a connection
//! first), the call is refused and SQLite keeps its own malloc, which is
//! slower here but as correct.
//!
//! Each block carries its size in a 16-byte header, which `xSize` and
//! `xFree` read back; blocks are 16-byte aligned (SQLite needs 8).

use std::alloc::Layout;
use std::ffi::{c_int, c_void};

use rusqlite::ffi;

/// The header before each block: its usable size, and the alignment.
const HEADER: usize = 16;

/// The layout of a block of `n` usable bytes with its header.
fn layout(n: usize) -> Option<Layout> {
    Layout::from_size_align(n.checked_add(HEADER)?, HEADER).ok()
}

/// `xMalloc`: a block of `n` bytes, or NULL.
unsafe extern "C" fn x_malloc(n: c_int) -> *mut c_void {
    let Some(l) = usize::try_from(n).ok().filter(|n| *n > 0).and_then(layout) else {
        return std::ptr::null_mut();
    };
    // SAFETY: `l` has a non-zero size (at least the header).
    let base = unsafe { std::alloc::alloc(l) };
    if base.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `base` is a fresh block of at least HEADER bytes, 16-byte
    // aligned: its first 8 bytes hold the size, and the caller's part
    // starts HEADER bytes in, inside the block.
    unsafe {
        base.cast::<usize>().write(l.size() - HEADER);
        base.add(HEADER).cast()
    }
}

/// The base of a block `p` returned by `x_malloc`/`x_realloc`, and its
/// usable size.
///
/// # Safety
/// `p` must be a live block from this module.
unsafe fn block(p: *mut c_void) -> (*mut u8, usize) {
    // SAFETY: `p` is HEADER bytes into a block whose first word holds the
    // usable size (the caller's promise).
    unsafe {
        let base = p.cast::<u8>().sub(HEADER);
        (base, base.cast::<usize>().read())
    }
}

/// `xFree`.
unsafe extern "C" fn x_free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // SAFETY: SQLite frees only blocks its allocator gave it: ours.
    let (base, n) = unsafe { block(p) };
    if let Some(l) = layout(n) {
        // SAFETY: `base` was allocated with exactly this layout.
        unsafe { std::alloc::dealloc(base, l) }
    }
}

/// `xRealloc`: SQLite calls it with a live block and a positive size.
unsafe extern "C" fn x_realloc(p: *mut c_void, n: c_int) -> *mut c_void {
    if p.is_null() {
        // SAFETY: forwarding to xMalloc, which takes any size.
        return unsafe { x_malloc(n) };
    }
    let Some(new) = usize::try_from(n).ok().filter(|n| *n > 0) else {
        return std::ptr::null_mut();
    };
    // SAFETY: a live block of ours (SQLite's contract for xRealloc).
    let (base, old) = unsafe { block(p) };
    let (Some(l), Some(_)) = (layout(old), layout(new)) else {
        return std::ptr::null_mut();
    };
    // SAFETY: `base` was allocated with layout `l`; the new size plus the
    // header does not overflow and fits a Layout (checked above).
    let moved = unsafe { std::alloc::realloc(base, l, new + HEADER) };
    if moved.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `moved` is a block of new + HEADER bytes, 16-byte aligned.
    unsafe {
        moved.cast::<usize>().write(new);
        moved.add(HEADER).cast()
    }
}

/// `xSize`: the usable size of a live block.
unsafe extern "C" fn x_size(p: *mut c_void) -> c_int {
    if p.is_null() {
        return 0;
    }
    // SAFETY: SQLite asks only about blocks of ours.
    let (_, n) = unsafe { block(p) };
    c_int::try_from(n).unwrap_or(c_int::MAX)
}

/// `xRoundup`: what `x_malloc` gives for `n` (exactly `n`; rounded to 8 as
/// SQLite expects of sizes it plans with).
unsafe extern "C" fn x_roundup(n: c_int) -> c_int {
    n.checked_add(7).map_or(n, |m| m & !7)
}

unsafe extern "C" fn x_init(_: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_shutdown(_: *mut c_void) {}

/// Give SQLite the allocator above, once per process, before its first
/// connection. True if SQLite took it.
pub fn install() -> bool {
    use std::sync::OnceLock;
    static TAKEN: OnceLock<bool> = OnceLock::new();
    *TAKEN.get_or_init(|| {
        let methods = ffi::sqlite3_mem_methods {
            xMalloc: Some(x_malloc),
            xFree: Some(x_free),
            xRealloc: Some(x_realloc),
            xSize: Some(x_size),
            xRoundup: Some(x_roundup),
            xInit: Some(x_init),
            xShutdown: Some(x_shutdown),
            pAppData: std::ptr::null_mut(),
        };
        // SAFETY: SQLITE_CONFIG_MALLOC takes one pointer to a
        // sqlite3_mem_methods, which SQLite copies before returning; the
        // functions are valid for the whole process. Before SQLite's
        // initialization the call is allowed; after it, SQLite refuses it
        // (SQLITE_MISUSE) and changes nothing.
        let rc = unsafe {
            ffi::sqlite3_config(
                ffi::SQLITE_CONFIG_MALLOC,
                &methods as *const ffi::sqlite3_mem_methods,
            )
        };
        rc == ffi::SQLITE_OK
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_keep_their_size_and_survive_realloc() {
        // SAFETY: blocks from this module, used within their sizes, each
        // freed once.
        unsafe {
            let p = x_malloc(10);
            assert!(!p.is_null());
            assert_eq!(p as usize % 16, 0);
            assert_eq!(x_size(p), 10);
            p.cast::<u8>().write_bytes(0xab, 10);
            let q = x_realloc(p, 5000);
            assert_eq!(x_size(q), 5000);
            assert_eq!(*q.cast::<u8>().add(9), 0xab);
            x_free(q);
            assert!(x_malloc(0).is_null());
            assert!(x_malloc(-1).is_null());
            assert_eq!(x_roundup(13), 16);
        }
    }
}
