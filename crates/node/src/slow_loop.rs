//! Spec 002's slow loop (every 100 ms): threshold re-fit and quantization profile switching.
//! With a quality budget in the run context (`POST /v1/run-context`'s `quality_budget`,
//! relative delta-PPL in percent), each model under the dynamic KV policy that reports an
//! estimate (`delta_ppl_est`, from its calibration table) is kept inside the budget by the
//! changes `llmr_kv_policy::adjust` picks: its thresholds shifted a step, or past their range
//! another profile. Each is a `kv_policy` patch sent to that model alone. After a change the
//! loop leaves that model for [`REFIT_SETTLE`] (thresholds) or [`SETTLE`] (a profile), so that
//! the next decision reads a cache the change has acted on. Without a budget it changes nothing:
//! policies stay as `/v1/policy` set them.
//!
//! The fast and mid loops live in the engines, between decode steps, where the blocks are.

use crate::control::SharedControl;
use crate::metrics::model_figures;
use crate::models::ModelManager;
use llmr_kv_policy::{adjust, Adjustment, KvPolicy, Refit};
use std::collections::HashMap;
use std::time::{Duration, Instant};

pub const PERIOD: Duration = Duration::from_millis(100);
/// How long a model is left alone after a profile switch: several of the engine's 10 ms
/// passes, and the steps between them, show what the new profile does to the cache.
pub const SETTLE: Duration = Duration::from_secs(2);
/// After a threshold step: a smaller change, which the engine's next passes apply.
pub const REFIT_SETTLE: Duration = Duration::from_millis(500);

/// What the loop keeps of one model: its re-fit, and until when it is left alone.
pub type ModelState = HashMap<String, (Refit, Instant)>;

/// What one pass changed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Changes {
    pub refits: usize,
    pub profile_switches: usize,
}

/// Runs the loop for as long as the process runs.
pub fn spawn(control: SharedControl) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut state = ModelState::new();
        loop {
            tick.tick().await;
            let Some(budget) = control.quality_budget() else { continue };
            let c = control.clone();
            // Engine calls block (briefly); the state travels with the call.
            let Ok(kept) = tokio::task::spawn_blocking(move || {
                let changes = adjust_models(c.models(), budget, &mut state, Instant::now());
                c.count_slow_loop_changes(changes);
                state
            })
            .await
            else {
                return tracing::error!("the KV slow loop stopped");
            };
            state = kept;
        }
    });
}

/// One pass over the loaded models.
pub fn adjust_models(models: &ModelManager, budget: f64, state: &mut ModelState, now: Instant) -> Changes {
    let mut changes = Changes::default();
    for m in models.loaded() {
        if state.get(&m.name).is_some_and(|(_, until)| now < *until) {
            continue;
        }
        let Some(figures) = m.engine.metrics() else { continue };
        let f = model_figures(&figures);
        // The policy as the engine runs it (every field), read back through the checked patch.
        let Ok(policy) = KvPolicy::baseline().patched_json(&f["kv_policy"]) else { continue };
        if policy.mode != llmr_kv_policy::Mode::Dynamic {
            continue;
        }
        // The estimate prices the blocks of running sequences: with none running it reads 0,
        // which says nothing, and would walk an idle model up to its boldest thresholds.
        let Some(estimate) = f["delta_ppl_est"].as_f64() else { continue };
        if f["slots_busy"].as_u64() == Some(0) {
            continue;
        }
        let (bytes, limit) = (f["kv_bytes"].as_f64().unwrap_or(0.0), f["kv_budget_bytes"].as_f64().unwrap_or(0.0));
        let pressure = if limit > 0.0 { bytes / limit } else { 0.0 };
        let mut refit = state.get(&m.name).map_or(Refit::from(policy.level_thresholds), |(r, _)| *r);
        let Some(change) = adjust(&policy, &mut refit, estimate, budget, pressure) else {
            state.insert(m.name.clone(), (refit, now));
            continue;
        };
        match m.engine.set_config("kv_policy", &change.patch()) {
            Ok(()) => {
                let settle = match change {
                    Adjustment::Thresholds(_) => {
                        changes.refits += 1;
                        REFIT_SETTLE
                    }
                    Adjustment::Profile(..) => {
                        changes.profile_switches += 1;
                        SETTLE
                    }
                };
                tracing::info!(model = %m.name, from = ?policy.profile, ?change, estimate, budget, pressure, "KV policy re-fit");
                state.insert(m.name.clone(), (refit, now + settle));
            }
            // The engine keeps its policy; so does the loop's record of it.
            Err(e) => tracing::warn!(model = %m.name, "KV policy change refused: {}", e.message),
        }
    }
    changes
}
