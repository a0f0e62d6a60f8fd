//! The node's side of a worker: starts the process, sends calls, routes replies back to the
//! threads that wait on them, notices when the process ends, and ends it when it hangs.
//!
//! A call blocks its thread exactly as a plugin call does in process, and the callbacks run on
//! that thread. A reader thread owns the socket's input and the child: when the input ends it
//! reaps the process, and every call still waiting fails with the reason (500 for a crash, 504
//! for a hang the watchdog ended). The worker is never restarted here: a new `WorkerEngine` is
//! a new process, which the node makes when it reloads the model.

use crate::protocol::{read_line, write_line, EmbedInputs, InferRequest, Outcome, Reply, Request};
use crate::protocol::{SynthesizeRequest, TranscribeRequest};
use llmr_engine_host::{
    CallError, EmbedInputs as HostEmbedInputs, EngineStatus, InferParams, InferResult, InstanceConfig, ModelInfo,
    ModelSpec, Segment, SynthesizeParams, TokenEvent, TranscribeParams,
};
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{self, BufReader};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long a worker told to shut down may take before it is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The program that runs a worker: it must serve [`crate::serve_stdin`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl WorkerCommand {
    /// The running binary with `args` (how `llmr` runs its workers: `llmr engine-worker`).
    pub fn this_binary(args: &[&str]) -> io::Result<WorkerCommand> {
        Ok(WorkerCommand { program: std::env::current_exe()?, args: args.iter().map(|a| a.to_string()).collect() })
    }
}

/// One model loaded in an engine worker process.
pub struct WorkerEngine {
    info: ModelInfo,
    capabilities: u32,
    version: String,
    shared: Arc<Shared>,
}

struct Shared {
    model_id: String,
    output: Mutex<UnixStream>,
    calls: Mutex<Calls>,
    next_call: AtomicU64,
    /// `None` once reaped.
    child: Mutex<Option<Child>>,
    pid: u32,
    watchdog: Option<Duration>,
    /// Set by `Drop`: the end that follows is not a failure.
    closing: AtomicBool,
    /// Set by the watchdog before it kills the process.
    hung: AtomicBool,
}

#[derive(Default)]
struct Calls {
    waiting: HashMap<u64, Waiting>,
    /// Why the worker ended; every later call fails with it.
    ended: Option<CallError>,
}

struct Waiting {
    replies: mpsc::Sender<Reply>,
    /// The call's last event, or the engine's last reported progress, whichever is later.
    progress: Instant,
    /// Time the call may go without progress beyond the watchdog's: a transcription's first
    /// segment may take as long as the audio lasts on a slow machine (whisper.cpp decodes
    /// 30-second windows and reports no counters while it does).
    grace: Duration,
}

impl Shared {
    fn send(&self, request: &Request) -> io::Result<()> {
        write_line(&mut *self.output.lock().unwrap_or_else(|e| e.into_inner()), request)
    }

    fn kill(&self) {
        if let Some(child) = self.child.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            let _ = child.kill();
        }
    }

    fn ended(&self) -> Option<CallError> {
        self.calls.lock().unwrap().ended.clone()
    }

    fn route(&self, reply: Reply) {
        let mut calls = self.calls.lock().unwrap();
        let now = Instant::now();
        match &reply {
            Reply::Progress => calls.waiting.values_mut().for_each(|w| w.progress = now),
            Reply::Done { call, .. } | Reply::Failed { call, .. } => {
                if let Some(w) = calls.waiting.remove(call) {
                    let _ = w.replies.send(reply);
                }
            }
            Reply::Token { call, .. }
            | Reply::Embedding { call, .. }
            | Reply::Segment { call, .. }
            | Reply::Audio { call, .. } => {
                if let Some(w) = calls.waiting.get_mut(call) {
                    w.progress = now;
                    let _ = w.replies.send(reply);
                }
            }
            Reply::Loaded { .. } | Reply::LoadFailed { .. } | Reply::Probed { .. } => {
                tracing::warn!(model = %self.model_id, "engine worker answered a load twice");
            }
        }
    }
}

/// Starts a worker process of `command` on a socket pair; returns it and the node's end.
fn start(command: &WorkerCommand) -> Result<(Child, UnixStream), CallError> {
    let io_failed = |what: &str, e: io::Error| CallError {
        status: EngineStatus::LoadFailed,
        message: format!("engine worker: {what}: {e}"),
    };
    let (ours, theirs) = UnixStream::pair().map_err(|e| io_failed("socket pair", e))?;
    // The worker's standard output is the node's standard error: a plugin that prints must
    // not write into whatever the node's own output is.
    let stdout = std::io::stderr().as_fd().try_clone_to_owned().map_err(|e| io_failed("stderr", e))?;
    let child = Command::new(&command.program)
        .args(&command.args)
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::from(stdout))
        // Its own process group: Ctrl-C in a terminal reaches the node, which then stops
        // its workers after the requests in flight, rather than every worker at once.
        .process_group(0)
        .spawn()
        .map_err(|e| io_failed(&format!("cannot start {}", command.program.display()), e))?;
    Ok((child, ours))
}

/// Opens the plugin in `plugin_dir` in a worker process of its own, which then exits: a library
/// whose initialisers crash ends only that process. Returns the plugin's version; an error
/// says how the process ended, or why the plugin was refused. `limit`: how long opening it may
/// take.
pub fn probe(command: &WorkerCommand, plugin_dir: &Path, limit: Duration) -> Result<String, CallError> {
    let (mut child, ours) = start(command)?;
    let failed = |message: String| CallError { status: EngineStatus::LoadFailed, message };
    let mut output = ours.try_clone().map_err(|e| failed(format!("engine worker: socket: {e}")))?;
    ours.set_read_timeout(Some(limit)).map_err(|e| failed(format!("engine worker: socket: {e}")))?;
    let mut input = BufReader::new(ours);
    let first = write_line(&mut output, &Request::Probe { plugin_dir: plugin_dir.to_path_buf() })
        .and_then(|()| read_line::<Reply>(&mut input, &mut String::new()));
    let reply = match first {
        Ok(Some(Reply::Probed { version })) => Ok(version),
        Ok(Some(Reply::LoadFailed { error })) => Err(error),
        other => {
            let _ = child.kill();
            let how = describe(child.wait());
            let detail = match other {
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    format!(" (it did not answer within {} s)", limit.as_secs())
                }
                Err(e) => format!(" ({e})"),
                _ => String::new(),
            };
            return Err(failed(format!("opening the plugin ended its process: {how}{detail}")));
        }
    };
    let _ = child.wait();
    reply
}

impl WorkerEngine {
    /// Starts a worker, which opens the plugin in `plugin_dir`, creates an instance with
    /// `config` and loads `spec` (blocking, as a load in process does). A worker that fails to
    /// load says why; one that dies while loading is a LOAD_FAILED naming how it ended.
    /// `watchdog`: a call with no progress for this long is a hang, which ends the worker.
    /// `load_timeout`: a load that has not ended by then is a hang too (a load reports no
    /// progress), a TIMEOUT, and the worker is killed.
    pub fn spawn(
        command: &WorkerCommand,
        plugin_dir: &Path,
        config: &InstanceConfig,
        spec: &ModelSpec,
        watchdog: Option<Duration>,
        load_timeout: Option<Duration>,
    ) -> Result<WorkerEngine, CallError> {
        let failed = |message: String| CallError { status: EngineStatus::LoadFailed, message };
        let io_failed = |what: &str, e: io::Error| failed(format!("engine worker: {what}: {e}"));
        let (mut child, ours) = start(command)?;
        let pid = child.id();
        let mut output = ours.try_clone().map_err(|e| io_failed("socket", e))?;
        ours.set_read_timeout(load_timeout).map_err(|e| io_failed("socket", e))?;
        let mut input = BufReader::new(ours);
        let load = Request::Load { plugin_dir: plugin_dir.to_path_buf(), config: config.clone(), spec: spec.clone() };
        let first = write_line(&mut output, &load).and_then(|()| read_line::<Reply>(&mut input, &mut String::new()));
        if let (Err(e), Some(limit)) = (&first, load_timeout) {
            if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CallError {
                    status: EngineStatus::Timeout,
                    message: format!(
                        "the engine worker for model '{}' did not finish loading it within {} s; it was ended",
                        spec.model_id,
                        limit.as_secs()
                    ),
                });
            }
        }
        input.get_ref().set_read_timeout(None).map_err(|e| io_failed("socket", e))?;
        let (info, capabilities, version) = match first {
            Ok(Some(Reply::Loaded { info, capabilities, version })) => (*info, capabilities, version),
            Ok(Some(Reply::LoadFailed { error })) => {
                let _ = child.wait();
                return Err(error);
            }
            other => {
                let _ = child.kill();
                let how = describe(child.wait());
                let detail = match other {
                    Err(e) => format!(" ({e})"),
                    _ => String::new(),
                };
                return Err(failed(format!(
                    "the engine worker for model '{}' ended while loading it: {how}{detail}",
                    spec.model_id
                )));
            }
        };
        let shared = Arc::new(Shared {
            model_id: spec.model_id.clone(),
            output: Mutex::new(output),
            calls: Mutex::default(),
            next_call: AtomicU64::new(0),
            child: Mutex::new(Some(child)),
            pid,
            watchdog,
            closing: AtomicBool::new(false),
            hung: AtomicBool::new(false),
        });
        let reader = shared.clone();
        std::thread::Builder::new()
            .name(format!("worker-{pid}"))
            .spawn(move || read_replies(reader, input))
            .map_err(|e| io_failed("reader thread", e))?;
        if let Some(limit) = watchdog {
            let watched = Arc::downgrade(&shared);
            std::thread::Builder::new()
                .name(format!("watchdog-{pid}"))
                .spawn(move || watch(watched, limit))
                .map_err(|e| io_failed("watchdog thread", e))?;
        }
        Ok(WorkerEngine { info, capabilities, version, shared })
    }

    /// What the engine reported for the model, as it reported it.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The plugin's `LLMR_CAP_*` bits.
    pub fn capabilities(&self) -> u32 {
        self.capabilities
    }

    /// The plugin's version, as its binary reports it.
    pub fn version(&self) -> &str {
        &self.version
    }

    pub fn pid(&self) -> u32 {
        self.shared.pid
    }

    /// Why the worker ended (a crash, a hang, a kill), once it has; then every call fails.
    pub fn exit_reason(&self) -> Option<String> {
        self.shared.ended().map(|e| e.message)
    }

    pub fn tokenize(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<i32>, CallError> {
        let request = |call| Request::Tokenize { call, text: text.to_owned(), add_bos, parse_special };
        match self.call(request, |_| true, Duration::ZERO)? {
            Outcome::Tokens(ids) => Ok(ids),
            other => Err(unexpected(other)),
        }
    }

    pub fn infer(
        &self,
        params: &InferParams<'_>,
        on_token: &mut dyn FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<InferResult, CallError> {
        let request = |call| Request::Infer {
            call,
            request: InferRequest {
                request_id: params.request_id,
                prompt: params.prompt.to_owned(),
                sampling: params.sampling.clone(),
                parse_special: params.parse_special,
                add_bos: params.add_bos,
                ignore_eos: params.ignore_eos,
                prompt_tokens: params.prompt_tokens.map(<[i32]>::to_vec),
                special_text: params.special_text,
            },
        };
        let on_event = |reply| match reply {
            Reply::Token { token_id, text, logprob, top, timestamp_ns, .. } => {
                on_token(&TokenEvent { token_id, text: Cow::Owned(text), logprob, top, timestamp_ns })
            }
            _ => true,
        };
        let outcome = self.call(request, on_event, Duration::ZERO)?;
        match outcome {
            Outcome::Infer(result) => Ok(result),
            other => Err(unexpected(other)),
        }
    }

    pub fn embed(
        &self,
        request_id: u64,
        inputs: HostEmbedInputs<'_>,
        normalize: bool,
        on_embedding: &mut dyn FnMut(usize, &[f32]) -> bool,
    ) -> Result<u32, CallError> {
        let owned = match inputs {
            HostEmbedInputs::Texts(texts) => EmbedInputs::Texts(texts.iter().map(|t| t.to_string()).collect()),
            HostEmbedInputs::Tokens(ids) => EmbedInputs::Tokens(ids.iter().map(|i| i.to_vec()).collect()),
        };
        let request = move |call| Request::Embed { call, request_id, inputs: owned, normalize };
        let on_event = |reply| match reply {
            Reply::Embedding { index, vector, .. } => on_embedding(index, &vector),
            _ => true,
        };
        let outcome = self.call(request, on_event, Duration::ZERO)?;
        match outcome {
            Outcome::Embedded(prompt_tokens) => Ok(prompt_tokens),
            other => Err(unexpected(other)),
        }
    }

    pub fn transcribe(
        &self,
        params: &TranscribeParams<'_>,
        on_segment: &mut dyn FnMut(Segment) -> bool,
    ) -> Result<(), CallError> {
        let request = |call| Request::Transcribe {
            call,
            request: TranscribeRequest {
                request_id: params.request_id,
                samples: params.samples.to_vec(),
                sample_rate: params.sample_rate,
                language: params.language.map(str::to_owned),
                prompt: params.prompt.map(str::to_owned),
                temperature: params.temperature,
                translate: params.translate,
                word_timestamps: params.word_timestamps,
                beam_size: params.beam_size,
            },
        };
        let on_event = |reply| match reply {
            Reply::Segment { segment, .. } => on_segment(segment),
            _ => true,
        };
        let audio_seconds = params.samples.len() as f64 / f64::from(params.sample_rate.max(1));
        self.call(request, on_event, Duration::from_secs_f64(audio_seconds)).map(drop)
    }

    pub fn synthesize(
        &self,
        params: &SynthesizeParams<'_>,
        on_audio: &mut dyn FnMut(&[f32], u32) -> bool,
    ) -> Result<(), CallError> {
        let request = |call| Request::Synthesize {
            call,
            request: SynthesizeRequest {
                request_id: params.request_id,
                text: params.text.to_owned(),
                voice: params.voice.map(str::to_owned),
                speed: params.speed,
            },
        };
        let on_event = |reply| match reply {
            Reply::Audio { samples, sample_rate, .. } => on_audio(&samples, sample_rate),
            _ => true,
        };
        self.call(request, on_event, Duration::ZERO).map(drop)
    }

    /// Fire and forget: an unknown id is fine (the request may have just finished).
    pub fn cancel(&self, request_id: u64) {
        let _ = self.shared.send(&Request::Cancel { request_id });
    }

    pub fn metrics(&self) -> Result<serde_json::Value, CallError> {
        match self.call(|call| Request::Metrics { call }, |_| true, Duration::ZERO)? {
            Outcome::Metrics(value) => Ok(value),
            other => Err(unexpected(other)),
        }
    }

    pub fn set_config(&self, key: &str, value: &serde_json::Value) -> Result<(), CallError> {
        let request = |call| Request::SetConfig { call, key: key.to_owned(), value: value.clone() };
        self.call(request, |_| true, Duration::ZERO).map(drop)
    }

    /// Sends a call and waits for its outcome, handing its events to `on_event` on this thread.
    /// `on_event` returning false stops the call in the worker; a panic in it does too, and
    /// resumes here once the worker has finished the call. `grace`: see [`Waiting::grace`].
    fn call(
        &self,
        request: impl FnOnce(u64) -> Request,
        mut on_event: impl FnMut(Reply) -> bool,
        grace: Duration,
    ) -> Result<Outcome, CallError> {
        let call = self.shared.next_call.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, replies) = mpsc::channel();
        {
            let mut calls = self.shared.calls.lock().unwrap();
            if let Some(error) = &calls.ended {
                return Err(error.clone());
            }
            calls.waiting.insert(call, Waiting { replies: tx, progress: Instant::now(), grace });
        }
        // A failed write means the worker is gone; the reader then fails this call with why.
        let _ = self.shared.send(&request(call));
        let mut stopped = false;
        let mut panic = None;
        loop {
            match replies.recv() {
                Ok(Reply::Done { outcome, .. }) => {
                    if let Some(payload) = panic {
                        resume_unwind(payload);
                    }
                    return Ok(outcome);
                }
                Ok(Reply::Failed { error, .. }) => {
                    if let Some(payload) = panic {
                        resume_unwind(payload);
                    }
                    return Err(error);
                }
                Ok(event) if !stopped => {
                    let go_on = catch_unwind(AssertUnwindSafe(|| on_event(event))).unwrap_or_else(|payload| {
                        panic = Some(payload);
                        false
                    });
                    if !go_on {
                        stopped = true;
                        let _ = self.shared.send(&Request::Stop { call });
                    }
                }
                Ok(_) => {}
                Err(_) => {
                    return Err(self.shared.ended().unwrap_or_else(|| CallError {
                        status: EngineStatus::Internal,
                        message: format!("the engine worker of model '{}' dropped a call", self.shared.model_id),
                    }))
                }
            }
        }
    }
}

impl Drop for WorkerEngine {
    /// Asks the worker to unload and exit, and kills it if it has not within `SHUTDOWN_GRACE`;
    /// neither waits here (a node drops engines on its async threads).
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        let _ = self.shared.send(&Request::Shutdown);
        let shared = self.shared.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + SHUTDOWN_GRACE;
            while Instant::now() < deadline {
                if shared.ended().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            tracing::warn!(model = %shared.model_id, "engine worker did not shut down in time; killing it");
            shared.kill();
        });
    }
}

fn unexpected(outcome: Outcome) -> CallError {
    CallError { status: EngineStatus::Internal, message: format!("engine worker answered with {outcome:?}") }
}

/// The reader thread: routes replies until the input ends, then reaps the worker and fails
/// every call still waiting with how it ended.
fn read_replies(shared: Arc<Shared>, mut input: BufReader<UnixStream>) {
    let mut buf = String::new();
    let garbled = loop {
        match read_line::<Reply>(&mut input, &mut buf) {
            Ok(Some(reply)) => shared.route(reply),
            Ok(None) => break None,
            Err(e) => break Some(e),
        }
    };
    if garbled.is_some() {
        shared.kill();
    }
    let status = shared.child.lock().unwrap_or_else(|e| e.into_inner()).take().map(|mut child| child.wait());
    let how = status.map_or_else(|| "gone".to_owned(), describe);
    let model = &shared.model_id;
    let error = if shared.hung.load(Ordering::SeqCst) {
        let secs = shared.watchdog.unwrap_or_default().as_secs_f64();
        CallError {
            status: EngineStatus::Timeout,
            message: format!("the engine of model '{model}' made no progress for {secs} s; its worker was ended"),
        }
    } else {
        let detail = garbled.map(|e| format!(" after an unreadable reply ({e})")).unwrap_or_default();
        CallError {
            status: EngineStatus::Internal,
            message: format!("the engine worker of model '{model}' ended{detail}: {how}"),
        }
    };
    if !shared.closing.load(Ordering::SeqCst) {
        tracing::error!(model = %model, pid = shared.pid, "{}", error.message);
    }
    let waiting = {
        let mut calls = shared.calls.lock().unwrap();
        calls.ended = Some(error.clone());
        std::mem::take(&mut calls.waiting)
    };
    for (call, w) in waiting {
        let _ = w.replies.send(Reply::Failed { call, error: error.clone() });
    }
}

/// The watchdog: a waiting call whose last progress is older than `limit` is a hang, and the
/// worker is killed (its calls then fail with TIMEOUT). Ends with the worker.
fn watch(shared: Weak<Shared>, limit: Duration) {
    let tick = (limit / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        std::thread::sleep(tick);
        let Some(shared) = shared.upgrade() else { return };
        let stale = {
            let calls = shared.calls.lock().unwrap();
            if calls.ended.is_some() {
                return;
            }
            calls.waiting.values().any(|w| w.progress.elapsed() > limit + w.grace)
        };
        if stale && !shared.closing.load(Ordering::SeqCst) {
            shared.hung.store(true, Ordering::SeqCst);
            shared.kill();
            return;
        }
    }
}

/// How a process ended, in words a log reader knows (`killed by signal 11 (SIGSEGV)`).
fn describe(status: io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => match (status.signal(), status.code()) {
            (Some(signal), _) => {
                let name = match signal {
                    4 => " (SIGILL)",
                    6 => " (SIGABRT)",
                    7 => " (SIGBUS)",
                    8 => " (SIGFPE)",
                    9 => " (SIGKILL: the kernel's out-of-memory killer, or another process)",
                    11 => " (SIGSEGV)",
                    15 => " (SIGTERM)",
                    _ => "",
                };
                let core = if status.core_dumped() { ", core dumped" } else { "" };
                format!("killed by signal {signal}{name}{core}")
            }
            (None, Some(code)) => format!("exited with status {code}"),
            (None, None) => format!("{status}"),
        },
        Err(e) => format!("could not be reaped: {e}"),
    }
}
