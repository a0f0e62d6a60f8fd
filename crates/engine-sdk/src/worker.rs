//! The thread model every batching engine shares: one worker thread per loaded model owns the
//! model's mutable state (KV cache, running sequences) and is fed through a channel; the host's
//! `infer` call, on its own thread, waits for that request's events and hands them to its sink.
//!
//! Engines differ in what runs on the worker (their scheduler); the plumbing around it, and the
//! rules about cancellation it implements, are the same and live here once.

use crate::{EngineError, ErrorCode, FinishReason, InferOutcome, Token, TokenSink, TopLogprob};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::Instant;

/// Monotonic nanoseconds since the plugin first needed a clock (token timestamps).
pub fn clock_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// The end of a request that ran: its counts and timings (prompt evaluation until the first
/// token, generation after it; a request ended before its first token spent all in the prompt),
/// and the stop sequence that ended it, if one did (`StopMatcher::matched`).
pub fn finished(
    reason: FinishReason,
    (prompt_tokens, cached_tokens, completion_tokens): (usize, usize, u32),
    stop_index: Option<usize>,
    started: Instant,
    first_token: Option<Instant>,
) -> Event {
    let now = Instant::now();
    Event::Done(InferOutcome {
        finish_reason: reason,
        stop_index: stop_index.map(|i| i as u32),
        prompt_tokens: prompt_tokens as u32,
        completion_tokens,
        cached_tokens: cached_tokens as u32,
        prompt_eval_ns: first_token.map_or(now - started, |t| t - started).as_nanos() as u64,
        generation_ns: first_token.map_or(0, |t| (now - t).as_nanos() as u64),
    })
}

/// What a request cancelled while still queued reports: its prompt, nothing generated.
pub fn cancelled_in_queue(prompt_tokens: usize) -> Event {
    Event::Done(InferOutcome {
        finish_reason: FinishReason::Cancelled,
        stop_index: None,
        prompt_tokens: prompt_tokens as u32,
        completion_tokens: 0,
        cached_tokens: 0,
        prompt_eval_ns: 0,
        generation_ns: 0,
    })
}

/// One generated token, owned, on its way from the worker to the requesting thread.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEvent {
    pub id: i32,
    pub text: String,
    pub logprob: f32,
    /// (token id, logprob, text) of the most likely alternatives, when logprobs were asked for.
    pub top: Vec<(i32, f32, String)>,
    pub t_ns: u64,
}

/// What a worker tells the requesting thread about one request.
#[derive(Debug)]
pub enum Event {
    Token(TokenEvent),
    Done(InferOutcome),
    Failed(EngineError),
}

/// A thread fed through a channel of commands `C`; sent `stop` and joined on drop.
pub struct Worker<C> {
    tx: Sender<C>,
    thread: Option<JoinHandle<()>>,
    stop: Option<C>,
}

impl<C> Worker<C> {
    pub fn send(&self, cmd: C) -> Result<(), EngineError> {
        self.tx.send(cmd).map_err(|_| EngineError::internal("the model's worker thread has stopped"))
    }
}

impl<C> Drop for Worker<C> {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = self.tx.send(stop);
        }
        // Closing the channel ends a worker that has no stop command.
        let (dead, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.tx, dead));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts a worker thread running `body` and waits until `body` reports through its second
/// argument whether it could start (a model that fails to set up fails the load, not a request).
pub fn spawn_worker<C: Send + 'static>(
    name: String,
    stop: Option<C>,
    body: impl FnOnce(Receiver<C>, Sender<Result<(), EngineError>>) + Send + 'static,
) -> Result<Worker<C>, EngineError> {
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(name)
        .spawn(move || body(rx, ready_tx))
        .map_err(|e| EngineError::new(ErrorCode::OomRam, format!("cannot start a worker thread: {e}")))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(Worker { tx, thread: Some(thread), stop }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            Err(EngineError::internal("the worker thread stopped while starting"))
        }
    }
}

/// Hands one request's events to the host's sink until the worker says it is done. When the
/// host asks to stop (the sink returns false), `cancel` is raised for the worker, later tokens are
/// dropped and the outcome is reported as cancelled.
pub fn relay(events: Receiver<Event>, sink: &mut TokenSink, cancel: &AtomicBool) -> Result<InferOutcome, EngineError> {
    let mut stopped_by_host = false;
    loop {
        match events.recv() {
            Ok(Event::Token(t)) if !stopped_by_host => {
                let top: Vec<TopLogprob<'_>> =
                    t.top.iter().map(|(id, lp, text)| TopLogprob { token_id: *id, logprob: *lp, text }).collect();
                let token =
                    Token { token_id: t.id, text: &t.text, logprob: t.logprob, top: &top, timestamp_ns: t.t_ns };
                if !sink.emit(&token) {
                    stopped_by_host = true;
                    cancel.store(true, Ordering::SeqCst);
                }
            }
            Ok(Event::Token(_)) => {}
            Ok(Event::Done(mut outcome)) => {
                if stopped_by_host {
                    outcome.finish_reason = FinishReason::Cancelled;
                }
                return Ok(outcome);
            }
            Ok(Event::Failed(e)) => return Err(e),
            Err(_) => return Err(EngineError::internal("the model's scheduler stopped mid-request")),
        }
    }
}
