//! Where a new request's prefix comes from, and where idle caches go: slots' caches shared by
//! `seq_cp`, and the saved prefixes of `llmr_sampling::PrefixStore` (copied out when a request
//! is admitted, copied back by `state_seq_set`), at int8 under a dynamic KV policy
//! (`packed_state.rs`).

use super::packed_state::PackedState;
use super::window::window_intact;
use super::{separate_streams, Scheduler};
use llama_cpp_2::context::session::{LlamaStateSeqFlags, SeqState};
use llama_cpp_2::token::LlamaToken;
use llmr_sampling::common_prefix;
use std::sync::atomic::Ordering;

/// How many runs of consecutive ids the sequences `running` (ascending) and `joining` make.
pub(super) fn runs_with(running: &[usize], joining: usize) -> usize {
    let mut ids: Vec<usize> = running.iter().copied().chain([joining]).collect();
    ids.sort_unstable();
    runs(&ids)
}

/// Runs of consecutive values in ascending `ids`: the forward passes llama.cpp makes of a step
/// over separate KV streams.
pub(super) fn runs(ids: &[usize]) -> usize {
    ids.windows(2).filter(|w| w[1] != w[0] + 1).count() + usize::from(!ids.is_empty())
}

/// An idle cache in host memory: as llama.cpp saved it, or at int8.
pub(super) enum Saved {
    Exact(SeqState),
    Int8(PackedState),
}

impl Saved {
    fn byte_len(&self) -> usize {
        match self {
            Saved::Exact(s) => s.byte_len(),
            Saved::Int8(p) => p.byte_len(),
        }
    }
}

/// Idle caches shorter than this are dropped, not saved: reading them again costs little.
const MIN_SAVED_TOKENS: usize = 32;
/// A saved prefix is restored only when it spares at least this many prompt tokens (and at
/// least a quarter of the tokens the restore copies).
const MIN_RESTORED_TOKENS: usize = 16;
/// Between separate KV streams a prefix is copied with the whole stream (`ctx_per_seq` cells:
/// 190 MB for SmolLM2 at 8192, some 40 ms of memory traffic on a small CPU, about what 16 prompt
/// tokens cost there): only for a prefix that spares clearly more.
const MIN_COPIED_TOKENS: usize = 64;

impl Scheduler<'_> {
    /// The free slot a job should take: the one whose cache shares the longest prefix with it,
    /// else the least recently used. Between separate KV streams, first one that keeps the
    /// running sequences in as few runs of consecutive ids as it can: llama.cpp decodes each run
    /// as a forward pass of its own (`split_equal` takes consecutive sequence ids only), so
    /// sequences on slots 0 and 2 cost two passes a step where slots 0 and 1 cost one. A prefix
    /// held by a slot passed over is copied from it (`reuse_prefix`).
    pub(super) fn free_slot_for(&self, tokens: Option<&[LlamaToken]>) -> Option<usize> {
        let tokens = tokens?;
        let separate = separate_streams(&self.settings);
        let running: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i].active.is_some()).collect();
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.active.is_none())
            .max_by_key(|(i, s)| {
                let runs = if separate { runs_with(&running, *i) } else { 0 };
                (std::cmp::Reverse(runs), common_prefix(s.prefix(), tokens), std::cmp::Reverse(s.last_used))
            })
            .map(|(i, _)| i)
    }

    /// Prepares slot `target` for `tokens` and returns how many leading tokens are already in
    /// its cache. At least one prompt token is always decoded, to get logits.
    pub(super) fn reuse_prefix(&mut self, target: usize, tokens: &[LlamaToken]) -> usize {
        let limit = tokens.len().saturating_sub(1);
        let own = common_prefix(self.slots[target].prefix(), tokens).min(limit);
        let (best_src, best) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != target)
            .map(|(i, s)| (i, common_prefix(s.prefix(), tokens).min(limit)))
            .max_by_key(|(_, n)| *n)
            .unwrap_or((target, 0));
        if let Some((entry, n)) = self.saved.best(tokens) {
            let n = n.min(limit);
            let saved_len = self.saved.tokens_len(entry);
            // A restore copies the whole saved sequence: worth it only for a good part of it. A
            // window-sized sliding cache saves only the window before its end (`window.rs`).
            let worth = n >= MIN_RESTORED_TOKENS && n * 4 >= saved_len && (self.window() == 0 || n + 1 >= saved_len);
            if n > own.max(best) && worth && self.restore(target, entry, n) {
                return n;
            }
        }
        let seq = self.slots[target].seq;
        let separate = separate_streams(&self.settings);
        // Between separate streams llama.cpp copies the whole stream (it takes no range). A
        // window-sized sliding cache must still hold the window where the prefix ends.
        if best > own && (!separate || best >= own + MIN_COPIED_TOKENS) && self.intact_at(best_src, best) {
            let src = self.slots[best_src].seq;
            let copied = self.ctx.clear_kv_cache_seq(Some(seq as u32), None, None).is_ok()
                && if separate {
                    self.ctx.kv_cache_seq_cp(src, seq, None, None).is_ok()
                        && self.ctx.kv_cache_seq_rm(seq, Some(best as u32), None).is_ok()
                } else {
                    // Shares the other sequence's cells for the prefix (no copy of the data).
                    self.ctx.kv_cache_seq_cp(src, seq, Some(0), Some(best as u32)).is_ok()
                };
            // The target's own checkpoints describe the cache the copy replaced.
            self.forget_checkpoints(target, 0);
            if copied {
                self.stats.prefix_copies_total.fetch_add(1, Ordering::Relaxed);
                self.slots[target].cached = tokens[..best].to_vec();
                return best;
            }
            // A cache that cannot drop a suffix (recurrent state): start over below.
            self.clear_slot(target);
            return 0;
        }
        // Its own cache, cut back to what the job shares (or to a checkpoint before it, or to
        // nothing: see `window.rs`).
        self.rewind(target, own)
    }

    /// Loads saved entry `entry` into slot `target`, keeping its first `n` tokens.
    fn restore(&mut self, target: usize, entry: usize, n: usize) -> bool {
        let seq = self.slots[target].seq;
        self.clear_slot(target);
        let window = self.window();
        let (tokens, state) = self.saved.get(entry);
        let set = match state {
            Saved::Exact(state) => self.ctx.state_seq_set(state, seq).is_ok(),
            // SAFETY: the bytes are those llama.cpp wrote for a sequence of this context (the
            // store empties when the context is rebuilt) with the values dequantized in place;
            // llama.cpp checks every count, type and size as it reads them.
            Saved::Int8(packed) => unsafe {
                self.ctx.state_seq_set_data_ext(&packed.unpack(), seq, LlamaStateSeqFlags::empty())
            },
        };
        // A window-sized sliding cache saved further on may no longer hold the window at `n`.
        let restored = set
            && window_intact(self.ctx.kv_cache_seq_pos_min(seq), n, window)
            && self.ctx.kv_cache_seq_rm(seq, Some(n as u32), None).is_ok();
        if !restored {
            // No room for its cells (or a state llama.cpp refused): read the prompt instead.
            let _ = self.ctx.clear_kv_cache_seq(Some(seq as u32), None, None);
            return false;
        }
        self.slots[target].cached = tokens[..n].to_vec();
        self.stats.prefix_cache_restored_total.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Copies idle slot `i`'s cache to host memory unless it is short or already saved.
    pub(super) fn save(&mut self, i: usize) {
        let slot = &self.slots[i];
        if !self.saved.enabled() || slot.cached.len() < MIN_SAVED_TOKENS || self.saved.covers(&slot.cached) {
            return;
        }
        let packed = if self.step.idle_int8 && self.shiftable { self.packed(slot.seq) } else { None };
        let state = match packed {
            Some(p) => Ok(Saved::Int8(p)),
            None => self.ctx.state_seq_get(slot.seq, LlamaStateSeqFlags::empty()).map(Saved::Exact),
        };
        match state {
            Ok(state) => {
                let (bytes, int8) = (state.byte_len(), matches!(state, Saved::Int8(_)));
                if self.saved.insert(self.slots[i].cached.clone(), state, bytes) {
                    self.stats.prefix_cache_saved_total.fetch_add(1, Ordering::Relaxed);
                    self.stats.prefix_cache_int8_total.fetch_add(u64::from(int8), Ordering::Relaxed);
                }
            }
            Err(e) => self.logger.warn(&format!("could not save an idle cache: {e}")),
        }
        self.publish_saved();
    }

    /// Sequence `seq`'s state at int8, or `None` where it holds no f16 values or its layout is
    /// not the one `packed_state.rs` reads (it is then saved exact). Only for the architectures
    /// of `model::can_shift`, whose cells carry nothing but positions and sequence ids.
    fn packed(&self, seq: i32) -> Option<PackedState> {
        let size = self.ctx.state_seq_get_size_ext(seq, LlamaStateSeqFlags::empty());
        let mut bytes = vec![0u8; size];
        // SAFETY: `bytes` holds the size llama.cpp just gave for this sequence's state.
        let written = unsafe { self.ctx.state_seq_get_data_ext(bytes.as_mut_ptr(), seq, LlamaStateSeqFlags::empty()) };
        (written == size).then(|| PackedState::pack(&bytes)).flatten()
    }

    /// Clears every idle cache but `except`'s from the KV cache, saving each first (`save` skips
    /// short ones, and everything when saving is off). Returns whether any cells were freed.
    pub(super) fn drop_idle(&mut self, except: Option<usize>) -> bool {
        let mut freed = false;
        for i in 0..self.slots.len() {
            if Some(i) == except || self.slots[i].active.is_some() || self.slots[i].cached.is_empty() {
                continue;
            }
            self.save(i);
            self.clear_slot(i);
            freed = true;
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::{runs, runs_with};

    #[test]
    fn sequences_count_as_runs_of_consecutive_ids() {
        assert_eq!(runs(&[]), 0);
        assert_eq!(runs(&[3]), 1);
        assert_eq!(runs(&[0, 1, 2]), 1);
        assert_eq!(runs(&[0, 2]), 2);
        assert_eq!(runs(&[0, 1, 3, 5, 6]), 3);
        // Slot 1 joins 0 and 2 into one run; slot 3 would leave two.
        assert_eq!(runs_with(&[0, 2], 1), 1);
        assert_eq!(runs_with(&[0, 2], 3), 2);
        assert_eq!(runs_with(&[], 3), 1);
    }
}
