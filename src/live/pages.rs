//! The live index's table memory, on huge pages where the kernel gives them. The default table is 12 MiB:
//! in 4 KiB pages that is 3,072 TLB entries, more than this CPU's second-level TLB holds, so a probe of a set
//! not touched lately paid a page walk before its cache miss. Linux backs a 2 MiB-aligned region advised
//! `MADV_HUGEPAGE` with 2 MiB pages (also where transparent huge pages are `madvise`-only, the common default);
//! elsewhere, or when the kernel declines, the memory is ordinary and only the alignment differs.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A huge page on x86_64 and aarch64 Linux.
const HUGE: usize = 2 << 20;

/// A fixed-length slice of `T` that owns its allocation (a `Box<[T]>` placed for huge pages).
pub struct Pages<T: Copy> {
    ptr: NonNull<T>,
    len: usize,
    layout: Layout,
}

// SAFETY: `Pages` owns its allocation exclusively, as `Box<[T]>` does; sharing or sending it shares or sends
// only `T`s.
unsafe impl<T: Copy + Send> Send for Pages<T> {}
// SAFETY: as above; `&Pages` hands out only `&[T]`.
unsafe impl<T: Copy + Sync> Sync for Pages<T> {}

impl<T: Copy> Pages<T> {
    /// `len` copies of `value`. Regions of a huge page or more are aligned to one and advised as huge pages.
    pub fn filled(len: usize, value: T) -> Pages<T> {
        let size = len
            .checked_mul(size_of::<T>())
            .expect("table size overflows");
        let align = if size >= HUGE { HUGE } else { align_of::<T>() };
        let layout =
            Layout::from_size_align(size.next_multiple_of(align), align).expect("table layout");
        if layout.size() == 0 {
            return Pages {
                ptr: NonNull::dangling(),
                len,
                layout,
            };
        }
        // SAFETY: the layout's size is nonzero (checked above).
        let raw = unsafe { alloc(layout) }.cast::<T>();
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(layout)
        };
        #[cfg(target_os = "linux")]
        if align == HUGE {
            // SAFETY: the range is exactly the allocation just made (page-aligned, as HUGE is a multiple of the
            // page size); MADV_HUGEPAGE only changes how the kernel backs it, never its contents. A refusal
            // (a kernel without THP) leaves ordinary pages, so the result is ignored.
            unsafe { libc::madvise(raw.cast(), layout.size(), libc::MADV_HUGEPAGE) };
        }
        for i in 0..len {
            // SAFETY: `i < len` and the allocation holds `len` `T`s (`size <= layout.size()`), aligned for `T`
            // (`align` is `T`'s or HUGE, a multiple of it).
            unsafe { ptr.as_ptr().add(i).write(value) };
        }
        Pages { ptr, len, layout }
    }
}

impl<T: Copy> Deref for Pages<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` points to `len` initialised `T`s this value owns (or is dangling with `len * size_of::<T>()
        // == 0`), borrowed for as long as `self` is.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> DerefMut for Pages<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> Drop for Pages<T> {
    fn drop(&mut self) {
        if self.layout.size() != 0 {
            // SAFETY: allocated in `filled` with this layout and not freed before; `T: Copy` has no drop.
            unsafe { dealloc(self.ptr.as_ptr().cast(), self.layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_holds_its_values_at_any_size() {
        for len in [0, 1, 7, HUGE / 64 - 1, 3 * HUGE / 64 + 5] {
            let mut p = Pages::filled(len, [9u64; 8]);
            assert_eq!(p.len(), len);
            assert!(p.iter().all(|v| *v == [9; 8]));
            if let Some(last) = p.last_mut() {
                last[0] = 1;
            }
            assert!(len == 0 || p[len - 1][0] == 1);
            if len * 64 >= HUGE {
                assert_eq!(p.as_ptr() as usize % HUGE, 0);
            }
        }
    }
}
