//! The staged KV cache's policy (spec 002, 5.1): which level each block of a sequence's KV
//! cache outside the protected positions should be stored at, from its importance and the
//! cache's memory pressure. Engines apply it (the native engine's `kv_control.rs`); the node's
//! control API checks patches with it before any engine sees them, so a refused patch changes
//! nothing anywhere.
//!
//! Importance `I = a*attention + b*frequency + c*semantic - d*age`, clamped to 0..1, where for
//! a block of a sequence of `len` positions:
//! - attention: `r / (1 + r)`, `r` the mean attention weight a row gave the block divided by
//!   the weight a uniform row gives the block's positions (0.5: as uniform; 0.5 too before any
//!   row was recorded). From the engine's own softmax, every row.
//! - frequency: `1 - 1/sequences reading the block` (a prefix shared by requests is read by
//!   each of them every step; 0 when one sequence holds it).
//! - semantic: 1 when the block holds a control token of the tokenizer (BOS, the chat
//!   template's role and turn markers), 0 otherwise: the text's structure, which attention
//!   keeps returning to like it does to the first token.
//! - age: positions from the block's end to the sequence's end, over the context length.
//!
//! The decision is the spec's: pressure above `high` and `I < evict` evicts, pressure above
//! `mid` and `I < int4` goes to int4, `I < int8` to int8, else f16. The recent window and the
//! sink tokens (the first block of the native engine) are never touched. A block stored lower
//! than `decide` now gives goes back up where the engine kept its f16 copy (the native engine's
//! spill tier); without one, levels only go down.
//!
//! What a policy costs a model in quality is estimated from a table the evaluator measures for
//! that model (`calibration.rs`); the slow loop re-fits thresholds and switches profiles to keep
//! that estimate inside a quality budget (`slow_loop.rs`).

mod calibration;
mod slow_loop;

pub use calibration::{Calibration, CalibrationPoint, LevelCosts};
use serde::{Deserialize, Serialize};
pub use slow_loop::{adjust, Adjustment, Refit, HEADROOM, RANGE, STEP};

/// The storage levels of a KV block (spec 002): L0 f16, L1 int8, L2 int4, L3 evicted. Ordered:
/// a greater level stores less.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    F16 = 0,
    Int8 = 1,
    Int4 = 2,
    Evicted = 3,
}

/// The least `recent_window` may be: one block of the native engine (16 positions).
pub const MIN_WINDOW: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every block outside the protected positions at `static_level`.
    Static,
    /// Each block at the level its importance and the memory pressure decide.
    Dynamic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// int8 outside the window; int4 only above 80% pressure; never evicts.
    Safe,
    /// The spec's thresholds and bands.
    Balanced,
    /// int4 from the start; evicts the least important blocks from 50% pressure.
    Aggressive,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    #[serde(rename = "L1_int8")]
    pub int8: f64,
    #[serde(rename = "L2_int4")]
    pub int4: f64,
    #[serde(rename = "L3_evict")]
    pub evict: f64,
}

/// Memory-pressure bands: the share of the KV budget in use above which int4, then eviction,
/// are allowed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pressure {
    pub mid: f64,
    pub high: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Weights {
    pub attention: f64,
    pub frequency: f64,
    pub semantic: f64,
    pub age: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct KvPolicy {
    pub mode: Mode,
    pub static_level: Level,
    pub profile: Profile,
    /// The most recent positions, always f16.
    pub recent_window: usize,
    /// The first positions (attention sinks), always f16.
    pub sink_tokens: usize,
    pub level_thresholds: Thresholds,
    pub pressure: Pressure,
    pub weights: Weights,
}

/// A change to a policy, as `POST /v1/policy`'s `kv` object or `set_config("kv_policy")` give
/// it: the fields present replace the running policy's (a `profile` first sets its preset).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyPatch {
    pub mode: Option<Mode>,
    pub static_level: Option<Level>,
    pub profile: Option<Profile>,
    pub recent_window: Option<usize>,
    pub sink_tokens: Option<usize>,
    pub level_thresholds: Option<Thresholds>,
    pub pressure: Option<Pressure>,
    pub weights: Option<Weights>,
}

/// A policy refused: the field and why.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("kv policy: `{field}` {message}")]
pub struct PolicyError {
    pub field: String,
    pub message: String,
}

fn refuse(field: &str, message: impl Into<String>) -> PolicyError {
    PolicyError { field: field.into(), message: message.into() }
}

/// The most positions `recent_window` and `sink_tokens` may protect.
const MAX_PROTECTED: usize = 1 << 20;

impl Profile {
    fn preset(self) -> (Thresholds, Pressure) {
        match self {
            Profile::Safe => (Thresholds { int8: 1.01, int4: 0.5, evict: 0.0 }, Pressure { mid: 0.8, high: 1.01 }),
            Profile::Balanced => (Thresholds { int8: 0.7, int4: 0.5, evict: 0.3 }, Pressure { mid: 0.6, high: 0.8 }),
            Profile::Aggressive => {
                (Thresholds { int8: 1.01, int4: 1.01, evict: 0.3 }, Pressure { mid: 0.0, high: 0.5 })
            }
        }
    }
}

impl Default for KvPolicy {
    /// The baseline: everything f16 (static mode), balanced thresholds ready for dynamic mode.
    fn default() -> Self {
        let (level_thresholds, pressure) = Profile::Balanced.preset();
        KvPolicy {
            mode: Mode::Static,
            static_level: Level::F16,
            profile: Profile::Balanced,
            recent_window: 64,
            sink_tokens: MIN_WINDOW,
            level_thresholds,
            pressure,
            weights: Weights { attention: 1.0, frequency: 0.3, semantic: 0.3, age: 0.2 },
        }
    }
}

/// What the policy knows of one block.
#[derive(Clone, Copy, Debug)]
pub struct BlockSignals {
    /// `KvPool::attention_received`: mean weight per row that saw it (`None`: no row yet).
    pub attention: Option<f64>,
    /// Sequences holding it.
    pub sharers: u32,
    pub control_token: bool,
    /// The block's positions.
    pub start: usize,
    pub end: usize,
}

impl KvPolicy {
    /// The baseline (every block f16, nothing evicted).
    pub fn baseline() -> Self {
        Self::default()
    }

    /// Whether applying it can change any block.
    pub fn is_active(&self) -> bool {
        self.mode == Mode::Dynamic || self.static_level != Level::F16
    }

    /// Whether it reads the attention blocks receive.
    pub fn needs_attention(&self) -> bool {
        self.mode == Mode::Dynamic && self.weights.attention > 0.0
    }

    /// This policy with `patch` applied, checked; `self` is unchanged either way.
    pub fn patched(&self, patch: &PolicyPatch) -> Result<KvPolicy, PolicyError> {
        let mut p = *self;
        if let Some(profile) = patch.profile {
            (p.level_thresholds, p.pressure) = profile.preset();
            p.profile = profile;
        }
        p.mode = patch.mode.unwrap_or(p.mode);
        p.static_level = patch.static_level.unwrap_or(p.static_level);
        p.recent_window = patch.recent_window.unwrap_or(p.recent_window);
        p.sink_tokens = patch.sink_tokens.unwrap_or(p.sink_tokens);
        p.level_thresholds = patch.level_thresholds.unwrap_or(p.level_thresholds);
        p.pressure = patch.pressure.unwrap_or(p.pressure);
        p.weights = patch.weights.unwrap_or(p.weights);
        p.check()?;
        Ok(p)
    }

    /// Parses a JSON patch (unknown keys and malformed values refused, naming them) and applies it.
    pub fn patched_json(&self, value: &serde_json::Value) -> Result<KvPolicy, PolicyError> {
        let patch: PolicyPatch = serde_json::from_value(value.clone()).map_err(|e| {
            let text = e.to_string();
            // serde names an unknown field as "unknown field `x`"; other errors say what was expected.
            let field = text.split('`').nth(1).filter(|_| text.starts_with("unknown field")).unwrap_or("kv");
            refuse(field, text.clone())
        })?;
        self.patched(&patch)
    }

    fn check(&self) -> Result<(), PolicyError> {
        if self.recent_window < MIN_WINDOW || self.recent_window > MAX_PROTECTED {
            return Err(refuse("recent_window", format!("must be from {MIN_WINDOW} to {MAX_PROTECTED} tokens")));
        }
        if self.sink_tokens > MAX_PROTECTED {
            return Err(refuse("sink_tokens", format!("must be at most {MAX_PROTECTED} tokens")));
        }
        let t = self.level_thresholds;
        for (name, v) in [("L1_int8", t.int8), ("L2_int4", t.int4), ("L3_evict", t.evict)] {
            if !(0.0..=1.01).contains(&v) {
                return Err(refuse(&format!("level_thresholds.{name}"), "must be from 0 to 1.01 (1.01: always)"));
            }
        }
        if !(t.evict <= t.int4 && t.int4 <= t.int8) {
            return Err(refuse("level_thresholds", "must satisfy L3_evict <= L2_int4 <= L1_int8"));
        }
        let b = self.pressure;
        for (name, v) in [("mid", b.mid), ("high", b.high)] {
            if !(0.0..=1.01).contains(&v) {
                return Err(refuse(&format!("pressure.{name}"), "must be a share from 0 to 1.01 (1.01: never)"));
            }
        }
        if b.mid > b.high {
            return Err(refuse("pressure", "must satisfy mid <= high"));
        }
        let w = self.weights;
        for (name, v) in
            [("attention", w.attention), ("frequency", w.frequency), ("semantic", w.semantic), ("age", w.age)]
        {
            if !(v.is_finite() && (0.0..=10.0).contains(&v)) {
                return Err(refuse(&format!("weights.{name}"), "must be from 0 to 10"));
            }
        }
        if self.static_level == Level::Evicted && self.mode == Mode::Static {
            return Err(refuse("static_level", "must be f16, int8 or int4: evicting every block is not a policy"));
        }
        Ok(())
    }

    /// Index range of the full blocks (of `block` positions) of a sequence of `len` positions
    /// the policy may change: after the sinks, before the recent window.
    pub fn changeable(&self, len: usize, block: usize) -> std::ops::Range<usize> {
        let first = self.sink_tokens.div_ceil(block);
        let end = len.saturating_sub(self.recent_window) / block;
        first..end.max(first)
    }

    /// The importance of a block of a sequence of `len` positions with context `ctx`.
    pub fn importance(&self, b: &BlockSignals, len: usize, ctx: usize) -> f64 {
        let w = self.weights;
        let attention = match b.attention {
            Some(mean) if len > 0 && b.end > b.start => {
                let r = mean / ((b.end - b.start) as f64 / len as f64);
                r / (1.0 + r)
            }
            _ => 0.5,
        };
        let frequency = 1.0 - 1.0 / b.sharers.max(1) as f64;
        let semantic = if b.control_token { 1.0 } else { 0.0 };
        let age = len.saturating_sub(b.end) as f64 / ctx.max(1) as f64;
        (w.attention * attention + w.frequency * frequency + w.semantic * semantic - w.age * age).clamp(0.0, 1.0)
    }

    /// The lowest level a block may go to when the cache has no room for the next step (past
    /// the thresholds, least important first: ending a sequence for room costs more): int4,
    /// and eviction unless the profile never evicts (`L3_evict` 0). `None` in static mode.
    pub fn emergency_floor(&self) -> Option<Level> {
        match self.mode {
            Mode::Static => None,
            Mode::Dynamic if self.level_thresholds.evict > 0.0 => Some(Level::Evicted),
            Mode::Dynamic => Some(Level::Int4),
        }
    }

    /// The level for a block of importance `importance` at memory pressure `pressure` (0..1).
    pub fn decide(&self, importance: f64, pressure: f64) -> Level {
        if self.mode == Mode::Static {
            return self.static_level;
        }
        let (t, b) = (self.level_thresholds, self.pressure);
        if pressure > b.high && importance < t.evict {
            Level::Evicted
        } else if pressure > b.mid && importance < t.int4 {
            Level::Int4
        } else if importance < t.int8 {
            Level::Int8
        } else {
            Level::F16
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dynamic(profile: &str) -> KvPolicy {
        KvPolicy::baseline().patched_json(&json!({"mode": "dynamic", "profile": profile})).unwrap()
    }

    #[test]
    fn the_spec_decision_follows_importance_and_pressure() {
        let p = dynamic("balanced");
        assert_eq!(p.decide(0.9, 0.9), Level::F16);
        assert_eq!(p.decide(0.6, 0.0), Level::Int8);
        assert_eq!(p.decide(0.4, 0.5), Level::Int8, "int4 waits for pressure above 0.6");
        assert_eq!(p.decide(0.4, 0.7), Level::Int4);
        assert_eq!(p.decide(0.2, 0.7), Level::Int4, "eviction waits for pressure above 0.8");
        assert_eq!(p.decide(0.2, 0.85), Level::Evicted);
        let safe = dynamic("safe");
        assert_eq!(safe.decide(0.99, 0.0), Level::Int8);
        assert_eq!(safe.decide(0.0, 1.0), Level::Int4, "safe never evicts");
        let aggressive = dynamic("aggressive");
        assert_eq!(aggressive.decide(0.99, 0.1), Level::Int4);
        assert_eq!(aggressive.decide(0.1, 0.6), Level::Evicted);
        assert_eq!((p.emergency_floor(), safe.emergency_floor()), (Some(Level::Evicted), Some(Level::Int4)));
        let st = KvPolicy::baseline().patched_json(&json!({"static_level": "int8"})).unwrap();
        assert_eq!(st.emergency_floor(), None);
        assert_eq!(st.decide(1.0, 0.0), Level::Int8);
        assert!(st.is_active() && !KvPolicy::baseline().is_active());
    }

    #[test]
    fn importance_rewards_attention_sharing_and_control_tokens_and_decays_with_age() {
        let p = dynamic("balanced");
        let block = BlockSignals { attention: None, sharers: 1, control_token: false, start: 992, end: 1008 };
        let (len, ctx) = (1024, 4096);
        // Uniform attention: a block of 16 positions gets 16/len of each row.
        let uniform = 16.0 / len as f64;
        let base = p.importance(&block, len, ctx);
        assert_eq!(base, p.importance(&BlockSignals { attention: Some(uniform), ..block }, len, ctx));
        assert!(p.importance(&BlockSignals { attention: Some(4.0 * uniform), ..block }, len, ctx) > base + 0.2);
        assert!(p.importance(&BlockSignals { attention: Some(0.1 * uniform), ..block }, len, ctx) < base - 0.3);
        assert!(p.importance(&BlockSignals { sharers: 3, ..block }, len, ctx) > base);
        assert!(p.importance(&BlockSignals { control_token: true, ..block }, len, ctx) > base);
        assert!(p.importance(&BlockSignals { start: 0, end: 16, ..block }, len, ctx) < base);
    }

    #[test]
    fn protected_positions_are_outside_the_changeable_blocks() {
        let p = KvPolicy::baseline();
        assert_eq!(p.changeable(64, 16), 1..1);
        assert_eq!(p.changeable(100, 16), 1..2, "block 1 ends at 32, before the window's 36");
        assert_eq!(p.changeable(4096, 16), 1..252);
        let wide = p.patched_json(&json!({"sink_tokens": 40, "recent_window": 128})).unwrap();
        assert_eq!(wide.changeable(4096, 16), 3..248);
    }

    #[test]
    fn bad_patches_name_the_field_and_change_nothing() {
        let p = dynamic("balanced");
        let cases = [
            (json!({"modes": "dynamic"}), "modes"),
            (json!({"mode": "sometimes"}), "kv"),
            (json!({"recent_window": 8}), "recent_window"),
            (json!({"level_thresholds": {"L1_int8": 0.7, "L2_int4": 0.8, "L3_evict": 0.3}}), "level_thresholds"),
            (
                json!({"level_thresholds": {"L1_int8": 2.0, "L2_int4": 0.5, "L3_evict": 0.3}}),
                "level_thresholds.L1_int8",
            ),
            (json!({"pressure": {"mid": 0.9, "high": 0.8}}), "pressure"),
            (json!({"pressure": {"mid": 0.5}}), "kv"),
            (json!({"weights": {"attention": -1, "frequency": 0, "semantic": 0, "age": 0}}), "weights.attention"),
            (json!({"mode": "static", "static_level": "evicted"}), "static_level"),
        ];
        for (patch, field) in cases {
            let e = p.patched_json(&patch).unwrap_err();
            assert_eq!(e.field, field, "{patch}: {e}");
        }
        let ok = p.patched_json(&json!({"recent_window": 128})).unwrap();
        assert_eq!((ok.recent_window, ok.mode, ok.profile), (128, Mode::Dynamic, Profile::Balanced));
    }
}
