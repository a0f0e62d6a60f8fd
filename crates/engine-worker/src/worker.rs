//! The worker process: one plugin instance with one model, answering the node over the socket
//! on its standard input.
//!
//! The main thread reads requests; every call runs on a thread of its own (an `infer` blocks for
//! the whole generation), so `Stop` and `Cancel` are read and acted on while calls run. A third
//! kind of thread watches the engine's metrics while calls run and reports a change as
//! `Progress` (the node's watchdog). The end of the input (the node went away) ends the
//! process at once, whatever runs.
//!
//! Replies go through one writer thread: a token callback runs on the engine's decode thread,
//! which must not wait on the socket, and the replies that pile up while one write is under way
//! (the tokens of every sequence in a batched step) leave in the next write, together.

use crate::protocol::{read_line, write_line, EmbedInputs, Outcome, Reply, Request};
use llmr_engine_host::{
    abi, CallError, EmbedInputs as HostEmbedInputs, EngineInstance, EngineStatus, InferParams, Manifest, Plugin,
    SynthesizeParams, TokenEvent, TranscribeParams,
};
use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::time::Duration;

/// How often the engine's metrics are compared while calls run.
const PROGRESS_POLL: Duration = Duration::from_millis(500);

/// Runs a worker on the socket that is this process's standard input; returns the exit code.
pub fn serve_stdin() -> i32 {
    let stream = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => UnixStream::from(fd),
        Err(e) => {
            eprintln!("llmr engine worker: cannot take standard input: {e}");
            return 2;
        }
    };
    if stream.peer_addr().is_err() {
        eprintln!("llmr engine worker: standard input is not a socket; a node starts this process, not a person");
        return 2;
    }
    serve(stream)
}

struct Worker {
    instance: EngineInstance,
    model_id: String,
    /// To the writer thread (`write_replies`).
    output: mpsc::Sender<Reply>,
    /// Per running call: set when the node's callback returned false.
    stops: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    running: AtomicUsize,
}

impl Worker {
    fn send(&self, reply: Reply) {
        // The writer ends the process when the node is gone, so it outlives every sender.
        let _ = self.output.send(reply);
    }
}

/// The writer thread: each write takes every reply queued by then. A write that fails means
/// the node is gone: nothing is left to do for anyone.
fn write_replies(mut output: UnixStream, replies: mpsc::Receiver<Reply>) {
    let mut bytes = Vec::new();
    while let Ok(first) = replies.recv() {
        bytes.clear();
        for reply in std::iter::once(first).chain(replies.try_iter()) {
            if write_line(&mut bytes, &reply).is_err() {
                std::process::exit(2);
            }
        }
        if output.write_all(&bytes).is_err() {
            std::process::exit(0);
        }
    }
}

/// Serves one node over `stream` until it says `Shutdown` or goes away.
pub fn serve(stream: UnixStream) -> i32 {
    let mut input = match stream.try_clone() {
        Ok(s) => BufReader::new(s),
        Err(e) => {
            eprintln!("llmr engine worker: {e}");
            return 2;
        }
    };
    let mut output = stream;
    let mut buf = String::new();
    let (instance, model_id) = match read_line(&mut input, &mut buf) {
        Ok(Some(Request::Probe { plugin_dir })) => {
            let reply = match open(&plugin_dir) {
                Ok(plugin) => Reply::Probed { version: plugin.info.version.clone() },
                Err(error) => Reply::LoadFailed { error },
            };
            let _ = write_line(&mut output, &reply);
            return 0;
        }
        Ok(Some(Request::Load { plugin_dir, config, spec })) => match load(&plugin_dir, &config, &spec) {
            Ok(loaded) => loaded,
            Err(error) => {
                let _ = write_line(&mut output, &Reply::LoadFailed { error });
                return 0;
            }
        },
        Ok(_) => {
            eprintln!("llmr engine worker: the first request must be Load");
            return 2;
        }
        Err(e) => {
            eprintln!("llmr engine worker: {e}");
            return 2;
        }
    };
    let info = match instance.model_info(&model_id) {
        Ok(info) => info,
        Err(error) => {
            let _ = write_line(&mut output, &Reply::LoadFailed { error });
            return 0;
        }
    };
    let plugin = instance.plugin().info.clone();
    let loaded = Reply::Loaded { info: Box::new(info), capabilities: plugin.capabilities, version: plugin.version };
    if write_line(&mut output, &loaded).is_err() {
        return 0;
    }
    let (replies, queued) = mpsc::channel();
    std::thread::Builder::new()
        .name("replies".into())
        .spawn(move || write_replies(output, queued))
        .expect("a thread for replies");
    let worker =
        Arc::new(Worker { instance, model_id, output: replies, stops: Mutex::default(), running: AtomicUsize::new(0) });
    watch_progress(Arc::downgrade(&worker));
    loop {
        let request = match read_line::<Request>(&mut input, &mut buf) {
            Ok(Some(request)) => request,
            // The node went away (or sent what no node sends): calls may be blocked in the
            // engine, so the process ends without waiting for them.
            Ok(None) => std::process::exit(0),
            Err(e) => {
                eprintln!("llmr engine worker: {e}");
                std::process::exit(2);
            }
        };
        match request {
            Request::Stop { call } => {
                if let Some(flag) = worker.stops.lock().unwrap().get(&call) {
                    flag.store(true, Ordering::SeqCst);
                }
            }
            Request::Cancel { request_id } => {
                let _ = worker.instance.cancel(request_id);
            }
            Request::Shutdown => {
                if let Err(e) = worker.instance.unload_model(&worker.model_id) {
                    tracing::warn!(model = %worker.model_id, "unload failed: {}", e.message);
                }
                // Destroying the instance is the plugin's last call; then the process ends
                // (threads a plugin left behind must not keep it alive). A call thread that has
                // just sent its last reply may hold the worker a moment longer.
                let mut worker = worker;
                for _ in 0..100 {
                    match Arc::try_unwrap(worker) {
                        Ok(only) => {
                            drop(only);
                            std::process::exit(0);
                        }
                        Err(shared) => worker = shared,
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                tracing::warn!("calls still running at shutdown; ending without destroy");
                std::process::exit(0);
            }
            Request::Load { .. } | Request::Probe { .. } => {
                eprintln!("llmr engine worker: Load twice");
                std::process::exit(2);
            }
            call => {
                let worker = worker.clone();
                let id = call_id(&call);
                let stop = Arc::new(AtomicBool::new(false));
                worker.stops.lock().unwrap().insert(id, stop.clone());
                worker.running.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let result = run_call(&worker, call, &stop);
                    worker.stops.lock().unwrap().remove(&id);
                    worker.running.fetch_sub(1, Ordering::SeqCst);
                    worker.send(match result {
                        Ok(outcome) => Reply::Done { call: id, outcome },
                        Err(error) => Reply::Failed { call: id, error },
                    });
                });
            }
        }
    }
}

fn load(
    plugin_dir: &std::path::Path,
    config: &llmr_engine_host::InstanceConfig,
    spec: &llmr_engine_host::ModelSpec,
) -> Result<(EngineInstance, String), CallError> {
    let plugin = open(plugin_dir)?;
    let instance = EngineInstance::create(&plugin, config)?;
    instance.load_model(spec)?;
    Ok((instance, spec.model_id.clone()))
}

/// Opens the plugin in `plugin_dir`, as the node's discovery does.
fn open(plugin_dir: &std::path::Path) -> Result<Arc<Plugin>, CallError> {
    let failed = |e: &dyn std::fmt::Display| CallError { status: EngineStatus::LoadFailed, message: e.to_string() };
    let manifest = Manifest::load(plugin_dir, abi::LLMR_ENGINE_ABI_MAJOR).map_err(|e| failed(&e))?;
    Plugin::open(plugin_dir, manifest).map_err(|e| failed(&e))
}

fn call_id(request: &Request) -> u64 {
    match request {
        Request::Tokenize { call, .. }
        | Request::Infer { call, .. }
        | Request::Embed { call, .. }
        | Request::Transcribe { call, .. }
        | Request::Synthesize { call, .. }
        | Request::Metrics { call }
        | Request::SetConfig { call, .. }
        | Request::Stop { call } => *call,
        Request::Load { .. } | Request::Probe { .. } | Request::Cancel { .. } | Request::Shutdown => 0,
    }
}

/// One call, on its own thread: events go out as they come; the outcome is returned.
fn run_call(worker: &Worker, request: Request, stop: &AtomicBool) -> Result<Outcome, CallError> {
    let model = worker.model_id.as_str();
    let instance = &worker.instance;
    let go_on = || !stop.load(Ordering::Relaxed);
    match request {
        Request::Tokenize { text, add_bos, parse_special, .. } => {
            instance.tokenize(model, &text, add_bos, parse_special).map(Outcome::Tokens)
        }
        Request::Infer { call, request } => {
            let params = InferParams {
                request_id: request.request_id,
                model_id: model,
                prompt: &request.prompt,
                sampling: request.sampling,
                parse_special: request.parse_special,
                add_bos: request.add_bos,
                ignore_eos: request.ignore_eos,
                prompt_tokens: request.prompt_tokens.as_deref(),
                special_text: request.special_text,
            };
            instance
                .infer(&params, |event: &TokenEvent<'_>| {
                    worker.send(Reply::Token {
                        call,
                        token_id: event.token_id,
                        text: event.text.to_string(),
                        logprob: event.logprob,
                        top: event.top.clone(),
                        timestamp_ns: event.timestamp_ns,
                    });
                    go_on()
                })
                .map(Outcome::Infer)
        }
        Request::Embed { call, request_id, inputs, normalize } => {
            let on_embedding = |index: usize, vector: &[f32]| {
                worker.send(Reply::Embedding { call, index, vector: vector.to_vec() });
                go_on()
            };
            match &inputs {
                EmbedInputs::Texts(texts) => {
                    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
                    instance.embed_inputs(request_id, model, HostEmbedInputs::Texts(&texts), normalize, on_embedding)
                }
                EmbedInputs::Tokens(ids) => {
                    let ids: Vec<&[i32]> = ids.iter().map(Vec::as_slice).collect();
                    instance.embed_inputs(request_id, model, HostEmbedInputs::Tokens(&ids), normalize, on_embedding)
                }
            }
            .map(Outcome::Embedded)
        }
        Request::Transcribe { call, request } => {
            let params = TranscribeParams {
                request_id: request.request_id,
                model_id: model,
                samples: &request.samples,
                sample_rate: request.sample_rate,
                language: request.language.as_deref(),
                prompt: request.prompt.as_deref(),
                temperature: request.temperature,
                translate: request.translate,
                word_timestamps: request.word_timestamps,
                beam_size: request.beam_size,
            };
            instance
                .transcribe(&params, |segment| {
                    worker.send(Reply::Segment { call, segment });
                    go_on()
                })
                .map(|()| Outcome::Unit)
        }
        Request::Synthesize { call, request } => {
            let params = SynthesizeParams {
                request_id: request.request_id,
                model_id: model,
                text: &request.text,
                voice: request.voice.as_deref(),
                speed: request.speed,
            };
            instance
                .synthesize(&params, |samples: &[f32], sample_rate| {
                    worker.send(Reply::Audio { call, samples: samples.to_vec(), sample_rate });
                    go_on()
                })
                .map(|()| Outcome::Unit)
        }
        Request::Metrics { .. } => instance.metrics().map(Outcome::Metrics),
        Request::SetConfig { key, value, .. } => instance.set_config(Some(model), &key, &value).map(|()| Outcome::Unit),
        Request::Load { .. }
        | Request::Probe { .. }
        | Request::Stop { .. }
        | Request::Cancel { .. }
        | Request::Shutdown => {
            unreachable!("handled by the reading loop")
        }
    }
}

/// The counters of work done that engines report in their metrics (at any depth: some report
/// per model). Clocks and gauges (`uptime_s`, memory) are left out: they move without progress.
const WORK_COUNTERS: [&str; 5] =
    ["decode_steps_total", "tokens_generated_total", "prompt_tokens_total", "sentences_total", "audio_samples_total"];

/// The sum of the work counters in an engine's metrics.
fn work_done(metrics: &serde_json::Value) -> f64 {
    match metrics {
        serde_json::Value::Object(map) => map
            .iter()
            .map(|(key, value)| match value.as_f64() {
                Some(n) if WORK_COUNTERS.contains(&key.as_str()) => n,
                _ => work_done(value),
            })
            .sum(),
        serde_json::Value::Array(items) => items.iter().map(work_done).sum(),
        _ => 0.0,
    }
}

/// While calls run, reads the engine's work counters every `PROGRESS_POLL` and reports a change.
/// A metrics call that blocks (an engine stuck holding its own lock) reports nothing, which is
/// what the node's watchdog should see. Ends with the worker.
fn watch_progress(worker: Weak<Worker>) {
    std::thread::spawn(move || {
        let mut last: Option<f64> = None;
        loop {
            std::thread::sleep(PROGRESS_POLL);
            let Some(worker) = worker.upgrade() else { return };
            if worker.running.load(Ordering::SeqCst) == 0 {
                last = None;
                continue;
            }
            let Ok(metrics) = worker.instance.metrics() else { continue };
            let now = work_done(&metrics);
            if last.is_some_and(|l| l != now) {
                worker.send(Reply::Progress);
            }
            last = Some(now);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_counted_at_any_depth_and_clocks_are_not() {
        let a = serde_json::json!({"uptime_s": 1.0, "models": [{"decode_steps_total": 3, "kv_cells_used": 9}]});
        let b = serde_json::json!({"uptime_s": 2.0, "models": [{"decode_steps_total": 3, "kv_cells_used": 1}]});
        assert_eq!(work_done(&a), 3.0);
        assert_eq!(work_done(&a), work_done(&b), "a clock or a gauge is not progress");
        let c = serde_json::json!({"tokens_generated_total": 5, "prompt_tokens_total": 2});
        assert_eq!(work_done(&c), 7.0);
    }
}
