//! A real worker process over the real echo plugin: every call kind, stopping, and the failures
//! a worker contains (a segfault, an abort, a hang).

use llmr_engine_host::{
    CallError, EmbedInputs, EngineStatus, FinishReason, Format, InferParams, InstanceConfig, ModelSpec, Sampling,
};
use llmr_engine_worker::{WorkerCommand, WorkerEngine};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn command() -> WorkerCommand {
    WorkerCommand { program: PathBuf::from(env!("CARGO_BIN_EXE_llmr-engine-worker")), args: Vec::new() }
}

/// A folder with the crash-on-demand echo plugin and a model file for it.
struct Setup {
    _dir: tempfile::TempDir,
    plugin_dir: PathBuf,
    model: PathBuf,
}

fn setup(delay_ms: u64) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let engines = llmr_testkit::crashing_echo_engines(&dir.path().join("engines"), delay_ms);
    let model = dir.path().join("m.gguf");
    std::fs::write(&model, llmr_testkit::gguf_with_architecture("echo", 0)).unwrap();
    Setup { plugin_dir: engines.join("echo/cpu"), model, _dir: dir }
}

fn spawn(setup: &Setup, watchdog: Option<Duration>) -> Result<WorkerEngine, CallError> {
    let spec = ModelSpec::new("m", Format::Gguf, setup.model.display().to_string());
    let config = InstanceConfig { slots: 4, ..Default::default() };
    WorkerEngine::spawn(&command(), &setup.plugin_dir, &config, &spec, watchdog, None)
}

fn generate(engine: &WorkerEngine, request_id: u64, prompt: &str) -> Result<(String, FinishReason), CallError> {
    let mut text = String::new();
    let result = engine.infer(&InferParams::greedy(request_id, "m", prompt), &mut |t| {
        text.push_str(&t.text);
        true
    })?;
    Ok((text, result.finish_reason))
}

fn process_alive(pid: u32) -> bool {
    // A zombie (ended, not yet reaped) counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_call_kind_is_answered_from_the_worker_process() {
    let setup = setup(0);
    let engine = spawn(&setup, Some(Duration::from_secs(30))).unwrap();
    assert_ne!(engine.pid(), std::process::id());
    assert_eq!(engine.info().architecture.as_deref(), Some("echo"));
    assert_eq!(engine.version(), "0.1.0");

    assert_eq!(engine.tokenize("a b c", true, false).unwrap().len(), 4, "BOS and three words");
    let (text, finish) = generate(&engine, 1, "the quick\nbrown fox").unwrap();
    assert_eq!((text.as_str(), finish), ("the quick brown fox", FinishReason::Stop));

    let sampling = Sampling { stop: vec!["brown".into()], logprobs: Some(2), ..Sampling::greedy() };
    let mut tops = Vec::new();
    let result = engine
        .infer(&InferParams::new(2, "m", "the quick brown fox", sampling), &mut |t| {
            tops.push(t.top.len());
            true
        })
        .unwrap();
    assert_eq!(result.stop_index, Some(0), "the stop sequence's index crosses the process boundary");
    assert!(tops.iter().all(|&n| n == 2), "{tops:?}");

    let mut vectors = Vec::new();
    let prompt_tokens = engine
        .embed(3, EmbedInputs::Texts(&["one two", "three"]), true, &mut |i, v| {
            vectors.push((i, v.len(), v.iter().map(|x| x * x).sum::<f32>()));
            true
        })
        .unwrap();
    assert!(prompt_tokens >= 3);
    assert_eq!(vectors.len(), 2);
    assert!(vectors.iter().all(|&(_, len, norm)| len == 64 && (norm - 1.0).abs() < 1e-3), "{vectors:?}");

    engine.set_config("token_delay_ms", &serde_json::json!(1)).unwrap();
    let err = engine.set_config("no_such_key", &serde_json::json!(1)).unwrap_err();
    assert!(err.message.contains("no_such_key"), "{err:?}");
    let metrics = engine.metrics().unwrap();
    assert_eq!(metrics["requests_total"], 2, "{metrics}");
    assert_eq!(engine.exit_reason(), None);
}

#[test]
fn a_callback_returning_false_stops_the_generation_in_the_worker() {
    let setup = setup(20);
    let engine = spawn(&setup, None).unwrap();
    let prompt = vec!["word"; 200].join(" ");
    let mut seen = 0;
    let result = engine
        .infer(&InferParams::greedy(1, "m", &prompt), &mut |_| {
            seen += 1;
            seen < 3
        })
        .unwrap();
    assert_eq!(result.finish_reason, FinishReason::Cancelled);
    assert!(result.completion_tokens < 10, "{result:?}");
    // The worker is free for the next call.
    assert_eq!(generate(&engine, 2, "still here").unwrap().0, "still here");
}

#[test]
fn cancel_by_request_id_reaches_the_engine() {
    let setup = setup(20);
    let engine = std::sync::Arc::new(spawn(&setup, None).unwrap());
    let prompt = vec!["word"; 500].join(" ");
    let running = {
        let engine = engine.clone();
        std::thread::spawn(move || engine.infer(&InferParams::greedy(77, "m", &prompt), &mut |_| true))
    };
    wait_until("the generation runs", || engine.metrics().unwrap()["slots_busy"] == 1);
    engine.cancel(77);
    let result = running.join().unwrap().unwrap();
    assert_eq!(result.finish_reason, FinishReason::Cancelled);
}

/// A crash ends the calls in flight with how the process ended, and every later call too.
fn crash_contained(magic: &str, signal: &str) {
    let setup = setup(20);
    let engine = std::sync::Arc::new(spawn(&setup, None).unwrap());
    let pid = engine.pid();
    let long = {
        let engine = engine.clone();
        std::thread::spawn(move || generate(&engine, 1, &vec!["word"; 500].join(" ")))
    };
    wait_until("the long generation runs", || engine.metrics().unwrap()["slots_busy"] == 1);
    let err = generate(&engine, 2, &format!("please {magic} now")).unwrap_err();
    assert_eq!(err.status, EngineStatus::Internal);
    assert!(err.message.contains(signal) && err.message.contains("'m'"), "{err:?}");
    let err = long.join().unwrap().unwrap_err();
    assert!(err.message.contains(signal), "the call in flight fails the same way: {err:?}");
    assert!(engine.exit_reason().is_some_and(|r| r.contains(signal)));
    assert!(engine.tokenize("a", false, false).unwrap_err().message.contains(signal));
    wait_until("the worker is reaped", || !process_alive(pid));
}

#[test]
fn a_segfault_ends_only_the_worker() {
    crash_contained("LLMR_CRASH_SEGFAULT", "SIGSEGV");
}

#[test]
fn an_abort_ends_only_the_worker() {
    crash_contained("LLMR_CRASH_ABORT", "SIGABRT");
}

#[test]
fn the_watchdog_ends_a_hung_engine_with_a_timeout() {
    let setup = setup(0);
    let engine = spawn(&setup, Some(Duration::from_millis(500))).unwrap();
    let pid = engine.pid();
    let err = generate(&engine, 1, "LLMR_HANG").unwrap_err();
    assert_eq!(err.status, EngineStatus::Timeout, "{err:?}");
    assert_eq!(err.status.http_status(), 504);
    assert!(err.message.contains("no progress"), "{err:?}");
    wait_until("the hung worker is gone", || !process_alive(pid));
}

#[test]
fn a_generation_slower_than_the_watchdog_in_total_is_not_a_hang() {
    // 40 tokens 50 ms apart: two seconds in all, four times the watchdog, progress at every token.
    let setup = setup(50);
    let engine = spawn(&setup, Some(Duration::from_millis(500))).unwrap();
    let (text, finish) = generate(&engine, 1, &vec!["w"; 40].join(" ")).unwrap();
    assert_eq!((text.split(' ').count(), finish), (40, FinishReason::Stop));
}

#[test]
fn a_load_failure_is_the_engines_error_and_the_worker_exits() {
    let setup = setup(0);
    let spec = ModelSpec::new("m", Format::Gguf, setup.model.with_extension("missing").display().to_string());
    let err = WorkerEngine::spawn(&command(), &setup.plugin_dir, &InstanceConfig::default(), &spec, None, None)
        .err()
        .expect("a missing model file fails the load");
    assert_eq!(err.status, EngineStatus::LoadFailed);
    assert!(err.message.contains("model file not found"), "{err:?}");

    let err = WorkerEngine::spawn(&command(), Path::new("/nonexistent"), &InstanceConfig::default(), &spec, None, None)
        .err()
        .expect("no plugin there");
    assert_eq!(err.status, EngineStatus::LoadFailed);
}

#[test]
fn a_load_that_hangs_is_a_timeout_and_the_worker_is_ended() {
    let setup = setup(0);
    let spec = ModelSpec::new("m-LLMR_HANG", Format::Gguf, setup.model.display().to_string());
    let err = WorkerEngine::spawn(
        &command(),
        &setup.plugin_dir,
        &InstanceConfig::default(),
        &spec,
        None,
        Some(Duration::from_secs(1)),
    )
    .err()
    .expect("a load that never ends fails");
    assert_eq!(err.status, EngineStatus::Timeout, "{err:?}");
    assert!(err.message.contains("did not finish loading it within 1 s"), "{err:?}");
    // The same model id without the magic loads within the limit.
    let spec = ModelSpec::new("m", Format::Gguf, setup.model.display().to_string());
    let engine = WorkerEngine::spawn(
        &command(),
        &setup.plugin_dir,
        &InstanceConfig::default(),
        &spec,
        None,
        Some(Duration::from_secs(60)),
    );
    assert!(engine.is_ok());
}

#[test]
fn dropping_the_engine_ends_its_worker() {
    let setup = setup(0);
    let engine = spawn(&setup, None).unwrap();
    let pid = engine.pid();
    assert!(process_alive(pid));
    drop(engine);
    wait_until("the worker exits after shutdown", || !process_alive(pid));
}
