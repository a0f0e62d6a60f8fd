//! The f16 copies of KV blocks stored below f16: the lower tier that makes promotion exact
//! (spec 002). When a (block, layer) leaves f16, its f16 keys and values are written here;
//! promoting it reads them back instead of widening values that were rounded. On the CPU
//! engine RAM is the memory the levels save, so the tier is a file: an unlinked temporary file
//! (`tempfile`), which the OS removes whatever happens to the process. Its pages live in the
//! OS's page cache, which the kernel can write out and drop, outside the pool's byte budget.
//!
//! The file is cut into slots of one layer block each (keys then values, f16 as in memory),
//! reused once freed.

use crate::kv_arena::KvBuf;
use crate::kv_levels::LayerBlock;
use half::f16;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

pub type Slot = u32;

pub struct Spill {
    file: File,
    /// f16 values of keys (and as many of values) in one layer block.
    elems: usize,
    free: Vec<Slot>,
    /// Slots ever used: the file's length in slots.
    next: Slot,
}

impl Spill {
    /// A spill file in the system's temporary directory for layer blocks of `elems` keys.
    pub fn new(elems: usize) -> io::Result<Self> {
        Ok(Spill { file: tempfile::tempfile()?, elems, free: Vec::new(), next: 0 })
    }

    fn slot_bytes(&self) -> u64 {
        (self.elems * 2 * 2) as u64
    }

    /// Writes an f16 layer block; returns its slot. Anything but f16 is refused.
    pub fn put(&mut self, block: &LayerBlock) -> io::Result<Slot> {
        let LayerBlock::F16 { k, v } = block else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "only f16 blocks are spilled"));
        };
        assert_eq!((k.len(), v.len()), (self.elems, self.elems), "a layer block of this pool");
        let slot = self.free.pop().unwrap_or(self.next);
        let at = u64::from(slot) * self.slot_bytes();
        let written = self.file.write_all_at(bytemuck::cast_slice(k), at);
        if let Err(e) =
            written.and_then(|()| self.file.write_all_at(bytemuck::cast_slice(v), at + self.slot_bytes() / 2))
        {
            if slot != self.next {
                self.free.push(slot);
            }
            return Err(e);
        }
        if slot == self.next {
            self.next += 1;
        }
        Ok(slot)
    }

    /// The f16 layer block in `slot`; the slot stays taken.
    pub fn get(&self, slot: Slot) -> io::Result<LayerBlock> {
        self.read(slot, 0, self.elems)
    }

    /// The f16 keys and values of KV head `kv` (of `kv_heads`) in `slot`, as a layer block of
    /// one head: what recall reads (`kv_recall.rs`). Takes `&self`: attention's tasks read
    /// concurrently, each at its own offsets.
    pub fn get_head(&self, slot: Slot, kv: usize, kv_heads: usize) -> io::Result<LayerBlock> {
        let head = self.elems / kv_heads;
        self.read(slot, kv * head, head)
    }

    /// Keys and values `from..from + n` (of each) in `slot`, as an f16 layer block.
    fn read(&self, slot: Slot, from: usize, n: usize) -> io::Result<LayerBlock> {
        let mut k = KvBuf::<f16>::zeroed(n);
        let mut v = KvBuf::<f16>::zeroed(n);
        let at = u64::from(slot) * self.slot_bytes() + (from * 2) as u64;
        self.file.read_exact_at(bytemuck::cast_slice_mut(&mut k), at)?;
        self.file.read_exact_at(bytemuck::cast_slice_mut(&mut v), at + self.slot_bytes() / 2)?;
        Ok(LayerBlock::F16 { k, v })
    }

    pub fn free(&mut self, slot: Slot) {
        debug_assert!(slot < self.next && !self.free.contains(&slot), "slot {slot} freed twice");
        self.free.push(slot);
    }

    /// Slots holding a copy.
    pub fn held(&self) -> usize {
        self.next as usize - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(seed: f32, elems: usize) -> LayerBlock {
        let k: KvBuf<f16> = (0..elems).map(|i| f16::from_f32(seed + i as f32 * 0.001)).collect();
        let v: KvBuf<f16> = (0..elems).map(|i| f16::from_f32(-seed - i as f32 * 0.002)).collect();
        LayerBlock::F16 { k, v }
    }

    fn same(a: &LayerBlock, b: &LayerBlock) -> bool {
        match (a, b) {
            (LayerBlock::F16 { k: ka, v: va }, LayerBlock::F16 { k: kb, v: vb }) => {
                ka.iter().map(|x| x.to_bits()).eq(kb.iter().map(|x| x.to_bits()))
                    && va.iter().map(|x| x.to_bits()).eq(vb.iter().map(|x| x.to_bits()))
            }
            _ => false,
        }
    }

    #[test]
    fn blocks_come_back_bit_for_bit_and_freed_slots_are_reused() {
        let mut spill = Spill::new(64).unwrap();
        let (a, b, c) = (block(1.0, 64), block(2.0, 64), block(3.0, 64));
        let (sa, sb) = (spill.put(&a).unwrap(), spill.put(&b).unwrap());
        assert_ne!(sa, sb);
        assert!(same(&spill.get(sa).unwrap(), &a) && same(&spill.get(sb).unwrap(), &b));
        spill.free(sa);
        assert_eq!(spill.held(), 1);
        let sc = spill.put(&c).unwrap();
        assert_eq!(sc, sa, "the freed slot is reused");
        assert!(same(&spill.get(sc).unwrap(), &c) && same(&spill.get(sb).unwrap(), &b));
        // One head of two: the second half of each of keys and values.
        let Ok(LayerBlock::F16 { k, v }) = spill.get_head(sb, 1, 2) else { panic!("an f16 head") };
        let LayerBlock::F16 { k: kb, v: vb } = &b else { unreachable!() };
        assert!(k.iter().eq(&kb[32..]) && v.iter().eq(&vb[32..]));
        assert!(spill.put(&LayerBlock::Evicted(None)).is_err());
        assert_eq!(spill.held(), 2);
    }
}
