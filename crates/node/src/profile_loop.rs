//! Spec 002's slow loop (every 100 ms): quantization profile switching. With a quality budget in
//! the run context (`POST /v1/run-context`'s `quality_budget`, relative delta-PPL in percent),
//! each model under the dynamic KV policy that reports an estimate (`delta_ppl_est`, from its
//! calibration table) is kept inside the budget by switching its profile
//! (`llmr_kv_policy::next_profile`): a patch `{"profile": ...}` sent to that model alone. After a
//! switch the loop leaves that model for [`SETTLE`], so that the next decision reads a cache the
//! new profile has acted on. Without a budget it changes nothing: policies stay as
//! `/v1/policy` set them.
//!
//! The fast and mid loops live in the engines, between decode steps, where the blocks are.

use crate::control::SharedControl;
use crate::metrics::model_figures;
use crate::models::ModelManager;
use llmr_kv_policy::{next_profile, Pressure, Profile};
use std::collections::HashMap;
use std::time::{Duration, Instant};

pub const PERIOD: Duration = Duration::from_millis(100);
/// How long a model is left alone after a switch: several of the engine's 10 ms passes, and
/// the steps between them, show what the new profile does to the cache.
pub const SETTLE: Duration = Duration::from_secs(2);

/// Runs the loop for as long as the process runs.
pub fn spawn(control: SharedControl) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_switch = HashMap::new();
        loop {
            tick.tick().await;
            let Some(budget) = control.quality_budget() else { continue };
            let c = control.clone();
            // Engine calls block (briefly); the map travels with the call.
            let Ok(map) = tokio::task::spawn_blocking(move || {
                let switched = switch_profiles(c.models(), budget, &mut last_switch, Instant::now());
                c.count_profile_switches(switched);
                last_switch
            })
            .await
            else {
                return tracing::error!("the KV profile loop stopped");
            };
            last_switch = map;
        }
    });
}

/// One pass over the loaded models; returns how many switched. `last_switch` holds when each
/// model last switched.
pub fn switch_profiles(
    models: &ModelManager,
    budget: f64,
    last_switch: &mut HashMap<String, Instant>,
    now: Instant,
) -> usize {
    let mut switched = 0;
    for m in models.loaded() {
        if last_switch.get(&m.name).is_some_and(|t| now.duration_since(*t) < SETTLE) {
            continue;
        }
        let Some(figures) = m.engine.metrics() else { continue };
        let f = model_figures(&figures);
        let policy = &f["kv_policy"];
        if policy["mode"] != "dynamic" {
            continue;
        }
        let (Ok(profile), Ok(bands)) = (
            serde_json::from_value::<Profile>(policy["profile"].clone()),
            serde_json::from_value::<Pressure>(policy["pressure"].clone()),
        ) else {
            continue;
        };
        let Some(estimate) = f["delta_ppl_est"].as_f64() else { continue };
        let (bytes, limit) = (f["kv_bytes"].as_f64().unwrap_or(0.0), f["kv_budget_bytes"].as_f64().unwrap_or(0.0));
        let pressure = if limit > 0.0 { bytes / limit } else { 0.0 };
        let Some(next) = next_profile(profile, estimate, budget, pressure, bands) else { continue };
        match m.engine.set_config("kv_policy", &serde_json::json!({ "profile": next })) {
            Ok(()) => {
                tracing::info!(model = %m.name, ?profile, ?next, estimate, budget, pressure, "KV profile switched");
                last_switch.insert(m.name.clone(), now);
                switched += 1;
            }
            Err(e) => tracing::warn!(model = %m.name, "KV profile switch refused: {}", e.message),
        }
    }
    switched
}
