//! Where the KV cache's bytes live: chunks of large anonymous regions that ask the kernel for
//! huge pages, instead of the heap.
//!
//! Attention at long contexts visits every (block, layer) of every sequence each step, and each
//! holds its codes and scales in buffers of a hundred bytes to a few KiB. On the heap they lay
//! among everything else on 4 KiB pages: hundreds of MB of cache against a TLB that covers a few
//! MB, and `perf` put the walk's stalls on its prefetches of the next block. Here they lie in
//! 32 MiB regions advised `MADV_HUGEPAGE`, where a TLB entry covers 2 MiB, packed by size.
//! Measured at 8 x 4,096 positions (`bench/RESULTS.md`): +5-11% decode with int4 blocks
//! (about half of it from the packing alone), +4-7% with f16 ones (all of it from the huge
//! pages). Where the kernel gives no huge pages (THP `never`, not Linux), the packing is what
//! is left.
//!
//! Each region holds chunks of one size (a model has a handful: f16, int8 and int4 codes and
//! their scales), handed out from the region that last got a hole, else from an untouched end. A
//! region whose last chunk goes is unmapped: the pool frees storage seldom (a finished request's
//! blocks stay indexed for the next prompt), so this is rare, and an idle engine holds no empty
//! regions. A region in use stays mapped whole, as pages of a heap do.

use std::collections::{BTreeMap, HashMap};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Mutex;

/// Bytes of one region's chunks (it maps a huge page more, to align them).
const REGION_BYTES: usize = 32 << 20;
const HUGE_PAGE: usize = 2 << 20;
/// Chunks start on cache lines, so that no two buffers share one.
const ALIGN: usize = 64;

struct Region {
    /// Kept for its mapping: dropping it unmaps the region.
    _map: memmap2::MmapMut,
    chunk: usize,
    /// Chunks handed out from the untouched end so far.
    bumped: usize,
    free: Vec<usize>,
    live: usize,
    /// Listed in its size's `Arena::open`.
    open: bool,
}

impl Region {
    fn capacity(&self) -> usize {
        REGION_BYTES / self.chunk
    }

    fn has_room(&self) -> bool {
        !self.free.is_empty() || self.bumped < self.capacity()
    }
}

/// The regions, by the address of their first chunk.
#[derive(Default)]
struct Arena {
    regions: BTreeMap<usize, Region>,
    /// Per chunk size, the regions of that size with room, the next to serve last: a region
    /// that gets a hole goes last, so holes are filled before untouched room.
    open: HashMap<usize, Vec<usize>>,
}

impl Arena {
    /// A chunk of `bytes` (rounded up to cache lines); `None` when no region can be mapped.
    fn alloc(&mut self, bytes: usize) -> Option<NonNull<u8>> {
        let chunk = bytes.max(1).next_multiple_of(ALIGN);
        if chunk > REGION_BYTES {
            return None;
        }
        let open = self.open.entry(chunk).or_default();
        let base = match open.last() {
            Some(&base) => base,
            None => {
                let mut map = memmap2::MmapMut::map_anon(REGION_BYTES + HUGE_PAGE).ok()?;
                #[cfg(target_os = "linux")]
                let _ = map.advise(memmap2::Advice::HugePage); // a hint: THP may be off
                let base = (map.as_mut_ptr() as usize).next_multiple_of(HUGE_PAGE);
                let region = Region { _map: map, chunk, bumped: 0, free: Vec::new(), live: 0, open: true };
                self.regions.insert(base, region);
                open.push(base);
                base
            }
        };
        let r = self.regions.get_mut(&base).expect("an open region");
        let index = r.free.pop().unwrap_or_else(|| {
            r.bumped += 1;
            r.bumped - 1
        });
        r.live += 1;
        if !r.has_room() {
            r.open = false;
            open.pop();
        }
        NonNull::new((base + index * chunk) as *mut u8)
    }

    /// Gives back a chunk `alloc` returned.
    fn free(&mut self, ptr: NonNull<u8>) {
        let at = ptr.as_ptr() as usize;
        let (&base, r) = self.regions.range_mut(..=at).next_back().expect("a chunk of a region");
        r.free.push((at - base) / r.chunk);
        r.live -= 1;
        let open = self.open.entry(r.chunk).or_default();
        if r.live == 0 {
            if r.open {
                open.retain(|&b| b != base);
            }
            self.regions.remove(&base);
        } else if !r.open {
            r.open = true;
            open.push(base);
        }
    }

    #[cfg(test)]
    fn regions_of(&self, bytes: usize) -> usize {
        self.regions.values().filter(|r| r.chunk == bytes.next_multiple_of(ALIGN)).count()
    }
}

static ARENA: Mutex<Option<Arena>> = Mutex::new(None);

fn with_arena<R>(f: impl FnOnce(&mut Arena) -> R) -> R {
    // A panic elsewhere while the lock was held leaves the arena consistent: every method
    // changes it only after its last fallible step.
    let mut guard = ARENA.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(Arena::default))
}

/// An owned, fixed-length buffer of KV codes or scales in the arena; reads as a slice.
pub struct KvBuf<T: Copy> {
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: a `KvBuf` owns its chunk alone, like a `Box<[T]>`.
unsafe impl<T: Copy + Send> Send for KvBuf<T> {}
unsafe impl<T: Copy + Sync> Sync for KvBuf<T> {}

impl<T: Copy> KvBuf<T> {
    fn uninit(len: usize) -> Self {
        const { assert!(std::mem::align_of::<T>() <= ALIGN) };
        let bytes = len * std::mem::size_of::<T>();
        let ptr = with_arena(|a| a.alloc(bytes)).unwrap_or_else(|| {
            std::alloc::handle_alloc_error(std::alloc::Layout::from_size_align(bytes.max(1), ALIGN).unwrap())
        });
        KvBuf { ptr: ptr.cast(), len }
    }

    /// `len` elements, every byte zero.
    pub fn zeroed(len: usize) -> Self {
        let b = Self::uninit(len);
        // SAFETY: the chunk holds `len` elements; all-zero bytes are a value of the plain
        // numbers stored here (f16, i8, u8).
        unsafe { std::ptr::write_bytes(b.ptr.as_ptr(), 0, len) };
        b
    }
}

impl<T: Copy> From<&[T]> for KvBuf<T> {
    fn from(v: &[T]) -> Self {
        let b = Self::uninit(v.len());
        // SAFETY: the chunk holds `v.len()` elements and is no part of `v`.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), b.ptr.as_ptr(), v.len()) };
        b
    }
}

impl<T: Copy> FromIterator<T> for KvBuf<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<Vec<T>>().as_slice())
    }
}

impl<T: Copy> Deref for KvBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` holds `len` initialized elements for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> DerefMut for KvBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> Drop for KvBuf<T> {
    fn drop(&mut self) {
        with_arena(|a| a.free(self.ptr.cast()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_distinct_aligned_and_reused_and_empty_regions_are_unmapped() {
        let mut a = Arena::default();
        let bytes = 1000; // a 1,024-byte chunk: 32,768 to a region
        let per_region = REGION_BYTES / 1024;
        let chunks: Vec<NonNull<u8>> = (0..per_region + 10).map(|_| a.alloc(bytes).unwrap()).collect();
        assert_eq!(a.regions_of(bytes), 2, "one region full, a second one begun");
        let mut addrs: Vec<usize> = chunks.iter().map(|p| p.as_ptr() as usize).collect();
        assert!(addrs.iter().all(|p| p % ALIGN == 0));
        addrs.sort_unstable();
        assert!(addrs.windows(2).all(|w| w[1] - w[0] >= 1024), "no two chunks overlap");
        // A freed chunk is the next one handed out.
        a.free(chunks[5]);
        assert_eq!(a.alloc(bytes), Some(chunks[5]));
        // Another size never shares a region with this one.
        let other = a.alloc(64).unwrap();
        assert_eq!((a.regions_of(64), a.regions_of(bytes)), (1, 2));
        // A region goes when its last chunk does, not before.
        chunks[..per_region].iter().for_each(|&p| a.free(p));
        assert_eq!(a.regions_of(bytes), 1, "the first region emptied and went");
        chunks[per_region..].iter().for_each(|&p| a.free(p));
        assert_eq!((a.regions_of(bytes), a.regions.len()), (0, 1), "only the other size's region is left");
        a.free(other);
        assert!(a.regions.is_empty());
        let again = a.alloc(bytes).unwrap();
        assert_eq!(a.regions_of(bytes), 1, "a new region for the next chunk");
        a.free(again);
    }

    #[test]
    fn any_order_of_allocs_and_frees_keeps_live_chunks_apart_and_ends_with_nothing_mapped() {
        let mut a = Arena::default();
        // Chunks big enough that a few hundred span several regions.
        let sizes = [3 << 20, 5 << 20];
        let mut live: Vec<(usize, usize)> = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as usize
        };
        for _ in 0..2000 {
            if live.is_empty() || next() % 3 != 0 {
                let size = sizes[next() % 2];
                live.push((a.alloc(size).unwrap().as_ptr() as usize, size));
            } else {
                let (p, _) = live.swap_remove(next() % live.len());
                a.free(NonNull::new(p as *mut u8).unwrap());
            }
            if live.len() > 60 {
                let (p, _) = live.swap_remove(next() % live.len());
                a.free(NonNull::new(p as *mut u8).unwrap());
            }
        }
        let mut spans = live.clone();
        spans.sort_unstable();
        assert!(spans.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0), "live chunks overlap");
        // Every region still mapped holds a live chunk of its size.
        for (&base, r) in &a.regions {
            assert!(live
                .iter()
                .any(|&(p, s)| p >= base && p < base + REGION_BYTES && s.next_multiple_of(ALIGN) == r.chunk));
        }
        live.iter().for_each(|&(p, _)| a.free(NonNull::new(p as *mut u8).unwrap()));
        assert!(a.regions.is_empty() && a.open.values().all(Vec::is_empty));
    }

    #[test]
    fn buffers_read_back_what_was_written_and_zeroed_ones_are_zero_after_reuse() {
        let data: Vec<u16> = (0..777).collect();
        let b = KvBuf::from(data.as_slice());
        assert_eq!(&b[..], &data[..]);
        drop(b);
        // The same size again, likely the chunk just freed: zeroed clears it.
        let mut z = KvBuf::<u16>::zeroed(777);
        assert!(z.iter().all(|&x| x == 0));
        z[776] = 9;
        assert_eq!(z.iter().map(|&x| x as u32).sum::<u32>(), 9);
        let collected: KvBuf<i8> = (0..5).map(|x| x as i8 - 2).collect();
        assert_eq!(&collected[..], &[-2, -1, 0, 1, 2]);
    }
}
