//! What happens to loaded models besides requests: reloading a model whose engine worker
//! ended, moving models to a new version of their plugin (hot reload), periodic restarts, and
//! unloading under memory pressure. The supervisor task of the node (`node.rs`) drives them.

use super::{CatalogEntry, LoadedModel, ModelManager};
use crate::error::NodeError;
use llmr_engine_host::Plugin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// When a loaded model is restarted in a new engine (spec 003's periodic restart); both `None`:
/// never.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestartPolicy {
    pub after: Option<std::time::Duration>,
    pub after_requests: Option<u64>,
}

impl ModelManager {
    /// Runs `new` in place of `old` (a new version of the same engine, hot reloaded): the
    /// registry takes it for models resolved from now on, and each model `old` runs is loaded
    /// with `new` beside the old one (shadow load), then takes the new requests; the old engine
    /// finishes the requests it holds and is unloaded after the last. A model whose new load
    /// fails stays on `old` (logged). Models another engine could run too are benchmarked again
    /// (spec 000: the figures of the old version no longer count). Returns how many models moved.
    pub async fn switch_plugin(&self, old: &Arc<Plugin>, new: Arc<Plugin>) -> usize {
        {
            let mut registry = self.registry.write().unwrap();
            *registry = Arc::new(registry.with_replaced(new.clone()));
        }
        for report in
            self.engine_reports.write().unwrap().iter_mut().filter(|r| r.state == "loaded" && r.id == new.id())
        {
            report.version = new.manifest.version.to_string();
            report.abi = Some(format!("{}.{}", new.info.abi_major, new.info.abi_minor));
        }
        let mut moved = 0;
        for entry in self.entries().into_iter().filter(|e| Arc::ptr_eq(&e.plugin, old)) {
            match self.shadow_swap(&entry, new.clone()).await {
                Ok(swapped) => moved += usize::from(swapped),
                Err(e) => tracing::error!(
                    model = %entry.desc.name,
                    "the new version of engine '{}' did not load; the old keeps serving: {e}",
                    new.id()
                ),
            }
        }
        // The new version has no benchmark yet where its engine competes with another.
        self.queue_stale_benchmarks();
        moved
    }

    /// Replaces `entry` with a new entry of `plugin` for the same model: loaded first when the
    /// old one is loaded (beside it), then swapped in, so new requests go to the new engine
    /// while the old finishes the requests it holds and is unloaded after the last. Returns
    /// whether it swapped (not when the catalog replaced or removed the entry meanwhile).
    pub(super) async fn shadow_swap(&self, entry: &Arc<CatalogEntry>, plugin: Arc<Plugin>) -> Result<bool, NodeError> {
        let next = Arc::new(CatalogEntry::new(entry.desc.clone(), plugin, entry.created));
        if entry.is_loaded() {
            self.load_entry(&next).await?;
        }
        let mut entries = self.entries.write().unwrap();
        let name = &entry.desc.name;
        if entries.get(name).is_some_and(|e| Arc::ptr_eq(e, entry)) {
            entries.insert(name.clone(), next);
            return Ok(true);
        }
        Ok(false)
    }

    /// Periodic restart (spec 003): each loaded model that has been loaded longer than
    /// `policy.after` or has served more than `policy.after_requests` requests is loaded again
    /// in a new engine the shadow way (no request dropped). Returns how many restarted.
    pub async fn restart_aged(&self, policy: &RestartPolicy) -> usize {
        if policy.after.is_none() && policy.after_requests.is_none() {
            return 0;
        }
        let mut restarted = 0;
        for entry in self.entries() {
            let aged = entry.replicas().iter().any(|m| {
                policy.after.is_some_and(|a| m.loaded_at.elapsed() >= a)
                    || policy.after_requests.is_some_and(|n| m.requests.load(Ordering::Relaxed) >= n)
            });
            if !aged {
                continue;
            }
            match self.shadow_swap(&entry, entry.plugin.clone()).await {
                Ok(true) => {
                    tracing::info!(model = %entry.desc.name, "periodic restart: the model runs in a new engine");
                    restarted += 1;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(model = %entry.desc.name, "periodic restart failed; the old engine keeps serving: {e}")
                }
            }
        }
        restarted
    }

    /// Reloads every model replica whose engine worker ended (a crash, or a hang the watchdog
    /// ended), each in a new worker, so the next request finds it ready; the requests that were
    /// on the old worker have already failed, and the other replicas kept serving. Returns how
    /// many models were reloaded.
    pub async fn restart_ended(&self) -> usize {
        let mut restarted = 0;
        for entry in self.entries() {
            let ended: Vec<_> =
                entry.replicas().into_iter().filter_map(|m| Some((m.engine.exit_reason()?, m))).collect();
            if ended.is_empty() {
                continue;
            }
            for (reason, m) in &ended {
                tracing::warn!(model = %m.name, engine = m.engine_id(), device = ?m.device, "reloading the model: {reason}");
                metrics::counter!(crate::metrics::ENGINE_RESTARTS, "model" => m.name.clone()).increment(1);
            }
            drop(ended);
            match self.load_entry(&entry).await {
                Ok(_) => restarted += 1,
                Err(e) => tracing::error!(model = %entry.desc.name, "reloading after the worker ended failed: {e}"),
            }
        }
        restarted
    }

    /// Unloads the least recently used idle model replica (nothing running or queued);
    /// returns its name.
    pub fn unload_least_recently_used(&self) -> Option<String> {
        self.unload_idle_where(|_| true).map(|m| m.name.clone())
    }

    /// Unloads the least recently used idle replica that `which` accepts; returns it (its
    /// engine ends when the returned `Arc` is dropped).
    pub(super) fn unload_idle_where(&self, which: impl Fn(&LoadedModel) -> bool) -> Option<Arc<LoadedModel>> {
        let (entry, replica, _) = self
            .entries()
            .into_iter()
            .flat_map(|entry| entry.replicas().into_iter().map(move |m| (entry.clone(), m)))
            .filter(|(_, m)| m.is_idle() && which(m))
            .map(|(entry, m)| {
                let last = *m.last_used.lock().unwrap();
                (entry, m, last)
            })
            .min_by_key(|(_, _, last)| *last)?;
        entry.remove_replica(&replica).then_some(replica)
    }

    /// Restarts the engine worker holding the most memory (spec 000: memory still short with
    /// nothing idle to unload) among those not in `spared`: it takes no new request, finishes
    /// the ones it has and ends; the model loads in a new worker on its next request, once the
    /// old is gone (never both at once). Returns the model's name and the worker's resident
    /// bytes.
    pub fn restart_largest_worker(&self, spared: &[String]) -> Option<(String, u64)> {
        let (entry, replica, bytes) = self
            .entries()
            .into_iter()
            .filter(|entry| !spared.contains(&entry.desc.name))
            .flat_map(|entry| entry.replicas().into_iter().map(move |m| (entry.clone(), m)))
            .filter_map(|(entry, m)| {
                let bytes = m.engine.resident_bytes()?;
                Some((entry, m, bytes))
            })
            .max_by_key(|(_, _, bytes)| *bytes)?;
        entry.retire(&replica).then(|| (replica.name.clone(), bytes))
    }

    /// Unloads the least recently used idle replica on GPU `device`; returns its name.
    pub fn unload_least_recently_used_on(&self, device: u32) -> Option<String> {
        self.unload_idle_where(|m| m.device == Some(device)).map(|m| m.name.clone())
    }
}
