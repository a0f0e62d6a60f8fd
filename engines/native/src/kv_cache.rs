//! The KV cache in blocks: fixed-size token blocks from one pool, a block table per sequence,
//! and full blocks shared between sequences whose token prefixes are equal.
//!
//! - A block holds `BLOCK_TOKENS` positions of every layer; each (block, layer) has its own
//!   storage (`LayerBlock`, `kv_levels.rs`): f16 while written, then int8, int4 or evicted when
//!   a policy says so (`set_level`), one (block, layer) at a time. Only full blocks change
//!   level, so the block a sequence writes is always f16.
//! - The pool has a budget in bytes besides its number of blocks: a block takes its f16 size
//!   when allocated and gives back what a lower level saves, so a policy that stores blocks
//!   smaller lets more sequences in. A free block holds no storage.
//! - Only full blocks are shared, and a full block is never written again, so sharing needs no
//!   copy-on-write: a sequence appends only to its own last, partial block.
//! - A full block is indexed by a hash of every token up to its end (the hash of the previous
//!   block's key and this block's tokens). A new request walks its prompt's full blocks through
//!   the index and starts computing after the last one found. Blocks no sequence uses stay in
//!   the index, least recently released first to be reused, until the pool needs them.
//! - A sequence that ends leaves its last block, when partial, as an idle *tail* keyed by the
//!   prefix before it (`free_table_keeping_tail`): a later request continuing the same tokens
//!   (the next turn of a chat) takes it over in `attach_prefix` and computes from the first
//!   position that differs, not from the block's start. Taking it over needs no copy either:
//!   the new owner writes the block's remaining positions, and nobody else holds it.
//! - Sliding-window layers (Gemma 3, gpt-oss; `with_window`) give back a block's storage once
//!   every query still to come of the one sequence holding it starts past it
//!   (`drop_out_of_window`): the cache holds each sequence's window in those layers, not every
//!   position. Such a block stays in the index for its other layers, and a new request starts
//!   on a prefix only where the window before its end is still whole in every layer. The
//!   scheduler keeps the window before each of a prompt's last `PARTING_MARGIN` positions, so
//!   that a request parting from it there still starts where it parts.

pub use crate::kv_levels::{LayerBlock, Level};
use crate::kv_recall::KeyIndex;
use crate::kv_spill::{Slot, Spill};
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Tokens per block.
pub const BLOCK_TOKENS: usize = 16;

/// How far before a prompt's end a later request may part from it and still start on its
/// prefix in a sliding-window model (an edited last message, a regenerated answer, another
/// question after the same long instructions): the sliding layers keep the window before each
/// of the prompt's last this many positions (the scheduler's `keep`), which
/// `Shape::context_bytes` counts. Further back, the window before the parting point is gone
/// and the prompt is computed again.
pub const PARTING_MARGIN: usize = 256;

pub type BlockId = u32;

struct Block {
    layers: Vec<LayerBlock>,
    /// Per layer, the spill slot of its f16 copy while it is stored lower (empty: none).
    copies: Vec<Option<Slot>>,
    refs: u32,
    /// Its key in the prefix index, once full and registered.
    key: Option<u64>,
    /// The tokens it holds, once registered (or its first `tail.1`, as an idle tail).
    tokens: [u32; BLOCK_TOKENS],
    /// As an idle tail: the key of the prefix it continues and how many positions it holds.
    tail: Option<(u64, u8)>,
    /// Attention it received (when the pool tracks it): the sum of softmax weights over its
    /// positions, and how many (query, head, layer) rows that saw it, since it was allocated
    /// (shrunk, mean kept, when it is evicted: `shrink_attention_history`).
    mass: AtomicU64,
    rows: AtomicU64,
}

/// Fixed point of `Block::mass`: 32 fractional bits.
const MASS_ONE: f64 = (1u64 << 32) as f64;

/// Sizes of one model's cache.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl Shape {
    fn layer_elems(&self) -> usize {
        self.kv_heads * BLOCK_TOKENS * self.head_dim
    }
    /// Bytes one block takes (all layers, keys and values, f16).
    pub fn block_bytes(&self) -> usize {
        self.layers * 2 * self.layer_elems() * 2
    }

    /// The most one sequence of `ctx` positions holds in f16: every position in the full
    /// layers; in the `sliding` ones, which give back blocks out of every window still to come
    /// (`KvPool::drop_out_of_window`), its window, the windows kept before its prompt's last
    /// `PARTING_MARGIN` positions, a prompt chunk of `chunk` positions written before the step
    /// gives blocks back, and blocks of rounding for each.
    pub fn context_bytes(&self, ctx: usize, sliding: usize, window: usize, chunk: usize) -> usize {
        let blocks = ctx.div_ceil(BLOCK_TOKENS);
        let windowed = if sliding > 0 && window > 0 {
            blocks.min((2 * window + PARTING_MARGIN + chunk).div_ceil(BLOCK_TOKENS) + 4)
        } else {
            blocks
        };
        let per_layer = self.block_bytes() / self.layers;
        per_layer * ((self.layers - sliding) * blocks + sliding * windowed)
    }
}

/// A sequence's view of the pool: its blocks in order and how many positions it holds.
#[derive(Default, Debug)]
pub struct BlockTable {
    pub blocks: Vec<BlockId>,
    pub len: usize,
    /// Index keys of this sequence's full blocks, in order (the chain of prefix hashes).
    keys: Vec<u64>,
}

pub struct KvPool {
    shape: Shape,
    /// Whether blocks carry their keys and values here (false: a GPU holds them, indexed by
    /// the same block ids, and this pool only allocates, shares and indexes).
    stored: bool,
    /// Whether attention records the weight each block receives (an importance signal for a
    /// level policy); off, it costs nothing.
    tracking: AtomicBool,
    blocks: Vec<Block>,
    capacity: usize,
    /// Bytes of keys and values the blocks hold now (in use and idle), and the most they may.
    held: usize,
    budget: usize,
    /// Of `held`, what idle blocks hold.
    idle_held: usize,
    /// (block, layer) pairs with storage below f16 (0: `level_counts` needs no walk).
    lowered: usize,
    free: Vec<BlockId>,
    /// Released blocks still in the index or `tails`, oldest release first.
    idle: VecDeque<BlockId>,
    index: HashMap<u64, BlockId>,
    /// Idle partial blocks by the key of the prefix they continue (0: none before them).
    tails: HashMap<u64, BlockId>,
    /// The full block registered last after each prefix key, for requests that part from it
    /// inside the block (`copy_partial`); checked against the index when read, since nothing
    /// unlists it.
    continuations: HashMap<u64, BlockId>,
    /// The sliding-window layers and their window (`with_window`); none: every layer keeps
    /// every position.
    sliding: Vec<usize>,
    window: usize,
    /// The f16 copies of layers stored lower (`enable_spill`), for exact promotion.
    spill: Option<Spill>,
    /// With copies: the share at which attention reads an evicted block back for a step
    /// (`enable_recall`, `kv_recall.rs`); `None`: off.
    recall: Option<f32>,
    /// (block, layer, KV head) reads recall made.
    recalls: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
#[error("the KV cache is full ({0} blocks)")]
pub struct PoolFull(pub usize);

fn chain(prev: u64, tokens: &[u32]) -> u64 {
    // FNV-1a over the previous key and the tokens; a match is also checked against the tokens
    // the block stores, so a 64-bit clash cannot hand a request another prompt's cache.
    let mut h = prev ^ 0xcbf2_9ce4_8422_2325;
    for t in tokens {
        for b in t.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

impl KvPool {
    /// A pool of at most `capacity` blocks, allocated as they are first used, with the budget
    /// of as many f16 blocks.
    pub fn new(shape: Shape, capacity: usize) -> Self {
        KvPool {
            shape,
            stored: true,
            tracking: AtomicBool::new(false),
            blocks: Vec::new(),
            capacity,
            held: 0,
            idle_held: 0,
            lowered: 0,
            budget: capacity * shape.block_bytes(),
            free: Vec::new(),
            idle: VecDeque::new(),
            index: HashMap::new(),
            tails: HashMap::new(),
            continuations: HashMap::new(),
            sliding: Vec::new(),
            window: 0,
            spill: None,
            recall: None,
            recalls: AtomicU64::new(0),
        }
    }

    /// A pool whose layers `sliding` attend over the last `window` positions only (the query's
    /// own included), so that their blocks before every window still to come can be dropped.
    pub fn with_window(mut self, sliding: Vec<usize>, window: usize) -> Self {
        if window > 0 && !sliding.is_empty() {
            (self.sliding, self.window) = (sliding, window);
        }
        self
    }

    /// A pool whose blocks' keys and values live elsewhere (a device buffer of `capacity`
    /// blocks indexed by block id): `write` and `layer` are not for it.
    pub fn without_storage(shape: Shape, capacity: usize) -> Self {
        KvPool { stored: false, ..Self::new(shape, capacity) }
    }

    /// Keeps the f16 copy of every layer block stored lower from now on in a spill file, so
    /// that `promote` is exact (`kv_spill.rs`). A pool without storage has nothing to copy.
    /// On an error the pool is as it was.
    pub fn enable_spill(&mut self) -> std::io::Result<()> {
        if self.stored && self.spill.is_none() {
            self.spill = Some(Spill::new(self.shape.layer_elems())?);
        }
        Ok(())
    }

    /// Keeps an int4 index of the keys of every layer evicted from now on, and lets attention
    /// read an evicted block back from its copy for a step when its positions would take
    /// `share` of a query's attention (`kv_recall.rs`). Needs the copies
    /// (`enable_spill`): false, and nothing changes, without them.
    pub fn enable_recall(&mut self, share: f32) -> bool {
        let on = self.spill.is_some() && share > 0.0;
        if on {
            self.recall = Some(share);
        }
        on
    }

    /// The share recall reads blocks at (`None`: off).
    pub fn recall_share(&self) -> Option<f32> {
        self.recall
    }

    /// Layer `layer`'s keys and values of KV head `kv` in block `id`, read from its f16 copy:
    /// what attention uses for an evicted block this step. `None` without a copy, or when the
    /// read fails (the block then weighs nothing, as before recall).
    pub fn recall(&self, id: BlockId, layer: usize, kv: usize) -> Option<LayerBlock> {
        let slot = self.blocks[id as usize].copies.get(layer).copied().flatten()?;
        let block = self.spill.as_ref()?.get_head(slot, kv, self.shape.kv_heads).ok()?;
        self.recalls.fetch_add(1, Ordering::Relaxed);
        Some(block)
    }

    /// (block, layer, KV head) reads recall made since the pool was made.
    pub fn recalls(&self) -> u64 {
        self.recalls.load(Ordering::Relaxed)
    }

    /// Layer blocks with an f16 copy in the spill tier.
    pub fn spilled(&self) -> usize {
        self.spill.as_ref().map_or(0, Spill::held)
    }

    /// This pool with a budget of `bytes` for its storage instead (blocks at lower levels
    /// take less of it; `capacity` still bounds the number of blocks).
    pub fn with_budget(self, bytes: usize) -> Self {
        KvPool { budget: bytes, ..self }
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes the blocks hold, from the pool's account (`stored_bytes` measures them).
    pub fn held_bytes(&self) -> usize {
        self.held
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Blocks some sequence holds.
    pub fn used(&self) -> usize {
        self.blocks.len() - self.free.len() - self.idle.len()
    }
    /// Blocks that can be allocated now, idle ones taken back included.
    pub fn available(&self) -> usize {
        let by_count = self.capacity - self.used();
        if !self.stored {
            return by_count;
        }
        by_count.min(self.room_bytes() / self.shape.block_bytes())
    }

    /// Bytes allocations may still take: the budget's rest and what idle blocks hold.
    pub fn room_bytes(&self) -> usize {
        self.budget.saturating_sub(self.held) + self.idle_held
    }

    fn block_bytes(&self, id: BlockId) -> usize {
        self.blocks[id as usize].layers.iter().map(LayerBlock::bytes).sum()
    }

    /// Share of the budget the blocks in use hold (idle blocks are a cache given back on
    /// demand); for a pool without storage, the share of its blocks in use.
    pub fn pressure(&self) -> f64 {
        if !self.stored {
            return self.used() as f64 / self.capacity.max(1) as f64;
        }
        (self.held - self.idle_held) as f64 / self.budget.max(1) as f64
    }

    /// The pressure once `extra` more bytes are held by blocks in use.
    pub fn pressure_with(&self, extra: usize) -> f64 {
        if !self.stored {
            return self.pressure();
        }
        (self.held - self.idle_held + extra) as f64 / self.budget.max(1) as f64
    }

    /// Takes the oldest idle block out of the index (or the tails), storage given back, into
    /// the free list.
    fn reclaim_idle(&mut self) -> bool {
        let Some(id) = self.idle.pop_front() else { return false };
        self.idle_held -= self.block_bytes(id);
        self.discard_idle(id);
        true
    }

    /// Takes idle block `id` out of the idle queue (it stays listed).
    fn leave_idle(&mut self, id: BlockId) {
        self.idle.retain(|&i| i != id);
        self.idle_held -= self.block_bytes(id);
    }

    /// Unlists a block out of the idle queue and frees it, storage given back.
    fn discard_idle(&mut self, id: BlockId) {
        self.unlist_idle(id);
        self.drop_storage(id);
        self.free.push(id);
    }

    /// Takes idle block `id` out of the index or the tails, whichever lists it.
    fn unlist_idle(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        if let Some(key) = b.key.take() {
            self.index.remove(&key);
        } else {
            let (prefix, _) = b.tail.take().expect("idle blocks are indexed or tails");
            self.tails.remove(&prefix);
        }
    }

    fn drop_storage(&mut self, id: BlockId) {
        self.held -= self.block_bytes(id);
        let b = &mut self.blocks[id as usize];
        self.lowered -= b.layers.iter().filter(|l| l.level() != Level::F16).count();
        b.layers.clear();
        for slot in b.copies.drain(..).flatten() {
            self.spill.as_mut().expect("copies come from the spill").free(slot);
        }
    }

    /// Writes layer `layer` of block `id` to the spill tier if it is f16 and the pool keeps
    /// copies; a write that fails leaves the layer without a copy (it cannot be promoted
    /// exactly, nothing else changes).
    fn keep_copy(&mut self, id: usize, layer: usize) {
        let Some(spill) = self.spill.as_mut() else { return };
        let b = &mut self.blocks[id];
        if b.layers[layer].level() != Level::F16 || matches!(b.layers[layer], LayerBlock::OutOfWindow) {
            return;
        }
        if b.copies.len() < b.layers.len() {
            b.copies.resize(b.layers.len(), None);
        }
        if b.copies[layer].is_none() {
            b.copies[layer] = spill.put(&b.layers[layer]).ok();
        }
    }

    fn drop_copy(&mut self, id: usize, layer: usize) {
        if let Some(slot) = self.blocks[id].copies.get_mut(layer).and_then(Option::take) {
            self.spill.as_mut().expect("copies come from the spill").free(slot);
        }
    }

    /// A block for one holder, its bytes counted in the budget; [`Self::store_zeroed`] gives it
    /// its storage.
    fn allocate(&mut self) -> Result<BlockId, PoolFull> {
        let bytes = if self.stored { self.shape.block_bytes() } else { 0 };
        while self.held + bytes > self.budget {
            if !self.reclaim_idle() {
                return Err(PoolFull(self.capacity));
            }
        }
        let id = if let Some(id) = self.free.pop() {
            id
        } else if self.blocks.len() < self.capacity {
            self.blocks.push(Block {
                layers: Vec::new(),
                copies: Vec::new(),
                refs: 0,
                key: None,
                tokens: [0; BLOCK_TOKENS],
                tail: None,
                mass: AtomicU64::new(0),
                rows: AtomicU64::new(0),
            });
            (self.blocks.len() - 1) as BlockId
        } else if self.reclaim_idle() {
            self.free.pop().expect("a block was just reclaimed")
        } else {
            return Err(PoolFull(self.capacity));
        };
        let b = &mut self.blocks[id as usize];
        b.refs = 1;
        *b.mass.get_mut() = 0;
        *b.rows.get_mut() = 0;
        self.held += bytes;
        Ok(id)
    }

    /// Gives the blocks `ids`, just allocated, their zeroed f16 storage of every layer, the
    /// blocks spread over the calling thread's pool: zeroing is the first touch of memory the
    /// pool has not held before, and its page faults, on the scheduler's thread alone, took 8%
    /// of a 512-token prompt's samples while the pool's threads waited.
    fn store_zeroed(&mut self, ids: &[BlockId]) {
        if !self.stored {
            return;
        }
        let (layers, kv_heads, hd) = (self.shape.layers, self.shape.kv_heads, self.shape.head_dim);
        let zeroed = || (0..layers).map(|_| LayerBlock::zeroed(kv_heads, hd)).collect::<Vec<_>>();
        // In parallel only on a pool's thread (the scheduler installs its own), never on
        // rayon's global pool.
        let storage: Vec<Vec<LayerBlock>> = if ids.len() > 1 && rayon::current_thread_index().is_some() {
            ids.par_iter().map(|_| zeroed()).collect()
        } else {
            ids.iter().map(|_| zeroed()).collect()
        };
        for (&id, layers) in ids.iter().zip(storage) {
            self.blocks[id as usize].layers = layers;
        }
    }

    fn release(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        b.refs -= 1;
        if b.refs == 0 {
            if b.key.is_some() {
                self.idle.push_back(id);
                self.idle_held += self.block_bytes(id);
            } else {
                self.drop_storage(id);
                self.free.push(id);
            }
        }
    }

    /// Starts `table` (empty) on the longest run of `tokens`' full blocks found in the index,
    /// leaving at least the last token to compute (its logits are needed). Returns the positions
    /// reused.
    pub fn attach_prefix(&mut self, table: &mut BlockTable, tokens: &[u32]) -> usize {
        debug_assert!(table.blocks.is_empty());
        let usable = tokens.len().saturating_sub(1) / BLOCK_TOKENS;
        let mut prev = 0u64;
        for chunk in tokens.chunks_exact(BLOCK_TOKENS).take(usable) {
            let key = chain(prev, chunk);
            let Some(&id) = self.index.get(&key) else { break };
            if self.blocks[id as usize].tokens[..] != *chunk {
                break;
            }
            self.hold(id);
            table.blocks.push(id);
            table.keys.push(key);
            prev = key;
        }
        // The sliding layers must still hold the window before the prefix's end: give back the
        // blocks past the last end that has it.
        while !table.blocks.is_empty() && !self.window_whole(&table.blocks, table.blocks.len() * BLOCK_TOKENS) {
            let id = table.blocks.pop().expect("not empty");
            table.keys.pop();
            self.release(id);
        }
        table.len = table.blocks.len() * BLOCK_TOKENS;
        table.len += match self.adopt_tail(table, tokens) {
            0 => self.copy_partial(table, tokens),
            adopted => adopted,
        };
        table.len
    }

    /// One more sequence holds block `id` (out of the idle queue if it was there).
    fn hold(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        b.refs += 1;
        if b.refs == 1 {
            self.leave_idle(id);
        }
    }

    /// The full block registered last after the prefix `key`, if it is still registered.
    fn continuation(&self, key: u64) -> Option<BlockId> {
        let &id = self.continuations.get(&key)?;
        let b = &self.blocks[id as usize];
        let own = b.key?;
        (own == chain(key, &b.tokens) && self.index.get(&own) == Some(&id)).then_some(id)
    }

    /// Copies into a new block the first positions of the full block registered last after
    /// `table`'s full blocks, where they are the next of `tokens` (leaving the last token to
    /// compute); returns the positions it brings. A regenerated answer, or an edited last
    /// message, parts from a cached prompt inside the block that held the prompt's end and the
    /// answer after it: its first positions are what the request needs, the rest are not, and
    /// the block itself stays as it is for those who share it. f16 blocks on the CPU only (the
    /// GPU's device buffer holds the values there, and a lowered block is no exact source).
    fn copy_partial(&mut self, table: &mut BlockTable, tokens: &[u32]) -> usize {
        let Some(src) = self.continuation(table.keys.last().copied().unwrap_or(0)) else { return 0 };
        let Some(next) = tokens.get(table.len..tokens.len().saturating_sub(1)) else { return 0 };
        let b = &self.blocks[src as usize];
        let same = b.tokens.iter().zip(next).take_while(|(a, b)| a == b).count();
        if same == 0 || !self.stored || !b.layers.iter().all(|l| matches!(l, LayerBlock::F16 { .. })) {
            return 0;
        }
        table.blocks.push(src);
        let whole = self.window_whole(&table.blocks, table.len + same);
        table.blocks.pop();
        if !whole {
            return 0;
        }
        // Held while the new block is allocated: the pool may reclaim idle blocks for it.
        self.hold(src);
        let copied = self.reserve(table, same).is_ok();
        if copied {
            let dst = *table.blocks.last().expect("reserved") as usize;
            let hd = self.shape.head_dim;
            for li in 0..self.shape.layers {
                for h in 0..self.shape.kv_heads {
                    let at = h * BLOCK_TOKENS * hd..(h * BLOCK_TOKENS + same) * hd;
                    let LayerBlock::F16 { k, v } = &self.blocks[src as usize].layers[li] else { unreachable!() };
                    let (k, v) = (k[at.clone()].to_vec(), v[at.clone()].to_vec());
                    let LayerBlock::F16 { k: dk, v: dv } = &mut self.blocks[dst].layers[li] else {
                        unreachable!("a new block is f16")
                    };
                    dk[at.clone()].copy_from_slice(&k);
                    dv[at].copy_from_slice(&v);
                }
            }
        }
        self.release(src);
        if copied {
            same
        } else {
            0
        }
    }

    /// Takes over the idle tail continuing `table`'s full blocks where its first positions
    /// are the next of `tokens` (leaving the last token to compute); returns the positions
    /// it brings.
    fn adopt_tail(&mut self, table: &mut BlockTable, tokens: &[u32]) -> usize {
        let prefix = table.keys.last().copied().unwrap_or(0);
        let Some(&id) = self.tails.get(&prefix) else { return 0 };
        let (_, len) = self.blocks[id as usize].tail.expect("listed tails are tails");
        let Some(next) = tokens.get(table.len..tokens.len().saturating_sub(1)) else { return 0 };
        let held = &self.blocks[id as usize].tokens[..len as usize];
        let same = held.iter().zip(next).take_while(|(a, b)| a == b).count();
        table.blocks.push(id);
        if same == 0 || !self.window_whole(&table.blocks, table.len + same) {
            table.blocks.pop();
            return 0;
        }
        self.leave_idle(id);
        self.unlist_idle(id);
        self.blocks[id as usize].refs = 1;
        same
    }

    /// Whether `blocks` (a sequence's, in order) hold, in every sliding layer, what a query at
    /// position `end` looks back over.
    fn window_whole(&self, blocks: &[BlockId], end: usize) -> bool {
        if self.sliding.is_empty() || !self.stored {
            return true;
        }
        let first = (end + 1).saturating_sub(self.window) / BLOCK_TOKENS;
        blocks[first.min(blocks.len())..end.div_ceil(BLOCK_TOKENS).min(blocks.len())].iter().all(|&id| {
            let layers = &self.blocks[id as usize].layers;
            self.sliding.iter().all(|&l| !matches!(layers[l], LayerBlock::OutOfWindow))
        })
    }

    /// Gives back the sliding layers' storage of `table`'s blocks that lie wholly before the
    /// window of the sequence's next query (at `table.len`: queries only move on), except those
    /// overlapping `keep` (the window before its prompt's end, so that a later request parting
    /// from this one just after its prompt still starts there) and those another sequence
    /// shares. `next` is where the last call stopped (blocks before it are done); returns where
    /// this one did.
    pub fn drop_out_of_window(&mut self, table: &BlockTable, keep: std::ops::Range<usize>, next: usize) -> usize {
        if self.sliding.is_empty() || !self.stored {
            return next;
        }
        let from = (table.len + 1).saturating_sub(self.window);
        let end = (from / BLOCK_TOKENS).min(table.blocks.len());
        for index in next..end {
            let (start, stop) = (index * BLOCK_TOKENS, (index + 1) * BLOCK_TOKENS);
            if start < keep.end && keep.start < stop {
                continue;
            }
            let id = table.blocks[index] as usize;
            if self.blocks[id].refs > 1 {
                continue;
            }
            for l in self.sliding.clone() {
                self.drop_copy(id, l);
                let layer = &mut self.blocks[id].layers[l];
                if let LayerBlock::Evicted(index) = layer {
                    // No copy to recall from any more: the index goes too.
                    if let Some(b) = index.take() {
                        self.held -= b.bytes();
                    }
                    continue;
                }
                if matches!(layer, LayerBlock::OutOfWindow) {
                    continue;
                }
                self.held -= layer.bytes();
                self.lowered -= (layer.level() != Level::F16) as usize;
                *layer = LayerBlock::OutOfWindow;
            }
        }
        next.max(end)
    }

    /// The window of the sliding layers (0: none, or every position kept).
    pub fn window(&self) -> usize {
        self.window
    }

    /// Makes room in `table` for `extra` positions after its last one: all or nothing.
    pub fn reserve(&mut self, table: &mut BlockTable, extra: usize) -> Result<(), PoolFull> {
        let need = (table.len + extra).div_ceil(BLOCK_TOKENS);
        let missing = need.saturating_sub(table.blocks.len());
        if missing > self.capacity - self.used()
            || (self.stored && missing * self.shape.block_bytes() > self.room_bytes())
        {
            return Err(PoolFull(self.capacity));
        }
        let first = table.blocks.len();
        let mut full = Ok(());
        while table.blocks.len() < need {
            match self.allocate() {
                Ok(id) => table.blocks.push(id),
                Err(e) => {
                    full = Err(e);
                    break;
                }
            }
        }
        // The blocks taken before a failure stay in the table, as whole blocks.
        self.store_zeroed(&table.blocks[first..]);
        full
    }

    /// Registers `table`'s blocks that became full (their tokens are `tokens[..table.len]`) so
    /// that later requests can share them.
    pub fn publish(&mut self, table: &mut BlockTable, tokens: &[u32]) {
        let full = table.len / BLOCK_TOKENS;
        while table.keys.len() < full {
            let i = table.keys.len();
            let prev = table.keys.last().copied().unwrap_or(0);
            let key = chain(prev, &tokens[i * BLOCK_TOKENS..(i + 1) * BLOCK_TOKENS]);
            table.keys.push(key);
            let id = table.blocks[i];
            if self.blocks[id as usize].key.is_none() && !self.index.contains_key(&key) {
                self.index.insert(key, id);
                let b = &mut self.blocks[id as usize];
                b.key = Some(key);
                b.tokens.copy_from_slice(&tokens[i * BLOCK_TOKENS..(i + 1) * BLOCK_TOKENS]);
                self.continue_prefix(prev, id);
            }
        }
    }

    /// Lists `id`, just registered, as the block continuing the prefix `key`. Entries are
    /// never unlisted (`continuation` checks them), so past a bound the stale ones go.
    fn continue_prefix(&mut self, key: u64, id: BlockId) {
        self.continuations.insert(key, id);
        if self.continuations.len() > 2 * self.capacity.max(64) {
            // At most `capacity` stay (one per registered block): the next sweep is as many
            // registrations away.
            let stale: Vec<u64> =
                self.continuations.keys().filter(|&&k| self.continuation(k).is_none()).copied().collect();
            for k in stale {
                self.continuations.remove(&k);
            }
        }
    }

    /// Gives back every block of `table` (whose tokens are `tokens[..table.len]`, its full
    /// blocks published), its last block, when partial and held by it alone, kept as an idle
    /// tail for a request that continues the same tokens (`attach_prefix`). A tail replaces
    /// the one that continued the same prefix before.
    pub fn free_table_keeping_tail(&mut self, table: &mut BlockTable, tokens: &[u32]) {
        let (full, len) = (table.len / BLOCK_TOKENS, table.len % BLOCK_TOKENS);
        let last = table.blocks.get(full).copied();
        if let Some(id) = last.filter(|&id| {
            len > 0 && table.keys.len() == full && table.blocks.len() == full + 1 && self.blocks[id as usize].refs == 1
        }) {
            let prefix = table.keys.last().copied().unwrap_or(0);
            if let Some(old) = self.tails.get(&prefix).copied() {
                self.leave_idle(old);
                self.discard_idle(old);
            }
            table.blocks.pop();
            let b = &mut self.blocks[id as usize];
            b.refs = 0;
            b.tokens[..len].copy_from_slice(&tokens[full * BLOCK_TOKENS..table.len]);
            b.tail = Some((prefix, len as u8));
            self.tails.insert(prefix, id);
            self.idle.push_back(id);
            self.idle_held += self.block_bytes(id);
        }
        self.free_table(table);
    }

    /// Gives back every block of `table`.
    pub fn free_table(&mut self, table: &mut BlockTable) {
        for id in table.blocks.drain(..) {
            self.release(id);
        }
        table.keys.clear();
        table.len = 0;
    }

    /// Drops positions from `len` on (a step that failed); full blocks before it stay.
    pub fn truncate(&mut self, table: &mut BlockTable, len: usize) {
        let keep = len.div_ceil(BLOCK_TOKENS);
        for id in table.blocks.drain(keep..) {
            self.release(id);
        }
        table.keys.truncate(len / BLOCK_TOKENS);
        table.len = len;
    }

    /// Writes the key and value vectors (`kv_heads x head_dim` each) of position `pos`.
    pub fn write(&mut self, table: &BlockTable, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let id = table.blocks[pos / BLOCK_TOKENS];
        let slot = pos % BLOCK_TOKENS;
        let hd = self.shape.head_dim;
        let LayerBlock::F16 { k: kb, v: vb } = &mut self.blocks[id as usize].layers[layer] else {
            unreachable!("only full blocks change level, and a sequence writes only its partial one")
        };
        // The slice conversions round as `f16::from_f32` does, eight values an instruction
        // where the CPU has F16C (one at a time, each through a feature check, took 2% of a
        // prompt).
        for h in 0..self.shape.kv_heads {
            let at = (h * BLOCK_TOKENS + slot) * hd;
            kb[at..at + hd].convert_from_f32_slice(&k[h * hd..(h + 1) * hd]);
            vb[at..at + hd].convert_from_f32_slice(&v[h * hd..(h + 1) * hd]);
        }
    }

    /// Stores the `index`-th block of `table` at `level` in `layer` (every layer when `None`).
    /// Only full blocks change, and only down; false (nothing changed) for a partial block, an
    /// index past the table, or a block at `level` or lower already.
    pub fn set_level(&mut self, table: &BlockTable, index: usize, layer: Option<usize>, level: Level) -> bool {
        if !self.stored || (index + 1) * BLOCK_TOKENS > table.len {
            return false;
        }
        let (kv_heads, hd) = (self.shape.kv_heads, self.shape.head_dim);
        let id = table.blocks[index] as usize;
        let range = layer.map_or(0..self.shape.layers, |l| l..l + 1);
        // The layers in parallel, on the caller's thread pool (the scheduler's, between steps).
        let quantized: Vec<Option<LayerBlock>> =
            self.blocks[id].layers[range.clone()].par_iter().map(|l| l.quantized(level, kv_heads, hd)).collect();
        let mut changed = false;
        for (li, q) in range.zip(quantized) {
            if let Some(q) = q {
                self.keep_copy(id, li);
                let l = &mut self.blocks[id].layers[li];
                self.held = self.held + q.bytes() - l.bytes();
                self.lowered += (l.level() == Level::F16) as usize;
                *l = q;
                changed = true;
            }
        }
        changed
    }

    /// The level of the `index`-th block of `table` (its lowest over layers; f16 for a pool
    /// without storage).
    pub fn level(&self, table: &BlockTable, index: usize) -> Level {
        let layers = &self.blocks[table.blocks[index] as usize].layers;
        layers.iter().map(LayerBlock::level).max().unwrap_or(Level::F16)
    }

    /// Sequences holding block `id`.
    pub fn sharers(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].refs
    }

    /// Starts (or stops) recording the attention each block receives.
    pub fn track_attention(&self, on: bool) {
        self.tracking.store(on, Ordering::Relaxed);
    }

    pub fn tracks_attention(&self) -> bool {
        self.tracking.load(Ordering::Relaxed)
    }

    /// Adds attention `mass` received by block `id` over `rows` (query, head) rows.
    pub fn note_attention(&self, id: BlockId, mass: f32, rows: usize) {
        let b = &self.blocks[id as usize];
        b.mass.fetch_add((mass as f64 * MASS_ONE) as u64, Ordering::Relaxed);
        b.rows.fetch_add(rows as u64, Ordering::Relaxed);
    }

    /// The mean attention weight a row that saw block `id` gave its positions, since the block
    /// was allocated, the rows before an eviction weighing as one per (layer, KV head) (`None`
    /// before any row).
    pub fn attention_received(&self, id: BlockId) -> Option<f64> {
        let b = &self.blocks[id as usize];
        let rows = b.rows.load(Ordering::Relaxed);
        (rows > 0).then(|| b.mass.load(Ordering::Relaxed) as f64 / MASS_ONE / rows as f64)
    }

    /// Evicts the `index`-th block of `table` in every layer, whatever its level (a full block).
    /// It leaves the prefix index: a new request must not start on a prefix with a hole.
    pub fn evict(&mut self, table: &BlockTable, index: usize) -> bool {
        if !self.stored || (index + 1) * BLOCK_TOKENS > table.len {
            return false;
        }
        let id = table.blocks[index] as usize;
        if let Some(key) = self.blocks[id].key.take() {
            self.index.remove(&key);
        }
        for li in 0..self.blocks[id].layers.len() {
            if matches!(self.blocks[id].layers[li], LayerBlock::Evicted(_) | LayerBlock::OutOfWindow) {
                continue;
            }
            self.keep_copy(id, li);
            let index = self.key_index(id, li);
            let l = &mut self.blocks[id].layers[li];
            self.held -= l.bytes();
            self.lowered += (l.level() == Level::F16) as usize;
            *l = LayerBlock::Evicted(index);
            self.held += l.bytes();
        }
        self.shrink_attention_history(id);
        true
    }

    /// Shrinks block `id`'s attention history to one row per (layer, KV head), keeping its
    /// mean. Evicted, the block receives rows only where recall reads it back for a query that
    /// gives it a share of its attention; those rows must be able to outweigh a long history of
    /// rows that gave it little, or a block a later question needs stays below blocks nobody
    /// asked for when the budget has room to promote again, and each step that needs it reads
    /// it again. A block never read back keeps its mean, and so its importance.
    fn shrink_attention_history(&mut self, id: usize) {
        let cap = (self.shape.layers * self.shape.kv_heads) as u64;
        let b = &mut self.blocks[id];
        let rows = *b.rows.get_mut();
        if rows > cap {
            let mass = b.mass.get_mut();
            *mass = (*mass as f64 * cap as f64 / rows as f64) as u64;
            *b.rows.get_mut() = cap;
        }
    }

    /// With recall on, the int4 key index of layer `layer` of block `id`, about to be evicted:
    /// from its f16 storage, else from its copy. `None` without a copy to recall from.
    fn key_index(&self, id: usize, layer: usize) -> Option<KeyIndex> {
        self.recall?;
        let slot = self.blocks[id].copies.get(layer).copied().flatten()?;
        let (kv_heads, hd) = (self.shape.kv_heads, self.shape.head_dim);
        let stored = &self.blocks[id].layers[layer];
        KeyIndex::of(stored, kv_heads, hd).or_else(|| KeyIndex::of(&self.spill.as_ref()?.get(slot).ok()?, kv_heads, hd))
    }

    /// Whether some layer of the `index`-th block of `table` is stored lower than f16 and has
    /// its f16 copy in the spill tier.
    pub fn restorable(&self, table: &BlockTable, index: usize) -> bool {
        let b = &self.blocks[table.blocks[index] as usize];
        b.copies.iter().zip(&b.layers).any(|(c, l)| c.is_some() && l.level() != Level::F16)
    }

    /// Stores the `index`-th block of `table` at `level` again, higher than it is, from the
    /// f16 copies of its layers in the spill tier: exactly the values first written (at
    /// int8 or int4, quantized from them once). Only layers with a copy change, and only
    /// while the budget has room (idle blocks give theirs back first). An evicted block comes
    /// back but stays out of the prefix index. False when nothing changed.
    pub fn promote(&mut self, table: &BlockTable, index: usize, level: Level) -> bool {
        if self.spill.is_none() || index >= table.blocks.len() {
            return false;
        }
        let (kv_heads, hd) = (self.shape.kv_heads, self.shape.head_dim);
        let id = table.blocks[index] as usize;
        let mut changed = false;
        for li in 0..self.blocks[id].copies.len() {
            let Some(slot) = self.blocks[id].copies[li] else { continue };
            let old = &self.blocks[id].layers[li];
            let (old_level, old_bytes) = (old.level(), old.bytes());
            if old_level <= level {
                continue;
            }
            let Ok(f16) = self.spill.as_ref().expect("checked above").get(slot) else { continue };
            let new =
                if level == Level::F16 { f16 } else { f16.quantized(level, kv_heads, hd).expect("a lower level") };
            let new_bytes = new.bytes();
            while self.held - old_bytes + new_bytes > self.budget {
                if !self.reclaim_idle() {
                    return changed;
                }
            }
            self.held = self.held - old_bytes + new_bytes;
            if level == Level::F16 {
                self.lowered -= 1;
                self.drop_copy(id, li);
            }
            self.blocks[id].layers[li] = new;
            changed = true;
        }
        changed
    }

    /// Bytes of keys and values the pool's blocks hold, measured from the storage.
    pub fn stored_bytes(&self) -> usize {
        let measured = self.blocks.iter().flat_map(|b| &b.layers).map(LayerBlock::bytes).sum();
        debug_assert_eq!(measured, self.held, "the budget's account follows the storage");
        measured
    }

    /// (block, layer) pairs at each level, indexed by `Level as usize`, over blocks in use.
    pub fn level_counts(&self) -> [usize; 4] {
        if self.stored && self.lowered == 0 {
            // Every block f16 (the baseline policy's case): no walk on the step's path.
            return [self.used() * self.shape.layers, 0, 0, 0];
        }
        let mut counts = [0; 4];
        for l in self.blocks.iter().filter(|b| b.refs > 0).flat_map(|b| &b.layers) {
            counts[l.level() as usize] += 1;
        }
        counts
    }

    /// The stored keys and values of one layer of one block.
    pub fn layer(&self, id: BlockId, layer: usize) -> &LayerBlock {
        &self.blocks[id as usize].layers[layer]
    }

    /// Asks the CPU to bring block `id`'s entry for `layer` (its level and where its storage
    /// lies) into its cache, without reading it: attention calls it two blocks ahead, so that
    /// reading the entry, then prefetching the storage it points to, never waits on memory.
    /// Each block's entries are their own allocation: walking a sequence's blocks at one layer
    /// otherwise misses the cache at every block.
    #[inline(always)]
    pub fn prefetch_layer(&self, id: BlockId, layer: usize) {
        let entry: *const LayerBlock = self.blocks[id as usize].layers.as_ptr().wrapping_add(layer);
        crate::kernels::prefetch(entry.cast(), std::mem::size_of::<LayerBlock>());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(capacity: usize) -> KvPool {
        KvPool::new(Shape { layers: 2, kv_heads: 1, head_dim: 4 }, capacity)
    }

    /// The first channel of the key at `slot` of `layer` of block `id` (f16; head_dim 4).
    fn key_at(pool: &KvPool, id: BlockId, layer: usize, slot: usize) -> f32 {
        let LayerBlock::F16 { k, .. } = pool.layer(id, layer) else { panic!("an f16 block") };
        k[slot * 4].to_f32()
    }

    fn filled(pool: &mut KvPool, tokens: &[u32]) -> BlockTable {
        let mut t = BlockTable::default();
        pool.reserve(&mut t, tokens.len()).unwrap();
        t.len = tokens.len();
        pool.publish(&mut t, tokens);
        t
    }

    #[test]
    fn sliding_layers_give_back_blocks_out_of_every_window_and_prefixes_keep_theirs() {
        // Layer 1 slides over 40 positions; layer 0 sees everything.
        let mut p = pool(16).with_window(vec![1], 40);
        let f16_block = p.shape().block_bytes();
        let tokens: Vec<u32> = (0..100).collect();
        let mut t = filled(&mut p, &tokens);
        // The next query (position 100) looks back to 61: blocks 0-2 (positions 0-47) are out
        // of its window in layer 1, except where the window before the prompt's end (20) is kept.
        let next = p.drop_out_of_window(&t, 0..20, 0);
        assert_eq!(next, 3);
        let dropped = |p: &KvPool, t: &BlockTable| {
            t.blocks.iter().map(|&id| matches!(p.layer(id, 1), LayerBlock::OutOfWindow)).collect::<Vec<_>>()
        };
        assert_eq!(dropped(&p, &t), [false, false, true, false, false, false, false]);
        assert_eq!(p.held_bytes(), 7 * f16_block - f16_block / 2, "one block's layer 1 given back");
        assert_eq!(p.stored_bytes(), p.held_bytes());
        assert!(matches!(p.layer(t.blocks[2], 0), LayerBlock::F16 { .. }), "layer 0 keeps every position");
        // A later call goes on from where the last stopped.
        t.len = 120;
        p.reserve(&mut t, 0).unwrap();
        assert_eq!(p.drop_out_of_window(&t, 0..20, next), 5);
        assert_eq!(dropped(&p, &t)[..5], [false, false, true, true, true]);
        // A request may start on a prefix only where layer 1 still holds the window before its
        // end: ending at 96 needs 57-95 (blocks 3-5: block 3 and 4 are gone), at 32 needs 0-31.
        let mut long = BlockTable::default();
        let reused = p.attach_prefix(&mut long, &tokens);
        assert_eq!(reused, 32);
        assert_eq!(long.blocks, t.blocks[..2]);
        p.free_table(&mut long);
        p.free_table(&mut t);
        assert_eq!(p.used(), 0);
    }

    #[test]
    fn one_sequence_runs_to_its_context_in_the_bytes_the_shape_says_it_needs() {
        // Three of four layers slide over 40 positions: a sequence of 1,000 holds about two
        // windows, the parting margin and a chunk there, not 1,000.
        let shape = Shape { layers: 4, kv_heads: 1, head_dim: 4 };
        let (ctx, window, chunk, prompt) = (1000, 40, 32, 700);
        let bytes = shape.context_bytes(ctx, 3, window, chunk);
        let per_layer = shape.block_bytes() / 4;
        assert_eq!(bytes, per_layer * (63 + 3 * 27));
        assert_eq!(shape.context_bytes(ctx, 0, window, chunk), 63 * shape.block_bytes());
        let mut p = KvPool::new(shape, 63).with_budget(bytes).with_window(vec![1, 2, 3], window);
        let (mut t, mut next) = (BlockTable::default(), 0);
        while t.len < ctx {
            let step = if t.len < prompt { chunk.min(prompt - t.len) } else { 1 };
            p.reserve(&mut t, step).unwrap_or_else(|e| panic!("at {}: {e}", t.len));
            t.len += step;
            next = p.drop_out_of_window(&t, prompt - window - PARTING_MARGIN..prompt, next);
        }
        assert!(p.held_bytes() <= bytes);
    }

    #[test]
    fn an_evicted_layers_key_index_is_in_the_budget_until_its_copy_goes() {
        let mut p = pool(16).with_window(vec![1], 40);
        p.enable_spill().unwrap();
        assert!(p.enable_recall(crate::kv_recall::RECALL_SHARE));
        let f16_block = p.shape().block_bytes();
        let tokens: Vec<u32> = (0..100).collect();
        let t = filled(&mut p, &tokens);
        assert!(p.evict(&t, 2));
        let index = |p: &KvPool, layer: usize| match p.layer(t.blocks[2], layer) {
            LayerBlock::Evicted(Some(index)) => index.bytes(),
            _ => 0,
        };
        assert!(index(&p, 0) > 0 && index(&p, 1) > 0, "both layers keep their keys' index");
        assert_eq!(p.held_bytes(), 6 * f16_block + index(&p, 0) + index(&p, 1));
        assert_eq!(p.stored_bytes(), p.held_bytes());
        assert!(p.recall(t.blocks[2], 1, 0).is_some(), "the copy is there to read back");
        // Out of every window in layer 1: its copy goes, and the index with it.
        p.drop_out_of_window(&t, 0..20, 0);
        assert_eq!(index(&p, 1), 0);
        assert!(p.recall(t.blocks[2], 1, 0).is_none());
        assert_eq!(p.held_bytes(), 6 * f16_block + index(&p, 0));
        assert_eq!(p.stored_bytes(), p.held_bytes());
        // Evicting a block whose layer 1 is out of the window leaves that layer as it is.
        assert!(matches!(p.layer(t.blocks[3], 1), LayerBlock::F16 { .. }));
        p.drop_out_of_window(&t, 0..20, 3);
        assert!(p.evict(&t, 2) && p.evict(&t, 3));
        assert_eq!(p.stored_bytes(), p.held_bytes());
        assert_eq!(p.recalls(), 1);
    }

    #[test]
    fn a_shared_prefix_reuses_full_blocks_copies_from_a_partly_shared_one_and_leaves_the_last_token() {
        let mut p = pool(8);
        let a: Vec<u32> = (0..40).collect();
        let mut ta = filled(&mut p, &a);
        assert_eq!(ta.blocks.len(), 3);
        // Same first 35 tokens: two full blocks (32 positions) are shared.
        let mut b: Vec<u32> = (0..35).collect();
        b.push(999);
        let mut tb = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut tb, &b), 32);
        assert_eq!(tb.blocks, ta.blocks[..2]);
        // A prompt of exactly 32 shared tokens reuses one block and a copy of the next one's
        // first 15 positions: its last token must run.
        let mut tc = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut tc, &a[..32]), 31);
        assert_eq!(tc.blocks[0], ta.blocks[0]);
        assert!(!ta.blocks.contains(&tc.blocks[1]));
        // A different first token shares nothing.
        let mut td = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut td, &[7; 40]), 0);
        p.free_table(&mut ta);
        p.free_table(&mut tb);
        p.free_table(&mut tc);
        assert_eq!(p.used(), 0);
    }

    #[test]
    fn the_next_turn_takes_over_the_last_partial_block_up_to_the_first_token_that_differs() {
        let mut p = pool(8);
        // A turn of 40 positions ends: two full blocks and a tail of 8.
        let turn: Vec<u32> = (0..40).collect();
        let mut t = filled(&mut p, &turn);
        p.write(&t, 0, 37, &[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0]);
        let tail = t.blocks[2];
        p.free_table_keeping_tail(&mut t, &turn);
        assert_eq!((p.used(), p.held_bytes()), (0, 3 * p.shape().block_bytes()), "kept, idle");
        // The next turn continues the same 40 tokens: it starts at 40 in the same block, whose
        // written positions are untouched.
        let next: Vec<u32> = (0..40).chain([77, 78]).collect();
        let mut n = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut n, &next), 40);
        assert_eq!(n.blocks[2], tail);
        assert_eq!(key_at(&p, tail, 0, 37 % BLOCK_TOKENS), 1.0);
        assert_eq!(p.used(), 3);
        // Taken over, it is no one else's: a second request with the same tokens gets the full
        // blocks only.
        let mut again = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut again, &next), 32);
        p.free_table(&mut again);
        p.free_table(&mut n);
        // A request that parts from the tail's tokens at position 35 reuses up to there; one
        // that would reuse all of it still computes its last token.
        let mut t = filled(&mut p, &turn);
        p.free_table_keeping_tail(&mut t, &turn);
        let parted: Vec<u32> = (0..35).chain([99, 98, 97]).collect();
        let mut a = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut a, &parted), 35);
        p.free_table_keeping_tail(&mut a, &parted[..35]);
        let mut b = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut b, &turn[..35]), 34, "the last token must run");
        p.free_table(&mut b);
    }

    #[test]
    fn a_regenerated_answer_starts_on_a_copy_of_the_blocks_first_positions_that_it_shares() {
        let mut p = pool(8);
        // A prompt of 37 tokens and an answer of 13: full blocks 0-2 (block 2: prompt 32..37,
        // answer 37..48) and a tail.
        let turn: Vec<u32> = (0..50).collect();
        let mut t = filled(&mut p, &turn);
        p.write(&t, 1, 35, &[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0]);
        p.write(&t, 1, 36, &[9.0; 4], &[9.0; 4]);
        let shared = t.blocks[2];
        p.free_table_keeping_tail(&mut t, &turn);
        // The same prompt again: two full blocks, then positions 32..36 copied into a new block
        // (36, the prompt's last, runs).
        let mut r = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut r, &turn[..37]), 36);
        assert_eq!(r.blocks.len(), 3);
        assert_ne!(r.blocks[2], shared);
        assert_eq!(key_at(&p, r.blocks[2], 1, 35 % BLOCK_TOKENS), 1.0, "copied");
        // The request writes its own position 36; the shared block keeps the answer's.
        p.write(&r, 1, 36, &[-1.0; 4], &[-1.0; 4]);
        assert_eq!(key_at(&p, shared, 1, 36 % BLOCK_TOKENS), 9.0);
        assert_eq!(p.used(), 3, "blocks 0, 1 and the copy; the shared block is idle");
        // The shared block still starts a request on the whole turn.
        let mut whole = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut whole, &[&turn[..], &[1]].concat()), 50);
        p.free_table(&mut whole);
        p.free_table(&mut r);
        // A block stored lower is no exact source: no copy, the full blocks only.
        let mut t = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut t, &[&turn[..], &[1]].concat()), 48, "the tail went with `whole`");
        assert!(p.set_level(&t, 2, None, Level::Int8));
        let mut r = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut r, &turn[..37]), 32);
        p.free_table(&mut r);
        p.free_table(&mut t);
        assert_eq!(p.held_bytes(), p.stored_bytes());
        // Nothing unlists a continuation; past a bound the stale ones go, so many unrelated
        // prompts leave a bounded list.
        for i in 0..300 {
            let mut t = filled(&mut p, &[[1000 + i; 16], [1; 16]].concat());
            p.free_table(&mut t);
        }
        assert!(p.continuations.len() <= 2 * 64 + 1, "{}", p.continuations.len());
    }

    #[test]
    fn a_tail_replaces_the_one_before_it_and_gives_its_bytes_back_when_the_pool_needs_them() {
        let shape = Shape { layers: 2, kv_heads: 1, head_dim: 4 };
        let mut p = KvPool::new(shape, 8).with_budget(3 * shape.block_bytes());
        let a: Vec<u32> = (0..20).collect();
        let b: Vec<u32> = (0..16).chain([50, 51]).collect();
        let mut ta = filled(&mut p, &a);
        p.free_table_keeping_tail(&mut ta, &a);
        let mut tb = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut tb, &b), 16, "the tail holds 16..20, b parts at 16");
        p.reserve(&mut tb, 2).unwrap();
        tb.len = b.len();
        p.free_table_keeping_tail(&mut tb, &b);
        // One tail per prefix: b's replaced a's, whose storage went back.
        assert_eq!(p.held_bytes(), 2 * shape.block_bytes());
        let mut c = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut c, &a), 16);
        p.free_table(&mut c);
        assert_eq!(p.attach_prefix(&mut c, &[&b[..], &[1]].concat()), 18);
        p.free_table(&mut c);
        // Idle tails are a cache: three fresh blocks take them back.
        let mut full = filled(&mut p, &[3; 48]);
        assert_eq!(p.used(), 3);
        assert_eq!(p.held_bytes(), p.stored_bytes());
        p.free_table(&mut full);
    }

    #[test]
    fn released_blocks_stay_reusable_until_the_pool_needs_them() {
        let mut p = pool(3);
        let a: Vec<u32> = (0..33).collect();
        let mut ta = filled(&mut p, &a);
        p.free_table(&mut ta);
        assert_eq!((p.used(), p.available()), (0, 3));
        let mut tb = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut tb, &a), 32, "idle blocks are still indexed");
        p.free_table(&mut tb);
        // Three fresh blocks for unrelated tokens take the idle ones back, oldest first.
        let mut tc = filled(&mut p, &[5; 48]);
        let mut td = BlockTable::default();
        assert_eq!(p.attach_prefix(&mut td, &a), 0);
        assert!(p.reserve(&mut td, 1).is_err(), "every block is in use");
        p.free_table(&mut tc);
        assert!(p.reserve(&mut td, 1).is_ok());
    }

    #[test]
    fn a_byte_budget_admits_blocks_as_levels_shrink_them_and_idle_blocks_give_theirs_back() {
        let shape = Shape { layers: 2, kv_heads: 1, head_dim: 64 };
        let mut p = KvPool::new(shape, 16).with_budget(4 * shape.block_bytes());
        let a: Vec<u32> = (0..64).collect();
        let mut ta = filled(&mut p, &a);
        assert_eq!((p.available(), p.pressure()), (0, 1.0));
        assert!(p.reserve(&mut BlockTable::default(), 1).is_err(), "16 blocks by count, 4 by bytes");
        for i in 0..4 {
            p.set_level(&ta, i, None, Level::Int4);
        }
        assert_eq!(p.available(), 2, "four int4 blocks leave room for two f16 ones");
        // Released, the indexed blocks stay as a cache that does not count as pressure and is
        // taken back when a new block needs the bytes.
        p.free_table(&mut ta);
        assert_eq!((p.used(), p.pressure()), (0, 0.0));
        let mut tb = filled(&mut p, &[9; 64]);
        assert_eq!(p.used(), 4);
        assert_eq!(p.held_bytes(), p.stored_bytes());
        assert_eq!(p.attach_prefix(&mut BlockTable::default(), &a), 0, "the cache was taken back");
        p.free_table(&mut tb);
    }

    #[test]
    fn writes_land_in_the_right_block_and_slot() {
        let mut p = pool(4);
        let t = filled(&mut p, &[1; 20]);
        p.write(&t, 1, 17, &[1.0, 2.0, 3.0, 4.0], &[-1.0, -2.0, -3.0, -4.0]);
        let LayerBlock::F16 { k, v } = p.layer(t.blocks[1], 1) else { panic!("written blocks are f16") };
        assert_eq!(k[4..8].iter().map(|x| x.to_f32()).collect::<Vec<_>>(), [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(v[4].to_f32(), -1.0);
        let LayerBlock::F16 { k, .. } = p.layer(t.blocks[1], 0) else { panic!("written blocks are f16") };
        assert!(k.iter().all(|x| x.to_f32() == 0.0));
    }

    /// The slice conversion rounds every value as `f16::from_f32` does: ties, values below the
    /// smallest normal, past the largest finite, signed zero, infinities.
    #[test]
    fn writes_round_each_value_as_f16_from_f32_does() {
        let mut p = KvPool::new(Shape { layers: 1, kv_heads: 2, head_dim: 12 }, 2);
        let t = filled(&mut p, &[1; 3]);
        let k = [
            0.1,
            1.0 + 2f32.powi(-11),
            3e-6,
            -7e-8,
            65519.0,
            65520.0,
            -1e9,
            -0.0,
            f32::INFINITY,
            1.0 / 3.0,
            -2.5,
            6e-5,
        ];
        let v: Vec<f32> = k.iter().chain(&k).map(|x| x * -1.7).collect();
        let k: Vec<f32> = k.iter().chain(&k).copied().collect();
        p.write(&t, 0, 2, &k, &v);
        let LayerBlock::F16 { k: kb, v: vb } = p.layer(t.blocks[0], 0) else { panic!("written blocks are f16") };
        for h in 0..2 {
            let at = (h * BLOCK_TOKENS + 2) * 12;
            for c in 0..12 {
                assert_eq!(kb[at + c].to_bits(), half::f16::from_f32(k[h * 12 + c]).to_bits(), "key {h} {c}");
                assert_eq!(vb[at + c].to_bits(), half::f16::from_f32(v[h * 12 + c]).to_bits(), "value {h} {c}");
            }
        }
    }

    /// Blocks reserved on a thread pool get their storage zeroed there, every layer, also
    /// where the arena hands back chunks that held another block's values; the budget's
    /// account follows.
    #[test]
    fn blocks_reserved_on_a_pool_are_zeroed_in_every_layer() {
        let threads = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let shape = Shape { layers: 3, kv_heads: 2, head_dim: 8 };
        let mut p = KvPool::new(shape, 16);
        for round in 0..2 {
            let mut t = BlockTable::default();
            threads.install(|| p.reserve(&mut t, 5 * BLOCK_TOKENS - 3)).unwrap();
            assert_eq!(t.blocks.len(), 5);
            assert_eq!(p.held_bytes(), 5 * shape.block_bytes());
            assert_eq!(p.stored_bytes(), p.held_bytes());
            for &id in &t.blocks {
                for l in 0..3 {
                    let LayerBlock::F16 { k, v } = p.layer(id, l) else { panic!("new blocks are f16") };
                    assert!(k.iter().chain(v.iter()).all(|x| x.to_bits() == 0), "round {round}: block {id} layer {l}");
                }
            }
            // Values in every slot, then the blocks go back unindexed, their chunks free.
            t.len = 5 * BLOCK_TOKENS - 3;
            for pos in 0..t.len {
                (0..3).for_each(|l| p.write(&t, l, pos, &[1.5; 16], &[-2.5; 16]));
            }
            p.free_table(&mut t);
            assert_eq!(p.held_bytes(), 0);
        }
    }

    #[test]
    fn promotion_brings_back_the_f16_values_exactly_within_the_budget() {
        let shape = Shape { layers: 2, kv_heads: 1, head_dim: 64 };
        let mut p = KvPool::new(shape, 4).with_budget(3 * shape.block_bytes());
        p.enable_spill().unwrap();
        let mut t = BlockTable::default();
        p.reserve(&mut t, 48).unwrap();
        t.len = 48;
        for pos in 0..48 {
            let k: Vec<f32> = (0..64).map(|c| (pos * 64 + c) as f32 * 0.00137).collect();
            let v: Vec<f32> = k.iter().map(|x| -x * 3.1).collect();
            (0..2).for_each(|l| p.write(&t, l, pos, &k, &v));
        }
        let bits = |p: &KvPool, id: BlockId| -> Vec<Vec<u16>> {
            (0..2)
                .map(|l| match p.layer(id, l) {
                    LayerBlock::F16 { k, v } => k.iter().chain(v.iter()).map(|x| x.to_bits()).collect(),
                    _ => Vec::new(),
                })
                .collect()
        };
        let before: Vec<_> = t.blocks.iter().map(|&id| bits(&p, id)).collect();
        assert!(p.set_level(&t, 0, None, Level::Int4));
        assert!(p.set_level(&t, 1, Some(0), Level::Int8));
        assert!(p.evict(&t, 2));
        assert_eq!(p.spilled(), 5, "every layer that left f16 has its copy");
        assert!(p.restorable(&t, 0) && p.restorable(&t, 2));
        // Up to int8 first: from the f16 copy, which stays.
        assert!(p.promote(&t, 0, Level::Int8));
        assert_eq!(p.level(&t, 0), Level::Int8);
        assert_eq!(p.spilled(), 5);
        for (i, want) in before.iter().enumerate() {
            assert!(p.promote(&t, i, Level::F16));
            assert_eq!(&bits(&p, t.blocks[i]), want, "block {i} is bit for bit what was written");
        }
        assert!(!p.promote(&t, 0, Level::F16), "nothing left to promote");
        assert_eq!((p.spilled(), p.level_counts()), (0, [6, 0, 0, 0]));
        assert_eq!(p.held_bytes(), p.stored_bytes());
        // No room in the budget: a block stays where it is, its copy kept.
        assert!(p.set_level(&t, 0, None, Level::Int4) && p.set_level(&t, 1, None, Level::Int4));
        let mut other = BlockTable::default();
        p.reserve(&mut other, 16).unwrap();
        assert!(!p.promote(&t, 0, Level::F16) || !p.promote(&t, 1, Level::F16), "the budget holds three f16 blocks");
        assert!(p.held_bytes() <= p.budget());
        // Freed blocks give their copies back (unindexed ones at once; indexed ones once reclaimed).
        p.free_table(&mut t);
        p.free_table(&mut other);
        assert_eq!(p.spilled(), 0);
    }

    #[test]
    fn only_full_blocks_change_level_and_a_reused_block_starts_again_in_f16() {
        let mut p = pool(2); // the second table must reuse both blocks
        let mut t = filled(&mut p, &[1; 20]); // one full block, one partial
        let f16_bytes = p.stored_bytes();
        assert!(!p.set_level(&t, 1, None, Level::Int8), "a partial block keeps f16");
        assert!(!p.set_level(&t, 2, None, Level::Int8), "past the table");
        assert!(p.set_level(&t, 0, Some(1), Level::Int4));
        assert_eq!(p.level_counts(), [3, 0, 1, 0]);
        assert!(p.set_level(&t, 0, None, Level::Int8), "layer 0 goes down; layer 1 is int4 already");
        assert_eq!(p.level_counts(), [2, 1, 1, 0]);
        assert!(p.stored_bytes() < f16_bytes);
        assert_eq!(p.held_bytes(), p.stored_bytes());
        assert!(!p.set_level(&t, 0, None, Level::Int8), "levels only go down");
        assert!(p.set_level(&t, 0, None, Level::Int4));
        assert_eq!((p.level(&t, 0), p.level_counts()), (Level::Int4, [2, 0, 2, 0]));
        assert!(p.evict(&t, 0));
        assert_eq!(p.held_bytes(), p.stored_bytes());
        p.free_table(&mut t);
        assert_eq!(p.held_bytes(), 0, "free blocks hold no storage");
        let t = filled(&mut p, &[2; 32]);
        assert!(t.blocks.iter().all(|&id| (0..2).all(|l| p.layer(id, l).level() == Level::F16)));
        assert_eq!(p.level_counts(), [4, 0, 0, 0]);
        assert_eq!(p.held_bytes(), 2 * p.shape().block_bytes());
    }
}
