//! ONNX Runtime: finding the library, the process's one environment, and a voice's session.

use llmr_engine_sdk::{serde_json, EngineError, ErrorCode};
use ort::session::{RunOptions, Session};
use ort::value::{Tensor, ValueType};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The library file the `onnxruntime` asset of scripts/fetch-models installs.
pub const RUNTIME_FILE: &str = "libonnxruntime.so.1.31.1";
/// Environment variable naming the library (ort's own convention).
pub const RUNTIME_ENV: &str = "ORT_DYLIB_PATH";
/// The manifest parameter naming it.
pub const RUNTIME_PARAM: &str = "onnxruntime_library";

/// Where ONNX Runtime is, in order: `ORT_DYLIB_PATH`, the engine parameter
/// `onnxruntime_library` (empty = not set; `~/` is the home folder), the model cache's
/// `onnxruntime/` (where `scripts/fetch-models onnxruntime` puts it: `$LLMR_MODEL_CACHE`, else
/// `~/.cache/llmr/models`). A path that is named but missing is an error, not skipped.
pub fn runtime_library(params: &serde_json::Value) -> Result<PathBuf, EngineError> {
    let configured = std::env::var_os(RUNTIME_ENV)
        .filter(|v| !v.is_empty())
        .map(|v| (PathBuf::from(v), RUNTIME_ENV))
        .or_else(|| {
            let param = params.get(RUNTIME_PARAM).and_then(|v| v.as_str()).filter(|s| !s.is_empty());
            param.map(|s| (expand_home(s), RUNTIME_PARAM))
        });
    if let Some((path, from)) = configured {
        return if path.is_file() {
            Ok(path)
        } else {
            Err(EngineError::load_failed(format!(
                "ONNX Runtime library {} (from {from}) does not exist: run `scripts/fetch-models onnxruntime` or \
                 point {from} at libonnxruntime.so (1.31 or newer)",
                path.display()
            )))
        };
    }
    let cache = std::env::var_os("LLMR_MODEL_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/llmr/models")));
    if let Some(path) = cache.map(|c| c.join("onnxruntime").join(RUNTIME_FILE)).filter(|p| p.is_file()) {
        return Ok(path);
    }
    Err(EngineError::load_failed(format!(
        "ONNX Runtime was not found: run `scripts/fetch-models onnxruntime`, or set {RUNTIME_ENV} or the engine \
         parameter `{RUNTIME_PARAM}` to the path of libonnxruntime.so (1.31 or newer)"
    )))
}

fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(path),
    }
}

/// ONNX Runtime allows one environment per process, and ort loads one library per process.
struct Runtime {
    library: PathBuf,
    env: ort::environment::Environment,
}

static RUNTIME: Mutex<Option<Runtime>> = Mutex::new(None);

/// The process's environment, loading `library` the first time. A later call naming another
/// library gets the first one (returned, so the caller can say so).
pub fn environment(library: &Path) -> Result<(ort::environment::Environment, PathBuf), EngineError> {
    let mut guard = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(rt) = guard.as_ref() {
        return Ok((rt.env.clone(), rt.library.clone()));
    }
    let failed =
        |e: String| EngineError::load_failed(format!("cannot load ONNX Runtime from {}: {e}", library.display()));
    let env = ort::init_from(library)
        .map_err(|e| failed(e.to_string()))?
        .with_name("llmr-onnx-tts")
        .with_telemetry(false)
        .build()
        .map_err(|e| failed(e.to_string()))?;
    *guard = Some(Runtime { library: library.to_path_buf(), env: env.clone() });
    Ok((env, library.to_path_buf()))
}

/// One voice's ONNX session.
///
/// ort 2.0.0-rc.15's `Session::run` takes `&mut self` (ONNX Runtime's allocators are not all
/// thread-safe), so requests on the same voice take turns, one sentence at a time: concurrent
/// requests interleave at sentence boundaries and each keeps streaming.
pub struct VoiceModel {
    session: Mutex<Session>,
    takes_sid: bool,
}

/// Piper's inputs; `sid` only in multi-speaker voices.
const INPUTS: [&str; 3] = ["input", "input_lengths", "scales"];

impl VoiceModel {
    pub fn load(
        env: &ort::environment::Environment,
        path: &Path,
        threads: u32,
        multi_speaker: bool,
    ) -> Result<Self, EngineError> {
        let setup = |e: String| EngineError::load_failed(format!("ONNX Runtime session options: {e}"));
        let mut builder = Session::builder(env).map_err(|e| setup(e.to_string()))?;
        if threads > 0 {
            builder = builder.with_intra_threads(threads as usize).map_err(|e| setup(e.to_string()))?;
        }
        // Spinning idle threads would burn CPU between sentences and requests that the node's
        // other engines could use.
        builder = builder.with_intra_op_spinning(false).map_err(|e| setup(e.to_string()))?;
        builder = builder.with_inter_op_spinning(false).map_err(|e| setup(e.to_string()))?;
        let session = builder.commit_from_file(path).map_err(|e| {
            EngineError::new(ErrorCode::ModelCorrupt, format!("ONNX Runtime cannot load {}: {e}", path.display()))
        })?;
        let names: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
        let takes_sid = names.contains(&"sid");
        let missing: Vec<&str> = INPUTS.iter().copied().filter(|n| !names.contains(n)).collect();
        let unknown: Vec<&str> = names.iter().copied().filter(|n| !INPUTS.contains(n) && *n != "sid").collect();
        if !missing.is_empty() || !unknown.is_empty() || (multi_speaker && !takes_sid) {
            return Err(EngineError::load_failed(format!(
                "{} is not a Piper voice: its inputs are {names:?}, a Piper voice has input, input_lengths, scales{}",
                path.display(),
                if multi_speaker {
                    " and sid (its config has several speakers)"
                } else {
                    " (and sid when it has several speakers)"
                }
            )));
        }
        match session.outputs().first().map(|o| o.dtype()) {
            Some(ValueType::Tensor { ty: ort::value::TensorElementType::Float32, .. }) => {}
            other => {
                return Err(EngineError::load_failed(format!(
                    "{} is not a Piper voice: its first output is {other:?}, not float audio",
                    path.display()
                )))
            }
        }
        Ok(VoiceModel { session: Mutex::new(session), takes_sid })
    }

    /// Audio for one sentence's phoneme ids. `scales` are noise, length and noise_w. An error
    /// after `options` was terminated means the request was cancelled.
    pub fn run(
        &self,
        ids: &[i64],
        scales: [f32; 3],
        sid: Option<i64>,
        options: &RunOptions,
    ) -> Result<Vec<f32>, String> {
        let e = |e: ort::Error| e.to_string();
        let mut inputs = ort::inputs![
            "input" => Tensor::from_array(([1usize, ids.len()], ids.to_vec())).map_err(e)?,
            "input_lengths" => Tensor::from_array(([1usize], vec![ids.len() as i64])).map_err(e)?,
            "scales" => Tensor::from_array(([3usize], scales.to_vec())).map_err(e)?,
        ];
        if self.takes_sid {
            // A single-speaker config on a model with a speaker input: speaker 0.
            let sid = Tensor::from_array(([1usize], vec![sid.unwrap_or(0)])).map_err(e)?;
            inputs.push(("sid".into(), sid.into()));
        }
        let mut session = self.session.lock().unwrap_or_else(|p| p.into_inner());
        let outputs = session.run_with_options(inputs, options).map_err(e)?;
        let (_, audio) = outputs[0].try_extract_tensor::<f32>().map_err(e)?;
        Ok(audio.to_vec())
    }
}

/// Piper's output processing: scaled so the loudest sample is at full range (silence stays
/// silent), then clipped.
pub fn normalize(audio: &mut [f32]) {
    let peak = audio.iter().fold(0f32, |m, &s| m.max(s.abs()));
    if peak <= 1e-8 || !peak.is_finite() {
        audio.iter_mut().for_each(|s| *s = 0.0);
        return;
    }
    for s in audio.iter_mut() {
        *s = (*s / peak).clamp(-1.0, 1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audio_is_scaled_to_full_range() {
        let mut a = [0.1, -0.25, 0.05];
        normalize(&mut a);
        assert_eq!(a, [0.4, -1.0, 0.2]);
        let mut silent = [0.0, 1e-10];
        normalize(&mut silent);
        assert_eq!(silent, [0.0, 0.0]);
    }

    #[test]
    fn a_configured_library_that_is_missing_is_named() {
        // ORT_DYLIB_PATH would win over the parameter; this test only runs the parameter path
        // when the variable is unset.
        if std::env::var_os(RUNTIME_ENV).is_some() {
            return;
        }
        let e = runtime_library(&serde_json::json!({ RUNTIME_PARAM: "/no/such/libonnxruntime.so" })).unwrap_err();
        assert_eq!(e.code, ErrorCode::LoadFailed);
        assert!(e.message.contains("/no/such/libonnxruntime.so") && e.message.contains(RUNTIME_PARAM), "{e}");
    }
}
