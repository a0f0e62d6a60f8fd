//! Saved prefixes (spec 003 Part 5): the KV state of sequences that went idle, copied to host
//! memory and kept least-recently-used first within a byte budget.
//!
//! Why: in a unified KV cache an idle sequence's cells stay where they are, and every later
//! batch's attention spans all cells up to the highest one in use, so idle caches slow everyone
//! (measured in bench/RESULTS.md, cause A). The scheduler therefore moves idle caches here and
//! clears them from the KV cache when a new request is admitted; a later request sharing a prefix
//! gets it back with one state copy instead of a prefill.
//!
//! Generic over the token type `T` (the llama.cpp plugin keeps `LlamaToken`s, an engine of its
//! own plain `u32` ids) and the saved state `S`, so it knows nothing of any engine.

struct Entry<T, S> {
    tokens: Vec<T>,
    state: S,
    bytes: usize,
    used: u64,
}

/// Token sequences of type `T` with their saved state `S` (llama.cpp's `SeqState` in the
/// llama.cpp plugin; anything in the unit tests).
pub struct PrefixStore<T, S> {
    entries: Vec<Entry<T, S>>,
    bytes: usize,
    budget: usize,
    clock: u64,
}

impl<T: Eq, S> PrefixStore<T, S> {
    pub fn new(budget: usize) -> Self {
        PrefixStore { entries: Vec::new(), bytes: 0, budget, clock: 0 }
    }

    /// A budget of 0 turns saving off: idle caches then stay in the KV cache.
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    pub fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
        self.evict_to(budget);
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// The entry sharing the longest leading run of tokens with `tokens`: (entry, length).
    pub fn best(&self, tokens: &[T]) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, tokens)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(i, n)| (n, self.entries[i].used))
    }

    /// How many tokens entry `i` holds (what a restore copies).
    pub fn tokens_len(&self, i: usize) -> usize {
        self.entries[i].tokens.len()
    }

    /// Entry `i`'s tokens and state, marked as just used.
    pub fn get(&mut self, i: usize) -> (&[T], &S) {
        self.clock += 1;
        let e = &mut self.entries[i];
        e.used = self.clock;
        (&e.tokens, &e.state)
    }

    /// Whether saving `tokens` would add nothing: an entry holds them or a sequence they begin.
    pub fn covers(&self, tokens: &[T]) -> bool {
        self.entries.iter().any(|e| e.tokens.starts_with(tokens))
    }

    /// Saves a state of `bytes` bytes for `tokens`. Entries that are a prefix of `tokens` go (the
    /// new state holds them too); then the least recently used until it fits. A state larger than
    /// the whole budget is not kept. Returns whether it was kept.
    pub fn insert(&mut self, tokens: Vec<T>, state: S, bytes: usize) -> bool {
        if bytes > self.budget {
            return false;
        }
        let mut i = 0;
        while i < self.entries.len() {
            if tokens.starts_with(&self.entries[i].tokens) {
                self.bytes -= self.entries.swap_remove(i).bytes;
            } else {
                i += 1;
            }
        }
        self.evict_to(self.budget - bytes);
        self.clock += 1;
        self.bytes += bytes;
        self.entries.push(Entry { tokens, state, bytes, used: self.clock });
        true
    }

    fn evict_to(&mut self, limit: usize) {
        while self.bytes > limit {
            let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used) else { break };
            self.bytes -= self.entries.swap_remove(oldest).bytes;
        }
    }
}

/// How many leading tokens `a` and `b` share.
pub fn common_prefix<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token type like llama.cpp's (a wrapped `i32`), to show the store needs nothing more.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Tok(i32);

    fn toks(ids: &[i32]) -> Vec<Tok> {
        ids.iter().map(|&i| Tok(i)).collect()
    }

    #[test]
    fn the_longest_shared_prefix_wins() {
        let mut s = PrefixStore::new(100);
        s.insert(toks(&[1, 2, 3]), "a", 10);
        s.insert(toks(&[1, 2, 9, 9]), "b", 10);
        assert_eq!(s.best(&toks(&[1, 2, 9, 5])), Some((1, 3)));
        assert_eq!(s.best(&toks(&[1, 2, 3, 4])), Some((0, 3)));
        assert_eq!(s.best(&toks(&[7])), None);
        assert_eq!(*s.get(1).1, "b");
    }

    #[test]
    fn a_longer_sequence_replaces_its_prefixes_and_covers_them() {
        let mut s = PrefixStore::new(100);
        s.insert(toks(&[1, 2]), "short", 10);
        s.insert(toks(&[5]), "other", 10);
        assert!(s.insert(toks(&[1, 2, 3]), "long", 20));
        assert_eq!((s.len(), s.bytes()), (2, 30));
        assert!(s.covers(&toks(&[1, 2])));
        assert!(s.covers(&toks(&[1, 2, 3])));
        assert!(!s.covers(&toks(&[1, 2, 3, 4])));
    }

    #[test]
    fn the_least_recently_used_go_first_and_the_budget_holds() {
        let mut s = PrefixStore::new(30);
        s.insert(toks(&[1]), 1, 10);
        s.insert(toks(&[2]), 2, 10);
        s.insert(toks(&[3]), 3, 10);
        let (i, _) = s.best(&toks(&[1])).unwrap();
        s.get(i); // [1] is now the most recently used
        s.insert(toks(&[4]), 4, 15);
        assert!(s.bytes() <= 30);
        assert!(s.best(&toks(&[1])).is_some(), "recently used survives");
        assert!(s.best(&toks(&[2])).is_none() && s.best(&toks(&[3])).is_none());
        assert!(!s.insert(toks(&[5]), 5, 31), "larger than the budget");
        s.set_budget(0);
        assert_eq!((s.len(), s.bytes(), s.enabled()), (0, 0, false));
    }
}
