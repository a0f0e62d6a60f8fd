//! Sliding-window caches that hold each sequence's window, not every position (llama.cpp's
//! `swa_full` off, the default here): a sequence can go on from the end of its cache, or from a
//! little before it (the cache keeps its window plus a batch), but a prompt that parts from it
//! further back needs positions the window layers no longer hold. Decoding on regardless would
//! answer from a context with a hole in it, fluently and wrongly, so such a prompt resumes from a
//! context checkpoint (the window layers' state where an earlier prompt ended, saved in host
//! memory, as llama-server's `--ctx-checkpoints` does) or is read again from the start.

use super::Scheduler;
use llama_cpp_2::context::session::{LlamaStateSeqFlags, SeqState};
use std::sync::atomic::Ordering;

/// Prompts shorter than this get no checkpoint: reading them again costs little.
const MIN_CHECKPOINT_TOKENS: usize = 64;

/// The window layers' state of one sequence after its first `tokens` tokens.
pub(super) struct Checkpoint {
    pub(super) tokens: usize,
    state: SeqState,
}

/// Whether a cache whose oldest held position is `oldest` (-1: none) still holds what the token
/// at position `n` looks back over in a window of `window` tokens (0: no window-sized cache):
/// every position from `n + 1 - window` on (llama.cpp masks a position `window` or more before
/// the query). A saved state (a checkpoint, a prefix in host memory) holds exactly the window
/// before its end, so it serves a prompt that goes on from its end (or from its last token).
pub(super) fn window_intact(oldest: i32, n: usize, window: u32) -> bool {
    if window == 0 || n == 0 {
        return true;
    }
    oldest >= 0 && i64::from(oldest) <= (n as i64 + 1 - i64::from(window)).max(0)
}

impl Scheduler<'_> {
    /// The window of this context's sliding layers when they hold only the window (0: the cache
    /// keeps every position, or the model has no sliding layers).
    pub(super) fn window(&self) -> u32 {
        if self.settings.swa_full {
            0
        } else {
            self.n_swa
        }
    }

    /// Whether slot `i`'s cache can go on after its first `n` tokens.
    pub(super) fn intact_at(&self, i: usize, n: usize) -> bool {
        let window = self.window();
        window == 0 || window_intact(self.ctx.kv_cache_seq_pos_min(self.slots[i].seq), n, window)
    }

    /// Cuts slot `i`'s cache back to its first `n` tokens and returns how many it keeps: `n` where
    /// the window there is still held, else the tokens of the latest checkpoint at or before `n`
    /// (restored), else none.
    pub(super) fn rewind(&mut self, i: usize, n: usize) -> usize {
        let seq = self.slots[i].seq;
        let n = n.min(self.slots[i].cached.len());
        if self.intact_at(i, n) && self.ctx.kv_cache_seq_rm(seq, Some(n as u32), None).is_ok() {
            self.slots[i].cached.truncate(n);
            self.forget_checkpoints(i, n);
            return n;
        }
        let usable = self.slots[i].checkpoints.iter().rposition(|c| c.tokens <= n);
        if let Some(k) = usable {
            let tokens = self.slots[i].checkpoints[k].tokens;
            let restored = self.ctx.state_seq_set(&self.slots[i].checkpoints[k].state, seq).is_ok()
                && self.ctx.kv_cache_seq_rm(seq, Some(tokens as u32), None).is_ok();
            if restored {
                self.slots[i].cached.truncate(tokens);
                self.forget_checkpoints(i, tokens);
                self.stats.ctx_checkpoints_restored_total.fetch_add(1, Ordering::Relaxed);
                return tokens;
            }
        }
        // Nothing to resume from (or a sequence llama.cpp cannot cut: recurrent state): start over.
        if n > 0 && self.window() > 0 {
            self.stats.window_reprocessed_total.fetch_add(1, Ordering::Relaxed);
        }
        self.clear_slot(i);
        0
    }

    /// Empties slot `i`'s cache, checkpoints included.
    pub(super) fn clear_slot(&mut self, i: usize) {
        let _ = self.ctx.clear_kv_cache_seq(Some(self.slots[i].seq as u32), None, None);
        self.slots[i].cached.clear();
        self.slots[i].moved_from = None;
        self.forget_checkpoints(i, 0);
    }

    /// Drops slot `i`'s checkpoints past its first `n` tokens: they describe a cache that is gone.
    pub(super) fn forget_checkpoints(&mut self, i: usize, n: usize) {
        self.slots[i].checkpoints.retain(|c| c.tokens <= n);
        self.publish_checkpoints();
    }

    /// Saves the window layers' state of slot `i`, whose prompt was just read, dropping its oldest
    /// checkpoint past `ctx_checkpoints`.
    pub(super) fn checkpoint(&mut self, i: usize) {
        let limit = self.step.ctx_checkpoints as usize;
        let tokens = self.slots[i].cached.len();
        let slot = &self.slots[i];
        if self.window() == 0
            || limit == 0
            || tokens < MIN_CHECKPOINT_TOKENS
            || slot.checkpoints.last().is_some_and(|c| c.tokens == tokens)
        {
            return;
        }
        match self.ctx.state_seq_get(slot.seq, LlamaStateSeqFlags::PARTIAL_ONLY) {
            Ok(state) => {
                self.slots[i].checkpoints.push(Checkpoint { tokens, state });
                self.stats.ctx_checkpoints_saved_total.fetch_add(1, Ordering::Relaxed);
                self.trim_checkpoints();
            }
            Err(e) => self.logger.warn(&format!("could not take a context checkpoint: {e}")),
        }
    }

    /// Keeps each slot's latest `ctx_checkpoints`.
    pub(super) fn trim_checkpoints(&mut self) {
        let limit = self.step.ctx_checkpoints as usize;
        for slot in &mut self.slots {
            let over = slot.checkpoints.len().saturating_sub(limit);
            slot.checkpoints.drain(..over);
        }
        self.publish_checkpoints();
    }

    fn publish_checkpoints(&self) {
        let bytes: usize = self.slots.iter().flat_map(|s| &s.checkpoints).map(|c| c.state.byte_len()).sum();
        self.stats.ctx_checkpoint_bytes.store(bytes as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::window_intact;

    #[test]
    fn a_window_is_intact_where_every_position_it_looks_back_over_is_held() {
        // No window-sized cache, or nothing to look back over.
        assert!(window_intact(900, 1000, 0));
        assert!(window_intact(-1, 0, 512));
        // A cache that still starts at 0 holds everything before any position.
        assert!(window_intact(0, 300, 512));
        assert!(window_intact(0, 5000, 512));
        // Going on at 2000 looks back to 1489: held from 1400 or from 1489, not from 1490.
        assert!(window_intact(1400, 2000, 512));
        assert!(window_intact(1489, 2000, 512));
        assert!(!window_intact(1490, 2000, 512));
        // A saved window (positions 1488..=1999) serves a prompt going on at 2000, or at 1999
        // (its last token computed again), not before.
        assert!(window_intact(1488, 2000, 512));
        assert!(window_intact(1488, 1999, 512));
        assert!(!window_intact(1488, 1998, 512));
        // Empty (or cut above) the window's start.
        assert!(!window_intact(-1, 2000, 512));
        assert!(!window_intact(100, 300, 512));
    }
}
