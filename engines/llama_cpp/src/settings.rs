//! Per-model runtime settings: defaults from the instance config, changed through set_config.

use llama_cpp_2::context::params::KvCacheType;
use llmr_engine_sdk::{EngineError, ErrorCode};
use llmr_kv_policy::{KvPolicy, Level, Mode};

/// Settings that shape the llama.cpp context (changing them rebuilds it when idle).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ContextSettings {
    /// Concurrent sequences (continuous batching slots).
    pub slots: u32,
    /// Tokens per sequence (prompt + generation).
    pub ctx_per_seq: u32,
    pub threads: u32,
    pub kv_type: KvType,
    /// Sliding-window layers keep every position of every sequence (llama.cpp's `swa_full`),
    /// instead of each sequence's window plus a batch; a follow-up turn then never needs a
    /// checkpoint, at several times the memory for models whose layers are mostly sliding.
    pub swa_full: bool,
    /// Most KV cells the context gets over all sequences unless one needs more (the `kv_cells`
    /// load option, llama-server's total `-c`); `None`: `DEFAULT_CELL_BUDGET`.
    pub kv_cells: Option<u32>,
}

/// The cell budget unless a model sets one: `slots x ctx_per_seq` cells of a 32k model would
/// reserve gigabytes nobody asked for. Past it the cache is one unified pool the sequences share
/// (`scheduler::separate_streams`), and when its cells run out, idle caches leave first, then the
/// newest sequence is preempted (`Scheduler::make_room`).
pub const DEFAULT_CELL_BUDGET: u32 = 32768;

impl ContextSettings {
    pub fn cell_budget(&self) -> u32 {
        self.kv_cells.unwrap_or(DEFAULT_CELL_BUDGET)
    }
}

/// Settings read at every step (no rebuild).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepSettings {
    /// Most prompt tokens processed in one decode step, so a long prompt never stalls the
    /// sequences that are generating for more than one chunk.
    pub prefill_chunk: u32,
    /// While sequences are generating, a step that also reads prompt tokens may take this many
    /// times a generating-only step (`llmr_sampling::Pacer`); infinite: whole chunks.
    pub prefill_stall: f64,
    /// Host memory for saved prefixes (`llmr_sampling::PrefixStore`), in MiB; 0 keeps idle
    /// caches in the KV cache instead.
    pub prefix_cache_mib: u32,
    /// Prompt-lookup speculation (`llmr_sampling::Speculator`): most draft tokens per sequence
    /// and step, 0 off.
    pub draft_max: u32,
    /// The chance of being kept a draft token needs; `None`: what one more token costs the step,
    /// as measured (`llmr_sampling::StepCost`).
    pub draft_threshold: Option<f64>,
    /// Context checkpoints kept per slot for a sliding-window cache that is not full-size: the
    /// window's state where each prompt ended, so a later prompt that parts from the cache
    /// further back than the window still holds can resume there (0: none).
    pub ctx_checkpoints: u32,
    /// Middle-chunk eviction of a dynamic `kv_policy` (`None`: a sequence ends at its context).
    pub eviction: Option<Eviction>,
    /// Idle caches saved to host memory at int8 (a dynamic `kv_policy`), not as the live cache
    /// holds them.
    pub idle_int8: bool,
}

/// Eviction of middle chunks, the evicted level (L3) of the staged KV cache as llama.cpp can do
/// it without a fork: a generating sequence about to outgrow its context drops half of what lies
/// between its first `sinks` positions (attention sinks) and its last `window`, and the rest
/// moves down (llama.cpp rotates those keys to their new positions), so generation goes on past
/// the context, as the context shift of Ollama and llama-server does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Eviction {
    pub sinks: usize,
    pub window: usize,
}

impl Eviction {
    /// Positions to keep in place at the start: the sinks, or more where `shared` positions are
    /// another sequence's too.
    pub fn keep(&self, shared: usize) -> usize {
        shared.max(self.sinks)
    }

    /// Positions to drop, right after `keep(shared)`, from a sequence of `len` positions: half
    /// (rounded up) of those after the kept ones, never into the window; 0 when the kept
    /// positions and the window fill it.
    pub fn shed(&self, len: usize, shared: usize) -> usize {
        let kept = self.keep(shared);
        let movable = len.saturating_sub(kept + self.window);
        movable.min(len.saturating_sub(kept).div_ceil(2))
    }
}

/// What a `kv_policy` asks of llama.cpp, which keeps one KV type for the whole cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PolicyChange {
    /// A static level's type; `None` (dynamic levels) keeps the type the cache has.
    pub kv_type: Option<KvType>,
    pub eviction: Option<Eviction>,
    pub idle_int8: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Some(Self::F16),
            "q8_0" => Some(Self::Q8_0),
            "q4_0" => Some(Self::Q4_0),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
        }
    }
    /// The staged KV cache's level this type stores (every cell at one level).
    pub fn level(self) -> Level {
        match self {
            Self::F16 => Level::F16,
            Self::Q8_0 => Level::Int8,
            Self::Q4_0 => Level::Int4,
        }
    }

    /// What a `kv_policy` (spec 002; a patch on the baseline, as the node sends whole policies)
    /// asks of llama.cpp: a static level is the type of the whole cache (int8 as q8_0, int4 as
    /// q4_0), without eviction. Per-block levels run in the native engine; of a dynamic policy
    /// this engine keeps the cache's type and does what it can: idle caches saved at int8, and
    /// eviction of middle chunks (unless the profile never evicts: `L3_evict` 0).
    pub fn of_policy(value: &serde_json::Value) -> Result<PolicyChange, EngineError> {
        let policy = KvPolicy::baseline().patched_json(value).map_err(|e| unsupported(e.to_string()))?;
        let kv_type = match (policy.mode, policy.static_level) {
            (Mode::Dynamic, _) => None,
            (Mode::Static, Level::F16) => Some(Self::F16),
            (Mode::Static, Level::Int8) => Some(Self::Q8_0),
            (Mode::Static, Level::Int4) => Some(Self::Q4_0),
            (Mode::Static, Level::Evicted) => {
                return Err(unsupported("kv policy: a static level stores blocks".into()))
            }
        };
        let eviction = (policy.emergency_floor() == Some(Level::Evicted))
            .then_some(Eviction { sinks: policy.sink_tokens, window: policy.recent_window });
        Ok(PolicyChange { kv_type, eviction, idle_int8: policy.mode == Mode::Dynamic })
    }

    pub fn llama(self) -> KvCacheType {
        match self {
            Self::F16 => KvCacheType::F16,
            Self::Q8_0 => KvCacheType::Q8_0,
            Self::Q4_0 => KvCacheType::Q4_0,
        }
    }
}

/// Default CPU threads: every core the process may use. On a shared machine the decode loop
/// does not collapse with this because the OpenMP pool is told not to spin (see lib.rs).
pub fn default_threads() -> u32 {
    std::thread::available_parallelism().map_or(4, |n| n.get() as u32)
}

/// A setting change requested through set_config.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Change {
    KvType(KvType),
    Policy(PolicyChange),
    Threads(u32),
    PrefillChunk(u32),
    PrefillStall(f64),
    PrefixCacheMib(u32),
    DraftMax(u32),
    DraftThreshold(Option<f64>),
    SwaFull(bool),
    CtxCheckpoints(u32),
}

fn unsupported(msg: String) -> EngineError {
    EngineError::new(ErrorCode::Unsupported, msg)
}

pub fn parse_change(key: &str, value: &serde_json::Value) -> Result<Change, EngineError> {
    let positive = |max: u64| value.as_u64().filter(|v| (1..=max).contains(v)).map(|v| v as u32);
    match key {
        "kv_cache_type" => value
            .as_str()
            .and_then(KvType::parse)
            .map(Change::KvType)
            .ok_or_else(|| unsupported(format!("`kv_cache_type` takes \"f16\", \"q8_0\" or \"q4_0\", got {value}"))),
        "kv_policy" => KvType::of_policy(value).map(Change::Policy),
        "threads" => positive(1024)
            .map(Change::Threads)
            .ok_or_else(|| unsupported(format!("`threads` takes an integer from 1 to 1024, got {value}"))),
        "prefill_chunk" => positive(65536)
            .map(Change::PrefillChunk)
            .ok_or_else(|| unsupported(format!("`prefill_chunk` takes an integer from 1 to 65536, got {value}"))),
        "prefill_stall" => parse_stall(value).map(Change::PrefillStall),
        "prefix_cache_mib" => parse_prefix_cache_mib(value).map(Change::PrefixCacheMib),
        "speculative_draft_max" => parse_draft_max(value).map(Change::DraftMax),
        "speculative_threshold" => parse_draft_threshold(value).map(Change::DraftThreshold),
        "swa_full" => parse_swa_full(value).map(Change::SwaFull),
        "ctx_checkpoints" => parse_ctx_checkpoints(value).map(Change::CtxCheckpoints),
        _ => Err(unsupported(format!(
            "unknown setting `{key}` (known: kv_cache_type, kv_policy, threads, prefill_chunk, prefill_stall, prefix_cache_mib, speculative_draft_max, speculative_threshold, swa_full, ctx_checkpoints)"
        ))),
    }
}

/// `prefill_stall`: a number from 1 (prompts wait for idle steps but for a few tokens) up;
/// `"off"` reads whole `prefill_chunk`s whatever runs.
pub fn parse_stall(value: &serde_json::Value) -> Result<f64, EngineError> {
    if value.as_str() == Some("off") {
        return Ok(f64::INFINITY);
    }
    value
        .as_f64()
        .filter(|v| (1.0..=1e6).contains(v))
        .ok_or_else(|| unsupported(format!("`prefill_stall` takes a number from 1 to 1000000 or \"off\", got {value}")))
}

/// `swa_full`: a boolean.
pub fn parse_swa_full(value: &serde_json::Value) -> Result<bool, EngineError> {
    value.as_bool().ok_or_else(|| unsupported(format!("`swa_full` takes true or false, got {value}")))
}

/// `ctx_checkpoints`: 0 (none) to 64 per slot.
pub fn parse_ctx_checkpoints(value: &serde_json::Value) -> Result<u32, EngineError> {
    value
        .as_u64()
        .filter(|&v| v <= 64)
        .map(|v| v as u32)
        .ok_or_else(|| unsupported(format!("`ctx_checkpoints` takes an integer from 0 to 64, got {value}")))
}

/// `prefix_cache_mib`: 0 (off) to 1 TiB.
pub fn parse_prefix_cache_mib(value: &serde_json::Value) -> Result<u32, EngineError> {
    value
        .as_u64()
        .filter(|&v| v <= 1 << 20)
        .map(|v| v as u32)
        .ok_or_else(|| unsupported(format!("`prefix_cache_mib` takes an integer from 0 to 1048576, got {value}")))
}

/// `kv_cells` (a load option): the context's KV cells over all sequences, 16 to 2^24.
pub fn parse_kv_cells(value: &serde_json::Value) -> Result<u32, EngineError> {
    value
        .as_u64()
        .filter(|v| (16..=1 << 24).contains(v))
        .map(|v| v as u32)
        .ok_or_else(|| unsupported(format!("`kv_cells` takes an integer from 16 to 16777216, got {value}")))
}

/// `speculative_draft_max` (`llmr_sampling::parse_draft_max`).
pub fn parse_draft_max(value: &serde_json::Value) -> Result<u32, EngineError> {
    llmr_sampling::parse_draft_max(value).map(|n| n as u32).map_err(unsupported)
}

/// `speculative_threshold` (`llmr_sampling::parse_draft_threshold`).
pub fn parse_draft_threshold(value: &serde_json::Value) -> Result<Option<f64>, EngineError> {
    llmr_sampling::parse_draft_threshold(value).map_err(unsupported)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prefill_stall_takes_a_ratio_or_off() {
        assert_eq!(parse_change("prefill_stall", &json!(2.5)).unwrap(), Change::PrefillStall(2.5));
        assert_eq!(parse_change("prefill_stall", &json!("off")).unwrap(), Change::PrefillStall(f64::INFINITY));
        for bad in [json!(0.5), json!("fast"), json!(null)] {
            let e = parse_change("prefill_stall", &bad).unwrap_err();
            assert!(e.message.contains("prefill_stall"), "{}", e.message);
        }
    }

    #[test]
    fn sliding_window_settings_take_their_ranges() {
        assert_eq!(parse_change("swa_full", &json!(true)).unwrap(), Change::SwaFull(true));
        assert_eq!(parse_change("ctx_checkpoints", &json!(0)).unwrap(), Change::CtxCheckpoints(0));
        for (key, bad) in [("swa_full", json!("yes")), ("ctx_checkpoints", json!(65)), ("ctx_checkpoints", json!(-1))] {
            let e = parse_change(key, &bad).unwrap_err();
            assert!(e.message.contains(key), "{}", e.message);
        }
    }

    #[test]
    fn the_cell_budget_takes_a_count_of_cells() {
        use crate::scheduler::{separate_streams, total_cells};
        assert_eq!(parse_kv_cells(&json!(16)).unwrap(), 16);
        assert_eq!(parse_kv_cells(&json!(65536)).unwrap(), 65536);
        for bad in [json!(0), json!(15), json!(-3), json!(1 << 25), json!("512"), json!(512.5)] {
            assert!(parse_kv_cells(&bad).unwrap_err().message.contains("`kv_cells`"), "{bad}");
        }
        let s = ContextSettings {
            slots: 4,
            ctx_per_seq: 1024,
            threads: 1,
            kv_type: KvType::F16,
            swa_full: false,
            kv_cells: Some(2048),
        };
        // 4 x 1024 cells do not fit 2048: one unified cache of 2048; without the option they fit.
        assert_eq!((total_cells(&s), separate_streams(&s)), (2048, false));
        let default = ContextSettings { kv_cells: None, ..s };
        assert_eq!((total_cells(&default), separate_streams(&default)), (4096, true));
        // Never less than one sequence's context.
        let small = ContextSettings { kv_cells: Some(100), ..s };
        assert_eq!(total_cells(&small), 1024);
    }

    #[test]
    fn speculation_settings_take_their_ranges() {
        assert_eq!(parse_change("speculative_draft_max", &json!(0)).unwrap(), Change::DraftMax(0));
        assert_eq!(parse_change("speculative_draft_max", &json!(16)).unwrap(), Change::DraftMax(16));
        for bad in [json!(33), json!(-1), json!("on"), json!(2.5)] {
            let e = parse_change("speculative_draft_max", &bad).unwrap_err();
            assert!(e.message.contains("speculative_draft_max"), "{}", e.message);
        }
        assert_eq!(parse_change("speculative_threshold", &json!("auto")).unwrap(), Change::DraftThreshold(None));
        assert_eq!(parse_change("speculative_threshold", &json!(0.25)).unwrap(), Change::DraftThreshold(Some(0.25)));
        for bad in [json!(1.5), json!(-0.1), json!("always")] {
            let e = parse_change("speculative_threshold", &bad).unwrap_err();
            assert!(e.message.contains("speculative_threshold"), "{}", e.message);
        }
    }

    #[test]
    fn a_policy_sets_the_cache_type_or_middle_eviction() {
        let change = |v: serde_json::Value| KvType::of_policy(&v).unwrap();
        assert_eq!(
            change(json!({"mode": "static", "static_level": "int8"})),
            PolicyChange { kv_type: Some(KvType::Q8_0), eviction: None, idle_int8: false }
        );
        // Dynamic: the type stays; the profile's eviction keeps the sinks and the window.
        assert_eq!(
            change(json!({"mode": "dynamic", "recent_window": 32, "sink_tokens": 4})),
            PolicyChange { kv_type: None, eviction: Some(Eviction { sinks: 4, window: 32 }), idle_int8: true }
        );
        // The safe profile never evicts (`L3_evict` 0).
        assert_eq!(
            change(json!({"mode": "dynamic", "profile": "safe"})),
            PolicyChange { kv_type: None, eviction: None, idle_int8: true }
        );
        let e = parse_change("kv_policy", &json!({"mode": "dynamic", "recent_window": 4})).unwrap_err();
        assert!(e.message.contains("recent_window"), "{}", e.message);
    }

    #[test]
    fn eviction_sheds_half_the_middle_and_never_the_sinks_or_the_window() {
        let ev = Eviction { sinks: 16, window: 32 };
        // 127 positions: 111 after the sinks, half of them (rounded up) go.
        assert_eq!(ev.shed(127, 0), 56);
        // A prefix shared with another sequence is protected like the sinks.
        assert_eq!(ev.shed(127, 40), 44);
        // Never into the window: 16 + 32 + 3 positions leave only 3 to drop.
        assert_eq!(ev.shed(51, 0), 3);
        assert_eq!(ev.shed(48, 0), 0);
        assert_eq!(ev.shed(100, 90), 0);
    }

    #[test]
    fn prefix_cache_takes_mebibytes_or_zero() {
        assert_eq!(parse_change("prefix_cache_mib", &json!(0)).unwrap(), Change::PrefixCacheMib(0));
        assert_eq!(parse_change("prefix_cache_mib", &json!(512)).unwrap(), Change::PrefixCacheMib(512));
        for bad in [json!(-1), json!("big"), json!(1.5)] {
            let e = parse_change("prefix_cache_mib", &bad).unwrap_err();
            assert!(e.message.contains("prefix_cache_mib"), "{}", e.message);
        }
    }
}
