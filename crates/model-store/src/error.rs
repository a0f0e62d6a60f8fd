//! Why the store could not list, resolve or import a model.

use crate::descriptor::Format;
use crate::gguf::GgufError;
use crate::name::NameError;
use crate::safetensors::SafetensorsError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("model '{name}' not found (no directory {})", dir.display())]
    NotFound { name: String, dir: PathBuf },
    #[error("{}: no model files (expected a .gguf, a .safetensors, a .safetensors.index.json, a whisper.cpp .bin or a Piper .onnx voice)", dir.display())]
    NoModelFiles { dir: PathBuf },
    #[error("{}: {source}", path.display())]
    Gguf {
        path: PathBuf,
        #[source]
        source: GgufError,
    },
    #[error("{}: the GGUF has no general.architecture", path.display())]
    MissingArchitecture { path: PathBuf },
    #[error("{} is a vision projector (mmproj), not a model", path.display())]
    Projector { path: PathBuf },
    #[error("model '{name}' has no GGUF with quantization '{requested}' (exact, case-sensitive match); available: {}", available.join(", "))]
    QuantizationNotFound { name: String, requested: String, available: Vec<String> },
    #[error("model '{name}' has several GGUF files; ask for one as '{name}:<quantization>', available: {}", available.join(", "))]
    AmbiguousQuantization { name: String, available: Vec<String> },
    #[error("model '{name}' has several GGUF files with quantization {}: {}", quantization.as_deref().unwrap_or("(unknown)"), display_paths(files))]
    DuplicateQuantization { name: String, quantization: Option<String>, files: Vec<PathBuf> },
    #[error("model '{name}' is in {format} format; only GGUF models take a ':<quantization>' tag")]
    TagOnNonGguf { name: String, format: Format },
    #[error("{}: both GGUF ({}) and safetensors weights; name a GGUF with ':<quantization>' or keep one format", dir.display(), gguf.join(", "))]
    MixedFormats { dir: PathBuf, gguf: Vec<String> },
    #[error("{}: split GGUF parts are missing: {}", primary.display(), missing.join(", "))]
    MissingGgufParts { primary: PathBuf, missing: Vec<String> },
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    #[error("{} is a Piper voice without its config {}", path.display(), config.display())]
    MissingVoiceConfig { path: PathBuf, config: PathBuf },
    #[error("{} is neither a whisper.cpp (ggml) model nor a Piper voice (.onnx)", path.display())]
    NotSpeechModel { path: PathBuf },
    #[error("{}: several speech models ({}); keep one per directory", dir.display(), files.join(", "))]
    AmbiguousSpeechModel { dir: PathBuf, files: Vec<String> },
    #[error("{} is not a plain *.gguf file name", path.display())]
    NotGgufFileName { path: PathBuf },
    #[error("model '{name}' clashes with {}: a store directory holds either a model or an organisation's models", other.display())]
    NamespaceClash { name: String, other: PathBuf },
    #[error("{} already exists in the store", path.display())]
    AlreadyExists { path: PathBuf },
    #[error("{} has quantization {}, but the name asks for '{requested}'", path.display(), actual.as_deref().unwrap_or("(unknown)"))]
    QuantizationMismatch { path: PathBuf, requested: String, actual: Option<String> },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn display_paths(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }

    pub(crate) fn gguf(path: impl Into<PathBuf>) -> impl FnOnce(GgufError) -> Self {
        let path = path.into();
        move |source| Self::Gguf { path, source }
    }
}
