//! Query-aware recall of evicted blocks (issue 13). Eviction chooses blocks by the attention
//! they received so far, so a fact said once far back goes first, and nothing brings it back
//! when a later question needs it: an evicted block receives no attention, so its importance
//! cannot rise.
//!
//! Where the pool keeps f16 copies (`kv_spill.rs`) and recall is on, an evicted (block, layer)
//! keeps its keys at int4 as an index: 3/16 of its f16 bytes at head_dim 64, counted in the
//! pool's budget; its values and exact keys live only in the copy. Attention (`attention.rs`)
//! scores every query against the index as against an int4 block. Where the block's positions
//! would take at least a share ([`RECALL_SHARE`] by default) of some query's attention, counted
//! over every position it sees, evicted ones by their index, that head's f16 keys and values
//! are read back from the copy for this step and attended exactly; otherwise the block weighs
//! nothing, as evicted. The attention a recalled block receives is recorded like any block's,
//! over a history that eviction shrank to one row per (layer, KV head) (its mean kept), so a
//! few queries that want the block lift its importance and it is among the first the policy
//! promotes once the budget has room (`kv_control.rs`); until then, each step that needs it
//! reads it again (from the page cache, as a rule).
//!
//! Why keys and not a bound: Quest's per-channel minimum and maximum of a block's keys
//! (1/16 of the f16 bytes) bounds every score from above, but on SmolLM2 the bound stood a
//! median 4.7 (scaled) logits above the best held score, so nearly every evicted block passed
//! any share, and ranking blocks by it brought back one of four lost pass keys
//! (`bench/RESULTS.md`). Int4 keys score like the int4 level, which keeps those keys.

use crate::kv_arena::KvBuf;
use crate::kv_cache::BLOCK_TOKENS;
use crate::kv_levels::{int4_keys_into, BlockRows, LayerBlock, Level, RowData};
use half::f16;

/// The default share (`KvPool::enable_recall`): a block is read back when its positions would
/// take at least this share of a query's attention.
pub const RECALL_SHARE: f32 = 0.05;

/// An evicted block's keys at int4, laid out as [`LayerBlock::Int4`]'s keys.
pub struct KeyIndex {
    k: KvBuf<u8>,
    k_scale: KvBuf<f16>,
    k_min: KvBuf<f16>,
}

impl KeyIndex {
    /// The index of an f16 block's keys; `None` for a block at another level.
    pub fn of(block: &LayerBlock, kv_heads: usize, hd: usize) -> Option<KeyIndex> {
        let LayerBlock::F16 { .. } = block else { return None };
        match block.quantized(Level::Int4, kv_heads, hd)? {
            LayerBlock::Int4 { k, k_scale, k_min, .. } => Some(KeyIndex { k, k_scale, k_min }),
            _ => unreachable!("quantized gives the level asked for"),
        }
    }

    pub fn bytes(&self) -> usize {
        self.k.len() + (self.k_scale.len() + self.k_min.len()) * 2
    }

    /// KV head `kv`'s keys as the AVX2 kernels read an int4 block's, in place.
    pub fn rows(&self, kv: usize, hd: usize) -> BlockRows<'_> {
        let head = kv * BLOCK_TOKENS * hd / 2..(kv + 1) * BLOCK_TOKENS * hd / 2;
        let channels = kv * hd..(kv + 1) * hd;
        BlockRows {
            data: RowData::U4(&self.k[head]),
            scale: Some(&self.k_scale[channels.clone()]),
            min: Some(&self.k_min[channels]),
            group: hd,
        }
    }

    /// KV head `kv`'s keys at positions `from..to`, widened into `out[from*hd..to*hd]`.
    pub fn keys_into(&self, kv: usize, hd: usize, (from, to): (usize, usize), out: &mut [f32]) {
        int4_keys_into(&self.k, &self.k_scale, &self.k_min, kv, hd, (from, to), &mut out[from * hd..to * hd]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_reads_back_as_the_int4_levels_keys_and_takes_three_sixteenths() {
        let (kv_heads, hd) = (2, 64);
        let n = kv_heads * BLOCK_TOKENS * hd;
        let k: KvBuf<f16> = (0..n).map(|i| f16::from_f32(((i * 37 % 29) as f32 - 14.0) / 7.0)).collect();
        let v: KvBuf<f16> = (0..n).map(|i| f16::from_f32(i as f32 / n as f32)).collect();
        let block = LayerBlock::F16 { k, v };
        let index = KeyIndex::of(&block, kv_heads, hd).unwrap();
        assert_eq!(index.bytes() * 16, block.bytes() * 3);
        let int4 = block.quantized(Level::Int4, kv_heads, hd).unwrap();
        let (mut a, mut b) = (vec![0f32; BLOCK_TOKENS * hd], vec![0f32; BLOCK_TOKENS * hd]);
        for kv in 0..kv_heads {
            index.keys_into(kv, hd, (3, 11), &mut a);
            assert!(int4.keys_into(kv, hd, (3, 11), &mut b));
            assert_eq!(a, b);
        }
        assert!(KeyIndex::of(&int4, kv_heads, hd).is_none());
    }
}
