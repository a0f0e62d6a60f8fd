//! One GPU, several modalities (spec 000): while requests of one modality (language models, speech
//! to text, text to speech, images) run or wait on the device, a request of another is refused
//! at once with 429 and Retry-After instead of queueing behind them. Two kinds of
//! model competing for one GPU slow each other and can run it out of memory; a refused request
//! goes elsewhere at once (the router tries the next node on a 429) or retries shortly.
//!
//! Which models take part is [`GateMode`]'s choice: by default those whose plugin runs on a GPU
//! backend. Models on the CPU queue as before (admission), whatever the others do.

use crate::error::NodeError;
use llmr_engine_host::{Capability, GpuBackend, ModelInfo};
use std::sync::{Arc, Mutex};

/// Which models the gate holds to one modality at a time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GateMode {
    /// Models whose plugin runs on a GPU backend (CUDA, Metal, DirectML): the spec's rule.
    #[default]
    Auto,
    /// Every model, CPU ones too (one modality at a time on the whole node).
    On,
    /// None: every request queues for its model's slots.
    Off,
}

impl GateMode {
    pub fn parse(s: &str) -> Option<GateMode> {
        match s {
            "auto" => Some(GateMode::Auto),
            "on" => Some(GateMode::On),
            "off" => Some(GateMode::Off),
            _ => None,
        }
    }

    /// Whether a model loaded on `backend` takes part.
    pub fn applies_to(self, backend: GpuBackend) -> bool {
        match self {
            GateMode::Auto => backend != GpuBackend::Cpu,
            GateMode::On => true,
            GateMode::Off => false,
        }
    }
}

/// The modality a model's requests count as. Language models are one, embedding models
/// included: they run on the same engines, are small beside a chat model, and a retrieval
/// pipeline asks for embeddings while its chat answers stream (refusing them would break it).
/// The spec's conflict is between engines: an LLM against Whisper, a voice or an image model.
pub fn modality_of(info: &ModelInfo) -> Capability {
    [Capability::Asr, Capability::Tts, Capability::Image].into_iter().find(|&c| info.has(c)).unwrap_or(Capability::Text)
}

/// Requests of each modality now running or waiting on the device (one gate per node: placement
/// on several GPUs will give each its own).
#[derive(Debug, Default)]
pub struct ModalityGate {
    holding: Mutex<Vec<(Capability, usize)>>,
}

/// Held for as long as the request's slot permit; dropping it lets other modalities in once the
/// last request of this one is gone.
#[derive(Debug)]
pub struct ModalityPermit {
    gate: Arc<ModalityGate>,
    modality: Capability,
}

impl ModalityGate {
    /// Counts a request of `modality` in, or refuses it while another modality holds the device.
    pub fn enter(self: &Arc<Self>, modality: Capability) -> Result<ModalityPermit, NodeError> {
        let mut holding = self.holding.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&(other, _)) = holding.iter().find(|(m, n)| *m != modality && *n > 0) {
            return Err(NodeError::DeviceBusy { wanted: modality, holding: other });
        }
        match holding.iter_mut().find(|(m, _)| *m == modality) {
            Some((_, n)) => *n += 1,
            None => holding.push((modality, 1)),
        }
        Ok(ModalityPermit { gate: self.clone(), modality })
    }

    /// The modality holding the device now, if any (for logs and tests).
    pub fn holder(&self) -> Option<Capability> {
        let holding = self.holding.lock().unwrap_or_else(|p| p.into_inner());
        holding.iter().find(|(_, n)| *n > 0).map(|&(m, _)| m)
    }
}

impl Drop for ModalityPermit {
    fn drop(&mut self) {
        let mut holding = self.gate.holding.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, n)) = holding.iter_mut().find(|(m, _)| *m == self.modality) {
            *n -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_modality_holds_the_device_until_its_last_request_is_gone() {
        let gate = Arc::new(ModalityGate::default());
        let first = gate.enter(Capability::Text).unwrap();
        let second = gate.enter(Capability::Text).unwrap();
        let refused = gate.enter(Capability::Asr).unwrap_err();
        assert!(
            matches!(refused, NodeError::DeviceBusy { wanted: Capability::Asr, holding: Capability::Text }),
            "{refused}"
        );
        drop(first);
        assert!(gate.enter(Capability::Tts).is_err(), "one text request still holds it");
        drop(second);
        assert_eq!(gate.holder(), None);
        let speech = gate.enter(Capability::Tts).unwrap();
        assert!(gate.enter(Capability::Text).is_err(), "and now speech holds it");
        drop(speech);
        gate.enter(Capability::Text).unwrap();
    }

    #[test]
    fn embedding_models_share_the_language_models_hold() {
        let info = |caps: &[Capability]| ModelInfo { capabilities: caps.to_vec(), ..ModelInfo::default() };
        assert_eq!(modality_of(&info(&[Capability::Embedding])), Capability::Text);
        assert_eq!(modality_of(&info(&[Capability::Text, Capability::Vision])), Capability::Text);
        assert_eq!(modality_of(&info(&[Capability::Asr])), Capability::Asr);
        assert_eq!(modality_of(&info(&[Capability::Tts])), Capability::Tts);
    }

    #[test]
    fn auto_takes_gpu_models_only() {
        assert!(GateMode::Auto.applies_to(GpuBackend::Cuda) && GateMode::Auto.applies_to(GpuBackend::Metal));
        assert!(!GateMode::Auto.applies_to(GpuBackend::Cpu));
        assert!(GateMode::On.applies_to(GpuBackend::Cpu) && !GateMode::Off.applies_to(GpuBackend::Cuda));
        assert_eq!(GateMode::parse("on"), Some(GateMode::On));
        assert_eq!(GateMode::parse("yes"), None);
    }
}
