//! One loaded Whisper model: its context (the weights) and a pool of decoding states.

use llmr_engine_sdk::{Capability, EngineError, ErrorCode, ModelInfo};
use std::path::Path;
use std::sync::Mutex;
use whisper_rs::{WhisperContext, WhisperContextParameters, WhisperState};

/// whisper.cpp's legacy model files begin with this magic ("ggml" as a little-endian u32).
const GGML_MAGIC: u32 = 0x6767_6d6c;
/// States kept for reuse: enough for the requests that run at once, not one per past request.
const POOLED_STATES: usize = 4;

pub struct WhisperModel {
    pub ctx: WhisperContext,
    states: Mutex<Vec<WhisperState>>,
    pub multilingual: bool,
    size_bytes: u64,
}

/// A state borrowed from the pool; returned to it when dropped.
pub struct PooledState<'m> {
    state: Option<WhisperState>,
    model: &'m WhisperModel,
}

impl std::ops::Deref for PooledState<'_> {
    type Target = WhisperState;
    fn deref(&self) -> &WhisperState {
        self.state.as_ref().expect("present until drop")
    }
}

impl std::ops::DerefMut for PooledState<'_> {
    fn deref_mut(&mut self) -> &mut WhisperState {
        self.state.as_mut().expect("present until drop")
    }
}

impl Drop for PooledState<'_> {
    fn drop(&mut self) {
        let mut pool = self.model.states.lock().unwrap();
        if pool.len() < POOLED_STATES {
            pool.extend(self.state.take());
        }
    }
}

/// Checks the file is whisper.cpp's format before whisper.cpp reads it: a wrong or truncated file
/// is then a clear error, where whisper.cpp would only log and return nothing.
fn check_file(path: &Path) -> Result<u64, EngineError> {
    use std::io::Read;
    let corrupt = |why: String| EngineError::new(ErrorCode::ModelCorrupt, format!("{}: {why}", path.display()));
    let mut file = std::fs::File::open(path)
        .map_err(|e| EngineError::load_failed(format!("cannot open {}: {e}", path.display())))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic).map_err(|_| corrupt("too short to be a whisper.cpp model".into()))?;
    if u32::from_le_bytes(magic) != GGML_MAGIC {
        return Err(corrupt("not a whisper.cpp (ggml) model file: wrong magic".into()));
    }
    Ok(size)
}

impl WhisperModel {
    pub fn load(path: &Path, use_gpu: bool) -> Result<Self, EngineError> {
        let size_bytes = check_file(path)?;
        let utf8 = path.to_str().ok_or_else(|| EngineError::load_failed("the model path is not UTF-8"))?;
        let mut params = WhisperContextParameters::default();
        params.use_gpu(use_gpu);
        let ctx = WhisperContext::new_with_params(utf8, params).map_err(|e| {
            EngineError::new(
                ErrorCode::ModelCorrupt,
                format!("whisper.cpp could not load {} ({e}): a truncated or damaged model file", path.display()),
            )
        })?;
        let multilingual = ctx.is_multilingual();
        // One state now: a model that loads but cannot allocate a state fails here, not on the
        // first request.
        let state = ctx.create_state().map_err(|e| EngineError::new(ErrorCode::OomRam, format!("{e}")))?;
        Ok(WhisperModel { ctx, states: Mutex::new(vec![state]), multilingual, size_bytes })
    }

    pub fn state(&self) -> Result<PooledState<'_>, EngineError> {
        let pooled = self.states.lock().unwrap().pop();
        let state = match pooled {
            Some(s) => s,
            None => self.ctx.create_state().map_err(|e| EngineError::new(ErrorCode::OomRam, format!("{e}")))?,
        };
        Ok(PooledState { state: Some(state), model: self })
    }

    /// The ISO 639-1 codes the model hears.
    pub fn languages(&self) -> Vec<String> {
        if !self.multilingual {
            return vec!["en".into()];
        }
        (0..=whisper_rs::get_lang_max_id()).filter_map(whisper_rs::get_lang_str).map(str::to_owned).collect()
    }

    pub fn info(&self, threads: u32) -> ModelInfo {
        let mut extra = llmr_engine_sdk::serde_json::Map::new();
        extra.insert("threads".into(), threads.into());
        if let Ok(kind) = self.ctx.model_type_readable_str() {
            extra.insert("model_type".into(), kind.into());
        }
        ModelInfo {
            architecture: Some("whisper".into()),
            context_length: Some(self.ctx.n_text_ctx() as u32),
            vocab_size: Some(self.ctx.n_vocab() as u32),
            size_bytes: Some(self.size_bytes),
            // One transcription uses every thread; more at once would only share them.
            slots: Some(1),
            languages: self.languages(),
            translates: Some(self.multilingual),
            sample_rate: Some(whisper_rs_sys::WHISPER_SAMPLE_RATE),
            capabilities: vec![Capability::Asr],
            extra,
            ..ModelInfo::default()
        }
    }
}
