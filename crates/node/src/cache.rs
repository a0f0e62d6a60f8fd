//! Exact-match cache for temperature-0 generations (spec 003 Part 3): the same model, prompt and
//! settings give the same answer, so it is replayed instead of computed. LRU, bounded in bytes
//! (default 5% of RAM), and off with `cache_bytes = 0`.

use lru::LruCache;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

/// Everything that decides a greedy generation's output.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub model: String,
    pub prompt: String,
    /// The other settings, rendered canonically (penalties, stops, max tokens...).
    pub settings: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedGeneration {
    /// The text as the engine streamed it, piece by piece, so a streamed replay looks the same.
    pub pieces: Vec<String>,
    pub finish_stop: bool,
    pub stop_index: Option<u32>,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

impl CachedGeneration {
    fn bytes(&self, key: &CacheKey) -> usize {
        key.model.len()
            + key.prompt.len()
            + key.settings.len()
            + self.pieces.iter().map(|p| p.len() + 24).sum::<usize>()
            + 128
    }
}

pub struct GenerationCache {
    inner: Mutex<Inner>,
    limit: usize,
}

struct Inner {
    map: LruCache<u64, (CacheKey, CachedGeneration)>,
    bytes: usize,
}

fn hash(key: &CacheKey) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

impl GenerationCache {
    pub fn new(limit_bytes: usize) -> Self {
        GenerationCache { inner: Mutex::new(Inner { map: LruCache::unbounded(), bytes: 0 }), limit: limit_bytes }
    }

    pub fn enabled(&self) -> bool {
        self.limit > 0
    }

    pub fn get(&self, key: &CacheKey) -> Option<CachedGeneration> {
        if !self.enabled() {
            return None;
        }
        let mut inner = self.inner.lock().unwrap();
        // The full key is compared: a 64-bit hash collision must not return another prompt's answer.
        match inner.map.get(&hash(key)) {
            Some((k, v)) if k == key => Some(v.clone()),
            _ => None,
        }
    }

    pub fn put(&self, key: CacheKey, value: CachedGeneration) {
        let size = value.bytes(&key);
        if !self.enabled() || size > self.limit {
            return;
        }
        let mut inner = self.inner.lock().unwrap();
        if let Some((k, v)) = inner.map.put(hash(&key), (key.clone(), value)) {
            inner.bytes -= v.bytes(&k);
        }
        inner.bytes += size;
        while inner.bytes > self.limit {
            match inner.map.pop_lru() {
                Some((_, (k, v))) => inner.bytes -= v.bytes(&k),
                None => break,
            }
        }
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes(&self) -> usize {
        self.inner.lock().unwrap().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: &str) -> CacheKey {
        CacheKey { model: "m".into(), prompt: p.into(), settings: "t=0".into() }
    }

    fn gen(text: &str) -> CachedGeneration {
        CachedGeneration {
            pieces: vec![text.into()],
            finish_stop: true,
            stop_index: None,
            prompt_tokens: 3,
            completion_tokens: 1,
        }
    }

    #[test]
    fn hits_misses_and_lru_eviction_by_bytes() {
        let one = gen("x").bytes(&key("a"));
        let c = GenerationCache::new(one * 2);
        c.put(key("a"), gen("x"));
        c.put(key("b"), gen("x"));
        assert_eq!(c.get(&key("a")), Some(gen("x")));
        c.put(key("c"), gen("x"));
        // "b" was least recently used.
        assert!(c.get(&key("b")).is_none());
        assert!(c.get(&key("a")).is_some() && c.get(&key("c")).is_some());
        assert!(c.bytes() <= one * 2);
        let mut other = key("a");
        other.settings = "t=0,max=5".into();
        assert!(c.get(&other).is_none());
    }

    #[test]
    fn disabled_cache_stores_nothing() {
        let c = GenerationCache::new(0);
        c.put(key("a"), gen("x"));
        assert!(c.get(&key("a")).is_none() && c.is_empty());
    }
}
