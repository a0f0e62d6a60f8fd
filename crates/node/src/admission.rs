//! Admission in front of an engine: up to `slots` requests run, up to `queue_limit` wait, and
//! the next one is refused with 429 and Retry-After (spec 003: the queue is bounded). A model on
//! a GPU first passes the node's modality gate (`modality_gate.rs`), which refuses at once.

use crate::error::NodeError;
use crate::modality_gate::{ModalityGate, ModalityPermit};
use llmr_engine_host::Capability;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct Admission {
    slots: Arc<Semaphore>,
    total_slots: usize,
    waiting: AtomicUsize,
    queue_limit: usize,
    /// The node's gate and this model's modality, when the model takes part.
    gate: Option<(Arc<ModalityGate>, Capability)>,
}

/// Held for the whole of one request's engine work; dropping it frees the slot (and the
/// request's place in its modality's hold on the device).
#[derive(Debug)]
pub struct SlotPermit {
    _slot: OwnedSemaphorePermit,
    _modality: Option<ModalityPermit>,
}

struct WaitingGuard<'a>(&'a AtomicUsize);

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Admission {
    pub fn new(slots: u32, queue_limit: usize) -> Self {
        let total_slots = slots.max(1) as usize;
        Admission {
            slots: Arc::new(Semaphore::new(total_slots)),
            total_slots,
            waiting: AtomicUsize::new(0),
            queue_limit,
            gate: None,
        }
    }

    /// Requests for this model first pass `gate` as `modality`.
    pub fn gated(mut self, gate: Arc<ModalityGate>, modality: Capability) -> Self {
        self.gate = Some((gate, modality));
        self
    }

    /// Waits for a slot, or fails at once with 429 when the queue is full or another modality
    /// holds the device. A caller that goes away while waiting leaves the queue (the future is
    /// dropped) and the gate.
    pub async fn admit(&self) -> Result<SlotPermit, NodeError> {
        let modality = match &self.gate {
            Some((gate, modality)) => Some(gate.enter(*modality)?),
            None => None,
        };
        let slot = match self.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                let before = self.waiting.fetch_add(1, Ordering::Relaxed);
                let _guard = WaitingGuard(&self.waiting);
                if before >= self.queue_limit {
                    return Err(NodeError::QueueFull { running: self.total_slots, queued: self.queue_limit });
                }
                self.slots.clone().acquire_owned().await.map_err(|_| NodeError::Unloading)?
            }
        };
        Ok(SlotPermit { _slot: slot, _modality: modality })
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    pub fn busy(&self) -> usize {
        self.total_slots - self.slots.available_permits()
    }

    pub fn total_slots(&self) -> usize {
        self.total_slots
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn admits_slots_then_queues_then_refuses() {
        let a = Arc::new(Admission::new(1, 1));
        let first = a.admit().await.unwrap();
        let a2 = a.clone();
        let queued = tokio::spawn(async move { a2.admit().await.map(|_| ()) });
        while a.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        let refused = a.admit().await.unwrap_err();
        assert!(matches!(refused, NodeError::QueueFull { running: 1, queued: 1 }), "{refused}");
        drop(first);
        queued.await.unwrap().unwrap();
        assert_eq!((a.waiting(), a.busy()), (0, 0));
    }

    #[tokio::test]
    async fn a_caller_that_leaves_frees_its_queue_place() {
        let a = Arc::new(Admission::new(1, 1));
        let _first = a.admit().await.unwrap();
        let a2 = a.clone();
        let queued = tokio::spawn(async move { a2.admit().await.map(|_| ()) });
        while a.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        queued.abort();
        let _ = queued.await;
        assert_eq!(a.waiting(), 0);
    }

    #[tokio::test]
    async fn gated_models_refuse_another_modality_at_once_and_a_queued_request_holds_its_own() {
        let gate = Arc::new(ModalityGate::default());
        let chat = Arc::new(Admission::new(1, 4).gated(gate.clone(), Capability::Text));
        let whisper = Admission::new(1, 4).gated(gate.clone(), Capability::Asr);
        let running = chat.admit().await.unwrap();
        let chat2 = chat.clone();
        let queued = tokio::spawn(async move { chat2.admit().await.map(|_| ()) });
        while chat.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        let refused = whisper.admit().await.unwrap_err();
        assert!(matches!(refused, NodeError::DeviceBusy { wanted: Capability::Asr, .. }), "{refused}");
        assert_eq!(whisper.waiting(), 0, "refused, not queued");
        drop(running);
        queued.await.unwrap().unwrap();
        assert_eq!(gate.holder(), None, "the queued request left the gate with its slot");
        let _speech = whisper.admit().await.unwrap();
        assert!(matches!(chat.admit().await.unwrap_err(), NodeError::DeviceBusy { holding: Capability::Asr, .. }));
        // An ungated model (on the CPU) is not held back.
        Admission::new(1, 0).admit().await.unwrap();
    }
}
