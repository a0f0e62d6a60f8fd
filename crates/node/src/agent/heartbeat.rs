//! Heartbeats: load and per-model readiness every `heartbeat_interval_ms`. A 404 means the
//! router forgot the node (it restarted): the node registers again. Each answer carries the
//! router's `models_version`; a new one wakes the sync.

use super::register::{CallError, RouterClient};
use super::sync::Report;
use super::{AgentError, Backoff};
use crate::models::ModelManager;
use llmr_cluster::{Heartbeat, ModelState, NodeLoad, NodeRegistered, NodeRegistration};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub(super) struct Heartbeats<'a> {
    pub client: &'a RouterClient,
    pub registration: &'a NodeRegistration,
    pub backoff: &'a Backoff,
    pub models: &'a Arc<ModelManager>,
    pub reports: watch::Receiver<Vec<Report>>,
    pub versions: watch::Sender<Option<u64>>,
}

fn interval(registered: &NodeRegistered) -> Duration {
    Duration::from_millis(registered.heartbeat_interval_ms.clamp(10, 600_000))
}

impl Heartbeats<'_> {
    /// Runs until a fatal error (the token is refused, or a registration is).
    pub async fn run(mut self, mut registered: NodeRegistered) -> Result<(), AgentError> {
        let has_devices = self.models.devices().has_devices();
        let mut failing = false;
        let mut just_registered = true;
        loop {
            let heartbeat = self.heartbeat(has_devices).await;
            match self.client.heartbeat(&registered.node_id, &heartbeat).await {
                Ok(ack) => {
                    if failing {
                        tracing::info!(router = self.client.router(), "heartbeats are answered again");
                        failing = false;
                    }
                    self.versions.send_if_modified(|v| {
                        let changed = *v != Some(ack.models_version);
                        *v = Some(ack.models_version);
                        changed
                    });
                    just_registered = false;
                }
                Err(CallError::NotFound) => {
                    tracing::warn!(
                        router = self.client.router(),
                        node_id = %registered.node_id,
                        "the router does not know this node (it restarted?); registering again"
                    );
                    registered = self.client.register_until_done(self.registration, self.backoff).await?;
                    tracing::info!(node_id = %registered.node_id, "registered again");
                    // Report at once, unless the router forgot the node right after registering it.
                    if !std::mem::replace(&mut just_registered, true) {
                        continue;
                    }
                }
                Err(CallError::Fatal(e)) => return Err(e),
                Err(CallError::Transient(problem)) => {
                    if !failing {
                        tracing::warn!("heartbeat failed ({problem}); still trying");
                    }
                    failing = true;
                }
            }
            // The next heartbeat goes out after the interval, or at once when the sync's
            // reports change (a model became ready: the router should route to it now).
            tokio::select! {
                () = tokio::time::sleep(interval(&registered)) => {}
                changed = self.reports.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep(interval(&registered)).await;
                    }
                }
            }
        }
    }

    async fn heartbeat(&self, has_devices: bool) -> Heartbeat {
        let load = self.models.load();
        let loaded: BTreeSet<&str> = load.loaded.iter().map(String::as_str).collect();
        let models = self
            .reports
            .borrow()
            .iter()
            .map(|r| {
                let mut status = r.status.clone();
                status.loaded = loaded.contains(status.name.as_str());
                if status.state == ModelState::Ready {
                    if let Some(entry) = self.models.entry(&status.name) {
                        status.capabilities = entry.desc.capability_names();
                        status.engine = Some(entry.plugin.id().to_owned());
                        status.benchmarks = self.models.benchmarks_of(&entry.desc);
                    }
                }
                if let Some(p) = &r.progress {
                    status.message = Some(p.describe());
                }
                status
            })
            .collect();
        let gpus = if has_devices {
            let models = self.models.clone();
            tokio::task::spawn_blocking(move || models.gpus()).await.unwrap_or_default()
        } else {
            self.registration.gpus.clone()
        };
        Heartbeat {
            load: NodeLoad {
                active_requests: load.active_requests as u32,
                queue_depth: load.queue_depth as u32,
                memory_used_bytes: load.memory_used_bytes,
            },
            models,
            gpus,
            engines: self.models.engine_reports(),
        }
    }
}
