//! Model sync: one task owns what the router wants (`desired`), what each model came to
//! (`settled`), the fetches running (`in_flight`) and the store's own models (`local`); the
//! heartbeat reads the resulting reports through a `watch` channel.
//!
//! A refresh (a new `models_version`, or the retry timer after a failure) fetches the
//! manifests, takes the models the router deleted out of the catalog (their files are kept),
//! rescans the store for its own models, and starts a fetch for every model that is neither
//! being fetched nor settled as ready or unsupported for this very manifest: a failed model is
//! retried at every refresh. A model whose manifest names an architecture no plugin runs is
//! unsupported at once, before anything is downloaded.

use super::files::{self, Progress, RECORD};
use super::register::{CallError, RouterClient};
use super::{AgentConfig, AgentError};
use crate::models::ModelManager;
use llmr_cluster::{ModelFormat, ModelManifest, ModelState, ModelStatus};
use llmr_model_store::{Format, ModelDescriptor, ModelStore};
use llmr_telemetry::error_chain;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};
use tokio::task::{Id, JoinSet};
use tokio::time::Instant;

/// One model as the heartbeat reports it; `progress` while it is being fetched.
#[derive(Debug, Clone)]
pub(super) struct Report {
    pub status: ModelStatus,
    pub progress: Option<Arc<Progress>>,
}

#[derive(Debug, Clone, PartialEq)]
enum Settled {
    Ready,
    Unsupported(String),
    Failed(String),
}

impl Settled {
    fn status(&self, name: &str) -> ModelStatus {
        let (state, message) = match self {
            Settled::Ready => (ModelState::Ready, None),
            Settled::Unsupported(m) => (ModelState::Unsupported, Some(m.clone())),
            Settled::Failed(m) => (ModelState::Failed, Some(m.clone())),
        };
        ModelStatus {
            name: name.to_string(),
            state,
            message,
            loaded: false,
            capabilities: Vec::new(),
            engine: None,
            benchmarks: Vec::new(),
        }
    }
}

struct InFlight {
    manifest: ModelManifest,
    progress: Arc<Progress>,
    task: Id,
}

type Fetched = (String, ModelManifest, Result<ModelDescriptor, String>);

/// One model's fetch, once the limiter lets it start. (A panic ends its task: `finish` reports
/// the model failed.)
async fn fetch(limiter: Arc<Semaphore>, root: PathBuf, manifest: ModelManifest, progress: Arc<Progress>) -> Fetched {
    let _permit = limiter.acquire_owned().await;
    let result = files::fetch_model(&root, &manifest, &progress).await.map_err(|e| error_chain(&e));
    (manifest.name.clone(), manifest, result)
}

pub(super) struct Syncer<'a> {
    client: &'a RouterClient,
    models: Arc<ModelManager>,
    store: ModelStore,
    reports: watch::Sender<Vec<Report>>,
    retry: Duration,
    limiter: Arc<Semaphore>,
    desired: BTreeMap<String, ModelManifest>,
    settled: BTreeMap<String, (ModelManifest, Settled)>,
    in_flight: BTreeMap<String, InFlight>,
    local: BTreeMap<String, Settled>,
    scan_store: bool,
    next_retry: Option<Instant>,
}

/// The store's name for a manifest's format.
pub(crate) fn store_format(format: ModelFormat) -> Format {
    match format {
        ModelFormat::Gguf => Format::Gguf,
        ModelFormat::Safetensors => Format::Safetensors,
        ModelFormat::Ggml => Format::Ggml,
        ModelFormat::Onnx => Format::Onnx,
    }
}

impl<'a> Syncer<'a> {
    pub fn new(
        config: &AgentConfig,
        client: &'a RouterClient,
        models: Arc<ModelManager>,
        reports: watch::Sender<Vec<Report>>,
    ) -> Result<Self, AgentError> {
        let store = ModelStore::open(&config.store)
            .map_err(|source| AgentError::Store { path: config.store.clone(), source })?;
        Ok(Syncer {
            client,
            models,
            store,
            reports,
            retry: config.sync_retry,
            limiter: Arc::new(Semaphore::new(config.parallel_fetches.max(1))),
            desired: BTreeMap::new(),
            settled: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            local: BTreeMap::new(),
            scan_store: config.scan_store,
            next_retry: None,
        })
    }

    /// Runs until the version channel closes, or a fatal error (the token is refused).
    pub async fn run(mut self, mut versions: watch::Receiver<Option<u64>>) -> Result<(), AgentError> {
        let mut tasks: JoinSet<Fetched> = JoinSet::new();
        let mut plugins = self.models.plugins_added();
        let mut plugins_open = true;
        self.scan_local().await;
        self.publish();
        loop {
            let deadline = self.next_retry;
            let retry = async move {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = versions.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    versions.borrow_and_update();
                    self.refresh(&mut tasks).await?;
                }
                Some(joined) = tasks.join_next_with_id() => self.finish(joined, &mut tasks),
                // A plugin added while serving: what no plugin could run is tried again.
                changed = plugins.changed(), if plugins_open => {
                    plugins_open = changed.is_ok();
                    self.settled.retain(|_, (_, settled)| !matches!(settled, Settled::Unsupported(_)));
                    self.scan_local().await;
                    self.start(&mut tasks);
                }
                () = retry => {
                    self.next_retry = None;
                    self.refresh(&mut tasks).await?;
                }
            }
            self.publish();
        }
    }

    async fn refresh(&mut self, tasks: &mut JoinSet<Fetched>) -> Result<(), AgentError> {
        match self.client.models().await {
            Ok(manifests) => self.apply(manifests),
            Err(CallError::Fatal(e)) => return Err(e),
            Err(CallError::NotFound) => {
                tracing::warn!("the router has no /v0/models (HTTP 404); retrying in {} s", self.retry.as_secs());
                self.schedule_retry();
                return Ok(());
            }
            Err(CallError::Transient(problem)) => {
                tracing::warn!("cannot fetch the router's models ({problem}); retrying in {} s", self.retry.as_secs());
                self.schedule_retry();
                return Ok(());
            }
        }
        self.scan_local().await;
        self.start(tasks);
        Ok(())
    }

    fn schedule_retry(&mut self) {
        self.next_retry.get_or_insert_with(|| Instant::now() + self.retry);
    }

    /// The router's list becomes the desired set; what it no longer has leaves the catalog.
    fn apply(&mut self, manifests: Vec<ModelManifest>) {
        let mut desired = BTreeMap::new();
        for m in manifests {
            if desired.contains_key(&m.name) {
                tracing::warn!(model = %m.name, "the router lists this model twice; using the first");
                continue;
            }
            desired.insert(m.name.clone(), m);
        }
        for name in self.desired.keys().filter(|n| !desired.contains_key(*n)) {
            if self.models.remove(name) {
                tracing::info!(model = %name, "deleted at the router: removed from the catalog (files kept)");
            }
            self.settled.remove(name);
        }
        self.desired = desired;
    }

    /// The store's own models (directories without a router record), served and reported as
    /// `llmr serve` would serve them; the router's models take precedence over a same name.
    async fn scan_local(&mut self) {
        if !self.scan_store {
            return;
        }
        let store = self.store.clone();
        let found = tokio::task::spawn_blocking(move || store.list()).await.unwrap_or_default();
        let mut now = BTreeMap::new();
        for desc in found {
            if self.desired.contains_key(&desc.name) || desc.model_dir.join(RECORD).exists() {
                continue;
            }
            let name = desc.name.clone();
            let settled = match self.models.add(desc) {
                Ok(()) => Settled::Ready,
                Err(e) => Settled::Unsupported(e.to_string()),
            };
            now.insert(name, settled);
        }
        for name in self.local.keys().filter(|n| !now.contains_key(*n) && !self.desired.contains_key(*n)) {
            self.models.remove(name);
        }
        self.local = now;
    }

    /// Starts a fetch for every desired model that needs one.
    fn start(&mut self, tasks: &mut JoinSet<Fetched>) {
        for (name, m) in &self.desired {
            if self.in_flight.contains_key(name) {
                continue;
            }
            if let Some((done, Settled::Ready | Settled::Unsupported(_))) = self.settled.get(name) {
                if done == m {
                    continue;
                }
            }
            if let Some(arch) = &m.architecture {
                if let Err(e) = self.models.engine_for(store_format(m.format), arch) {
                    self.models.remove(name);
                    self.settled.insert(name.clone(), (m.clone(), Settled::Unsupported(e.to_string())));
                    continue;
                }
            }
            let progress = Arc::new(Progress::default());
            let task =
                tasks.spawn(fetch(self.limiter.clone(), self.store.root().to_path_buf(), m.clone(), progress.clone()));
            self.in_flight.insert(name.clone(), InFlight { manifest: m.clone(), progress, task: task.id() });
        }
    }

    fn finish(&mut self, joined: Result<(Id, Fetched), tokio::task::JoinError>, tasks: &mut JoinSet<Fetched>) {
        let (name, manifest, result) = match joined {
            Ok((_, fetched)) => fetched,
            Err(e) => {
                // The task itself failed (not the fetch): forget it; the next refresh retries.
                let name = self.in_flight.iter().find(|(_, f)| f.task == e.id()).map(|(n, _)| n.clone());
                if let Some(name) = name {
                    let m = self.in_flight.remove(&name).expect("found above").manifest;
                    self.settled.insert(name, (m, Settled::Failed(format!("the sync task ended: {e}"))));
                    self.schedule_retry();
                }
                return;
            }
        };
        self.in_flight.remove(&name);
        if self.desired.get(&name) != Some(&manifest) {
            // Deleted or changed at the router while it was fetched.
            if self.desired.contains_key(&name) {
                self.start(tasks);
            }
            return;
        }
        let settled = match result {
            Ok(desc) => match self.models.add(desc) {
                Ok(()) => {
                    tracing::info!(model = %name, "ready");
                    Settled::Ready
                }
                Err(e) => Settled::Unsupported(e.to_string()),
            },
            Err(message) => {
                tracing::warn!(model = %name, "sync failed: {message}");
                self.models.remove(&name);
                self.schedule_retry();
                Settled::Failed(message)
            }
        };
        self.settled.insert(name, (manifest, settled));
    }

    fn publish(&self) {
        let mut reports = Vec::new();
        for (name, m) in &self.desired {
            let report = match (self.in_flight.get(name), self.settled.get(name)) {
                (Some(f), _) => Report {
                    status: ModelStatus {
                        name: name.clone(),
                        state: ModelState::Downloading,
                        message: None,
                        loaded: false,
                        capabilities: Vec::new(),
                        engine: None,
                        benchmarks: Vec::new(),
                    },
                    progress: Some(f.progress.clone()),
                },
                (None, Some((done, settled))) if done == m => Report { status: settled.status(name), progress: None },
                (None, _) => Report {
                    status: ModelStatus {
                        name: name.clone(),
                        state: ModelState::Downloading,
                        message: None,
                        loaded: false,
                        capabilities: Vec::new(),
                        engine: None,
                        benchmarks: Vec::new(),
                    },
                    progress: None,
                },
            };
            reports.push(report);
        }
        for (name, settled) in &self.local {
            reports.push(Report { status: settled.status(name), progress: None });
        }
        // Models the node was started with (`llmr serve --model PATH`): in the catalog, from
        // neither the router nor the store scan.
        for entry in self.models.entries() {
            let name = &entry.desc.name;
            if !self.desired.contains_key(name) && !self.local.contains_key(name) {
                reports.push(Report { status: Settled::Ready.status(name), progress: None });
            }
        }
        self.reports.send_replace(reports);
    }
}
