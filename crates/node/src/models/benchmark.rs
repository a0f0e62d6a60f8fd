//! Benchmark-driven engine choice (spec 000): when several plugins can run a model, the node
//! runs a short benchmark of the model with each (decode speed, time to the first token, peak
//! memory), keeps the figures with the model (`BenchmarkBook`, a file in the model store) and
//! runs the model with the engine that scores best. Until the figures exist the registry's
//! precedence decides; a new version of a plugin is benchmarked again.
//!
//! Benchmarks run one at a time on a task of their own (`ModelManager::run_benchmarks`), each
//! loading the model once more beside whatever is loaded (in a worker, where the node runs
//! engines in workers), so a crash while benchmarking ends only that worker.

use super::{estimate_footprint, CatalogEntry, ModelManager};
use crate::engine::{load_engine, Engine};
use llmr_cluster::EngineBenchmark;
use llmr_engine_host::{
    CallError, Capability, EmbedInputs, EngineStatus, InferParams, ModelRequirements, Plugin, Sampling,
};
use llmr_model_store::ModelDescriptor;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How much each figure weighs in a score (spec 000: "throughput, TTFT and memory, weighted").
/// Throughput matters most to a server; memory least, as it only decides between engines that
/// both fit.
const WEIGHT_SPEED: f64 = 0.5;
const WEIGHT_TTFT: f64 = 0.3;
const WEIGHT_MEMORY: f64 = 0.2;

/// Tokens generated per measured run, and measured runs (after one short warm-up run).
const GENERATED_TOKENS: u32 = 32;
const RUNS: usize = 3;

/// The benchmark's prompt: plain prose of about a hundred tokens, the same for every engine.
const PROMPT: &str = "The lighthouse keeper climbed the spiral stairs each evening before sunset, \
    carrying a can of oil and a cloth for the lens. From the gallery he could see the fishing boats \
    returning across the bay, their sails catching the last of the light, and the gulls settling on \
    the breakwater. He wrote the weather in his log, checked the clockwork that turned the lamp, and \
    waited for the first ship of the night to round the headland, as his father had done before him.";

/// One model's benchmark with one engine, as kept: which files it measured, so that a model
/// registered again under the same name with other files is measured again.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Record {
    model: String,
    primary_file: PathBuf,
    size_bytes: u64,
    #[serde(flatten)]
    benchmark: EngineBenchmark,
}

impl Record {
    fn of(&self, desc: &ModelDescriptor) -> bool {
        self.model == desc.name && self.primary_file == desc.primary_file && self.size_bytes == desc.size_bytes
    }
}

/// The benchmarks the node has run, kept in a JSON file (when it has one) that outlives the
/// node, so a restart does not benchmark again.
#[derive(Default)]
pub struct BenchmarkBook {
    path: Option<PathBuf>,
    records: Mutex<Vec<Record>>,
}

impl BenchmarkBook {
    /// The book in `path` (made when first written); an unreadable file is logged and started
    /// afresh (the benchmarks run again), never an error: it holds only measurements.
    pub fn open(path: Option<PathBuf>) -> Self {
        let records = path
            .as_ref()
            .and_then(|p| match std::fs::read(p) {
                Ok(bytes) => match serde_json::from_slice(&bytes) {
                    Ok(records) => Some(records),
                    Err(e) => {
                        tracing::warn!(path = %p.display(), "engine benchmarks unreadable ({e}); measuring again");
                        None
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    tracing::warn!(path = %p.display(), "engine benchmarks unreadable ({e}); measuring again");
                    None
                }
            })
            .unwrap_or_default();
        BenchmarkBook { path, records: Mutex::new(records) }
    }

    /// Every benchmark of this model (its files as they are now), one per engine.
    pub fn of(&self, desc: &ModelDescriptor) -> Vec<EngineBenchmark> {
        self.records.lock().unwrap().iter().filter(|r| r.of(desc)).map(|r| r.benchmark.clone()).collect()
    }

    /// Keeps `benchmark` in place of the model's earlier one with that engine, and writes the
    /// file (a temporary file renamed over it: a crash leaves the old or the new, whole).
    fn record(&self, desc: &ModelDescriptor, benchmark: EngineBenchmark) {
        let mut records = self.records.lock().unwrap();
        records.retain(|r| !(r.model == desc.name && r.benchmark.engine_id == benchmark.engine_id));
        records.push(Record {
            model: desc.name.clone(),
            primary_file: desc.primary_file.clone(),
            size_bytes: desc.size_bytes,
            benchmark,
        });
        let Some(path) = &self.path else { return };
        let text = serde_json::to_vec_pretty(&*records).expect("records serialize");
        let tmp = path.with_extension("json.tmp");
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&tmp, text))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), "engine benchmarks not saved: {e}");
        }
    }
}

/// Each engine's score among `benchmarks` (of one model on one machine), from 0 to 1: each
/// figure relative to the best of them, weighted.
pub fn scores(benchmarks: &[EngineBenchmark]) -> HashMap<String, f64> {
    let best_speed = benchmarks.iter().map(|b| b.tokens_per_second).fold(0.0, f64::max);
    let best_ttft = benchmarks.iter().map(|b| b.ttft_ms).filter(|&t| t > 0.0).fold(f64::INFINITY, f64::min);
    let least_memory = benchmarks.iter().map(|b| b.peak_memory_bytes).filter(|&m| m > 0).min().unwrap_or(0);
    let ratio = |num: f64, den: f64| if den > 0.0 && num.is_finite() { (num / den).min(1.0) } else { 1.0 };
    benchmarks
        .iter()
        .map(|b| {
            let score = WEIGHT_SPEED * ratio(b.tokens_per_second, best_speed)
                + WEIGHT_TTFT * ratio(best_ttft, b.ttft_ms)
                + WEIGHT_MEMORY * ratio(least_memory as f64, b.peak_memory_bytes as f64);
            (b.engine_id.clone(), score)
        })
        .collect()
}

/// Benchmark state of the manager: what waits to be measured, and what could not be.
#[derive(Default)]
pub(super) struct Benchmarks {
    pub book: BenchmarkBook,
    pending: Mutex<BTreeSet<String>>,
    wake: tokio::sync::Notify,
    /// (model, engine id, engine version) whose benchmark failed (the engine did not load the
    /// model): left out of the choice, not tried again until the node restarts.
    failed: Mutex<HashSet<(String, String, String)>>,
}

impl ModelManager {
    /// The node's benchmarks of a model, one per engine measured.
    pub fn benchmarks_of(&self, desc: &ModelDescriptor) -> Vec<EngineBenchmark> {
        self.benchmarks.book.of(desc)
    }

    /// The scores of `candidates` for `desc` when every candidate that can load it has a
    /// benchmark of its current version; else `None`, and the model waits for a benchmark.
    pub(super) fn scores_or_queue(
        &self,
        desc: &ModelDescriptor,
        candidates: &[Arc<Plugin>],
    ) -> Option<HashMap<String, f64>> {
        let (measured, missing) = self.measured(desc, candidates);
        if missing {
            self.benchmarks.pending.lock().unwrap().insert(desc.name.clone());
            self.benchmarks.wake.notify_one();
            return None;
        }
        Some(scores(&measured))
    }

    /// The current benchmarks of `candidates` for `desc`, and whether one that may load it
    /// has none.
    fn measured(&self, desc: &ModelDescriptor, candidates: &[Arc<Plugin>]) -> (Vec<EngineBenchmark>, bool) {
        let all = self.benchmarks.book.of(desc);
        let failed = self.benchmarks.failed.lock().unwrap();
        let mut measured = Vec::new();
        let mut missing = false;
        for plugin in candidates {
            let version = plugin.manifest.version.to_string();
            match all.iter().find(|b| b.engine_id == plugin.id() && b.engine_version == version) {
                Some(b) => measured.push(b.clone()),
                None => missing |= !failed.contains(&(desc.name.clone(), plugin.id().to_owned(), version)),
            }
        }
        (measured, missing)
    }

    /// Queues every model with several candidate engines that lacks a current benchmark (after
    /// a plugin changed version).
    pub(super) fn queue_stale_benchmarks(&self) {
        let registry = self.registry();
        for entry in self.entries() {
            if let Ok(candidates) = registry.candidates(&requirements(&entry.desc)) {
                if candidates.len() > 1 {
                    self.scores_or_queue(&entry.desc, &candidates);
                }
            }
        }
    }

    /// Runs the queued benchmarks one at a time, for as long as the node runs.
    pub async fn run_benchmarks(self: Arc<Self>) {
        loop {
            let next = self.benchmarks.pending.lock().unwrap().pop_first();
            match next {
                Some(name) => self.benchmark(&name).await,
                None => self.benchmarks.wake.notified().await,
            }
        }
    }

    /// Measures `name` with each candidate engine that has no current benchmark, then moves the
    /// model to the best-scoring engine (loaded beside the old one, as in a hot reload).
    async fn benchmark(&self, name: &str) {
        let Some(entry) = self.entry(name) else { return };
        let desc = &entry.desc;
        let Ok(candidates) = self.registry().candidates(&requirements(desc)) else { return };
        if candidates.len() < 2 {
            return;
        }
        for plugin in &candidates {
            // Measured already at this version, or failed to load the model.
            if !self.measured(desc, std::slice::from_ref(plugin)).1 {
                continue;
            }
            let version = plugin.manifest.version.to_string();
            let key = (desc.name.clone(), plugin.id().to_owned(), version.clone());
            // Room for one more copy, where a copy of the model would go.
            let footprint = estimate_footprint(desc);
            let placement = match self.place(plugin, name, footprint, 0, &[]) {
                Ok(placements) => placements.into_iter().next().flatten(),
                Err(e) => {
                    tracing::warn!(model = name, "benchmark postponed: {e}");
                    return;
                }
            };
            if placement.is_none() {
                if let Err(e) = self.make_room("", footprint) {
                    tracing::warn!(model = name, "benchmark postponed: {e}");
                    return;
                }
            }
            let isolation = self.policy.isolation.clone();
            let settings = crate::engine::EngineSettings {
                slots: 1,
                device: placement.as_ref().map(|p| p.device.clone()),
                ..self.policy.engine.clone()
            };
            let (p, d) = (plugin.clone(), desc.clone());
            let outcome = tokio::task::spawn_blocking(move || {
                let engine = load_engine(&isolation, &p, &d, &settings)?;
                measure(engine.as_ref(), &p, &d)
            })
            .await;
            drop(placement);
            match outcome {
                Ok(Ok(b)) => {
                    tracing::info!(
                        model = name,
                        engine = plugin.id(),
                        version = %version,
                        tokens_per_second = format!("{:.1}", b.tokens_per_second),
                        ttft_ms = format!("{:.1}", b.ttft_ms),
                        peak_memory_mib = b.peak_memory_bytes >> 20,
                        "engine benchmarked"
                    );
                    self.benchmarks.book.record(desc, b);
                }
                Ok(Err(e)) => {
                    tracing::warn!(
                        model = name,
                        engine = plugin.id(),
                        "benchmark failed; the engine is left out of the choice: {}",
                        e.message
                    );
                    self.benchmarks.failed.lock().unwrap().insert(key);
                }
                Err(e) => {
                    tracing::error!(model = name, engine = plugin.id(), "benchmark panicked: {e}");
                    self.benchmarks.failed.lock().unwrap().insert(key);
                }
            }
        }
        self.adopt_best(&entry, &candidates).await;
    }

    /// Moves `entry` to the best-scoring of `candidates`, if it is not on it already.
    async fn adopt_best(&self, entry: &Arc<CatalogEntry>, candidates: &[Arc<Plugin>]) {
        let (measured, _) = self.measured(&entry.desc, candidates);
        if measured.is_empty() {
            return;
        }
        let scores = scores(&measured);
        let req = ModelRequirements { scores: Some(&scores), ..requirements(&entry.desc) };
        let Ok(best) = self.registry().resolve(&req) else { return };
        if best.id() == entry.plugin.id() {
            return;
        }
        let name = &entry.desc.name;
        match self.shadow_swap(entry, best.clone()).await {
            Ok(true) => tracing::info!(
                model = %name,
                from = entry.plugin.id(),
                to = best.id(),
                scores = ?scores,
                "engine chosen by benchmark"
            ),
            Ok(false) => {}
            Err(e) => {
                tracing::error!(model = %name, "the benchmark's choice '{}' did not load; keeping '{}': {e}", best.id(), entry.plugin.id())
            }
        }
    }
}

/// What the registry needs to know about `desc`.
pub(super) fn requirements(desc: &ModelDescriptor) -> ModelRequirements<'_> {
    ModelRequirements {
        runtime: Some(&desc.runtime),
        format: desc.format.as_str(),
        architecture: &desc.architecture,
        scores: None,
    }
}

/// The benchmark itself (blocking): a short warm-up, then `RUNS` runs; the median of each
/// figure. Text models generate `GENERATED_TOKENS` tokens from `PROMPT` (greedy, end of text
/// ignored, so every engine generates as many); embedding models embed it.
fn measure(engine: &dyn Engine, plugin: &Plugin, desc: &ModelDescriptor) -> Result<EngineBenchmark, CallError> {
    let run = |tokens: u32| -> Result<(f64, f64), CallError> {
        if engine.info().has(Capability::Text) {
            generation_run(engine, &desc.name, tokens)
        } else if engine.info().has(Capability::Embedding) {
            embedding_run(engine)
        } else {
            Err(CallError {
                status: EngineStatus::Unsupported,
                message: "only text and embedding models are benchmarked".into(),
            })
        }
    };
    run(4)?;
    let mut ttft = Vec::with_capacity(RUNS);
    let mut speed = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let (t, s) = run(GENERATED_TOKENS)?;
        ttft.push(t);
        speed.push(s);
    }
    Ok(EngineBenchmark {
        engine_id: plugin.id().to_owned(),
        engine_version: plugin.manifest.version.to_string(),
        tokens_per_second: median(speed),
        ttft_ms: median(ttft),
        peak_memory_bytes: engine.peak_memory_bytes().unwrap_or_else(|| estimate_footprint(desc)),
        measured_at: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    })
}

/// (ms to the first token, tokens per second after it).
fn generation_run(engine: &dyn Engine, model: &str, tokens: u32) -> Result<(f64, f64), CallError> {
    let sampling = Sampling { max_tokens: Some(tokens), temperature: 0.0, seed: Some(0), ..Sampling::default() };
    let params = InferParams { ignore_eos: true, parse_special: false, ..InferParams::new(1, model, PROMPT, sampling) };
    let start = Instant::now();
    let mut first: Option<Instant> = None;
    let mut last = start;
    let mut count = 0u32;
    engine.generate(&params, &mut |_| {
        let now = Instant::now();
        first.get_or_insert(now);
        last = now;
        count += 1;
        true
    })?;
    let Some(first) = first else {
        return Err(CallError { status: EngineStatus::Internal, message: "the benchmark generated no token".into() });
    };
    let after_first = last.duration_since(first).max(Duration::from_micros(1)).as_secs_f64();
    Ok((ms(first - start), f64::from(count.saturating_sub(1)) / after_first))
}

/// (ms to the vector, prompt tokens per second).
fn embedding_run(engine: &dyn Engine) -> Result<(f64, f64), CallError> {
    let start = Instant::now();
    let tokens = engine.embed(1, EmbedInputs::Texts(&[PROMPT]), true, &mut |_, _| true)?;
    let took = start.elapsed();
    Ok((ms(took), f64::from(tokens) / took.max(Duration::from_micros(1)).as_secs_f64()))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(id: &str, tps: f64, ttft: f64, mem: u64) -> EngineBenchmark {
        EngineBenchmark {
            engine_id: id.into(),
            engine_version: "1".into(),
            tokens_per_second: tps,
            ttft_ms: ttft,
            peak_memory_bytes: mem,
            measured_at: 0,
        }
    }

    #[test]
    fn the_engine_best_on_every_figure_scores_one_and_speed_weighs_most() {
        let s = scores(&[bench("a", 100.0, 10.0, 100), bench("b", 50.0, 10.0, 100)]);
        assert!((s["a"] - 1.0).abs() < 1e-9);
        assert!((s["b"] - (0.5 * 0.5 + 0.3 + 0.2)).abs() < 1e-9);
        // Twice as fast outweighs a first token and memory each a third less.
        let s = scores(&[bench("fast", 200.0, 15.0, 150), bench("lean", 100.0, 10.0, 100)]);
        assert!(s["fast"] > s["lean"], "{s:?}");
    }

    #[test]
    fn the_book_keeps_one_benchmark_per_engine_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("benchmarks.json");
        let desc = ModelDescriptor {
            name: "m".into(),
            format: llmr_model_store::Format::Gguf,
            model_dir: dir.path().to_path_buf(),
            primary_file: dir.path().join("m.gguf"),
            architecture: "echo".into(),
            quantization: None,
            context_length: None,
            mmproj: None,
            runtime: "Echo".into(),
            capabilities: vec![Capability::Text],
            size_bytes: 10,
        };
        let book = BenchmarkBook::open(Some(path.clone()));
        book.record(&desc, bench("a", 1.0, 1.0, 1));
        book.record(&desc, bench("a", 2.0, 1.0, 1));
        book.record(&desc, bench("b", 3.0, 1.0, 1));
        let again = BenchmarkBook::open(Some(path.clone()));
        let kept = again.of(&desc);
        assert_eq!(
            kept.iter().map(|b| (b.engine_id.as_str(), b.tokens_per_second)).collect::<Vec<_>>(),
            [("a", 2.0), ("b", 3.0)]
        );
        // Other files under the same name are another model.
        assert!(again.of(&ModelDescriptor { size_bytes: 11, ..desc.clone() }).is_empty());
        // A damaged file is measured again, not an error.
        std::fs::write(&path, b"{not json").unwrap();
        assert!(BenchmarkBook::open(Some(path)).of(&desc).is_empty());
    }
}
