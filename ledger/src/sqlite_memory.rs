//! SQLite's memory through Rust's global allocator.
//!
//! In musl builds (retie's default, ADR 0416) the binary's global
//! allocator is dlmalloc, while SQLite's C code would call musl's own
//! malloc, which spreads small allocations over more fresh pages: every
//! first touch of a page is a fault, about 2 µs on a VM. [`install`] hands
//! SQLite allocation functions that go through `std::alloc` instead, so the
//! whole process shares one heap.
//!
//! `sqlite3_config` is not thread-safe: [`install`] must run while the
//! process has one thread and before any connection is opened, which is
//! what the binaries' `main` does first. A process that never calls it
//! (a test binary, a library user) keeps SQLite's own malloc throughout,
//! which is as correct. Called after SQLite initialized, it is refused and
//! changes nothing.
//!
//! Each block carries its size in a 16-byte header, which `xSize` and
//! `xFree` read back; blocks are 16-byte aligned (SQLite needs 8), and
//! sizes are rounded up to 8 as in SQLite's own `mem1.c`, so `xSize` of a
//! block is `xRoundup` of the size asked for.

use std::alloc::Layout;
use std::ffi::{c_int, c_void};

use rusqlite::ffi;

/// The header before each block: its usable size, and the alignment.
const HEADER: usize = 16;

/// `n` rounded up to a multiple of 8 (None on overflow or n <= 0).
fn rounded(n: c_int) -> Option<usize> {
    let n = usize::try_from(n).ok().filter(|n| *n > 0)?;
    Some(n.checked_add(7)? & !7)
}

/// The layout of a block of `n` usable bytes with its header.
fn layout(n: usize) -> Option<Layout> {
    Layout::from_size_align(n.checked_add(HEADER)?, HEADER).ok()
}

/// `xMalloc`: a block of `n` bytes, or NULL.
unsafe extern "C" fn x_malloc(n: c_int) -> *mut c_void {
    let Some(l) = rounded(n).and_then(layout) else {
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
    let Some(new) = rounded(n) else {
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

/// `xRoundup`: what `x_malloc` gives for `n`.
unsafe extern "C" fn x_roundup(n: c_int) -> c_int {
    rounded(n)
        .and_then(|r| c_int::try_from(r).ok())
        .unwrap_or(n)
}

unsafe extern "C" fn x_init(_: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_shutdown(_: *mut c_void) {}

/// Give SQLite the allocator above, once per process. True if SQLite
/// took it.
///
/// # Safety
///
/// The process must have exactly one thread when this is called, and no
/// SQLite connection may have been opened yet: `sqlite3_config` is not
/// thread-safe (see the module's note). `main` calls it first thing.
pub unsafe fn install() -> bool {
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
            assert_eq!(x_size(p), 16, "rounded up to 8");
            assert_eq!(x_size(p), x_roundup(10));
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
