//! `ModelDescriptor`: what the node needs to pick an engine and load a model.

use crate::error::StoreError;
use crate::gguf::{GgufHeader, PoolingType};
use crate::layout::{self, DirListing, GgufFiles};
use crate::safetensors::SafetensorsModel;
pub use llmr_engine_types::{Capability, Format};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq)]
pub struct ModelDescriptor {
    /// The name that resolves to this model (`smollm2`, or `smollm2:Q4_1` when the directory
    /// holds several quantizations).
    pub name: String,
    pub format: Format,
    pub model_dir: PathBuf,
    /// The `.gguf` (first part, when split), the `.safetensors.index.json`, or the single
    /// `.safetensors`.
    pub primary_file: PathBuf,
    /// `general.architecture`, or `config.json` `model_type` (else `architectures[0]`).
    pub architecture: String,
    /// GGUF only: from `general.file_type`, e.g. `Q4_K_M`.
    pub quantization: Option<String>,
    pub context_length: Option<u64>,
    pub mmproj: Option<PathBuf>,
    /// RuntimeType name of spec 000 (`LlamaCpp`, ...).
    pub runtime: String,
    pub capabilities: Vec<Capability>,
    /// Bytes on disk of every file the engine loads: all weight files and the projector.
    pub size_bytes: u64,
}

/// llama.cpp architectures that are bidirectional encoders: with a pooling type they produce
/// embeddings, not text.
const ENCODER_ARCHITECTURES: &[&str] = &[
    "bert",
    "modern-bert",
    "nomic-bert",
    "nomic-bert-moe",
    "neo-bert",
    "jina-bert-v2",
    "jina-bert-v3",
    "eurobert",
    "t5encoder",
    "gemma-embedding",
];

/// The RuntimeType of spec 000: GGUF goes to llama.cpp, safetensors to per-model engines.
/// (Known before any file is read, from a manifest's format and architecture.)
pub fn runtime_for(format: Format, architecture: &str) -> &'static str {
    let arch = architecture.to_ascii_lowercase();
    match format {
        Format::Gguf => "LlamaCpp",
        Format::Onnx => "OnnxRuntime",
        Format::Ggml => "WhisperCpp",
        Format::Safetensors if arch.starts_with("gpt_oss") || arch.starts_with("gpt-oss") => "GptOssCpp",
        Format::Safetensors if arch.starts_with("nemotron") => "NemotronCpp",
        // Spec 000 names no general safetensors runtime; DESIGN.md plans an `engines/native` one.
        Format::Safetensors => "Native",
    }
}

fn is_embedding_model(header: &GgufHeader) -> bool {
    let non_causal = header.causal_attention() == Some(false);
    let pooled = header.pooling_type().is_some_and(|p| p != PoolingType::None);
    let encoder = header.architecture().is_some_and(|a| ENCODER_ARCHITECTURES.contains(&a));
    non_causal || (pooled && encoder)
}

fn file_size(path: &Path) -> Result<u64, StoreError> {
    Ok(std::fs::metadata(path).map_err(StoreError::io(path))?.len())
}

impl ModelDescriptor {
    /// Describes a single GGUF file given directly (not from the store): named after the file's
    /// stem, with no projector (a file's directory is not a model directory, so its other
    /// files are not assumed to belong to it).
    pub fn from_gguf_file(path: &Path) -> Result<Self, StoreError> {
        let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if layout::is_mmproj(file_name) {
            return Err(StoreError::Projector { path: path.to_path_buf() });
        }
        let header = GgufHeader::open(path).map_err(StoreError::gguf(path))?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let files = layout::parts_beside(&dir, file_name, |name| dir.join(name).is_file());
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or(file_name).to_string();
        Self::from_gguf(name, &files, &header, None)
    }

    /// Describes a model given by path, outside the store: a GGUF file ([`Self::from_gguf_file`])
    /// or a Hugging Face model folder (safetensors, `config.json`, `tokenizer.json`), named after
    /// the folder.
    pub fn from_path(path: &Path) -> Result<Self, StoreError> {
        let stem = |p: &Path| p.file_stem().and_then(|s| s.to_str()).unwrap_or("model").to_string();
        if !path.is_dir() {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if layout::has_extension(name, ".onnx") || crate::speech::is_ggml_file(path) {
                return Self::from_speech_file(stem(path), path);
            }
            return Self::from_gguf_file(path);
        }
        let listing = layout::read_dir(path).map_err(StoreError::io(path))?;
        if !listing.has_safetensors() && listing.has_speech_model() {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("model").to_string();
            return listing.speech_model(name);
        }
        if !listing.has_safetensors() {
            return Err(StoreError::NoModelFiles { dir: path.to_path_buf() });
        }
        let model = crate::safetensors::inspect(&listing)?;
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("model").to_string();
        Self::from_safetensors(name, path, model)
    }

    /// Describes a model from a list of its files (a router's manifest): `primary` and `files`
    /// are `/`-separated paths relative to `dir`, which the caller has checked stay inside it.
    /// Only the listed files count, so a shared folder holding other models changes nothing.
    /// GGUF: the split parts and the projector among the files beside `primary`; safetensors:
    /// spec 003's rules over the files beside it.
    pub fn from_files(name: String, dir: &Path, primary: &str, files: &[&str]) -> Result<Self, StoreError> {
        let (sub, primary_name) = primary.rsplit_once('/').unwrap_or(("", primary));
        let model_dir = if sub.is_empty() { dir.to_path_buf() } else { dir.join(sub) };
        let mut beside: Vec<String> = files
            .iter()
            .filter_map(|f| match f.rsplit_once('/') {
                Some((parent, file)) if parent == sub => Some(file),
                None if sub.is_empty() => Some(*f),
                _ => None,
            })
            .map(str::to_string)
            .collect();
        beside.sort();
        beside.dedup();
        let listing = DirListing { dir: model_dir.clone(), files: beside, subdirs: vec![] };
        if layout::is_gguf(primary_name) {
            let path = model_dir.join(primary_name);
            if layout::is_mmproj(primary_name) {
                return Err(StoreError::Projector { path });
            }
            let header = GgufHeader::open(&path).map_err(StoreError::gguf(&path))?;
            let parts = layout::parts_beside(&model_dir, primary_name, |n| listing.files.iter().any(|f| f == n));
            return Self::from_gguf(name, &parts, &header, listing.mmproj());
        }
        if listing.has_safetensors() {
            let model = crate::safetensors::inspect(&listing)?;
            return Self::from_safetensors(name, &model_dir, model);
        }
        // A speech model: the primary itself (a Piper voice's config must be among the files).
        let primary_path = model_dir.join(primary_name);
        if layout::has_extension(primary_name, ".onnx") && !listing.files.contains(&format!("{primary_name}.json")) {
            let config = model_dir.join(format!("{primary_name}.json"));
            return Err(StoreError::MissingVoiceConfig { path: primary_path, config });
        }
        if listing.has_speech_model() {
            return Self::from_speech_file(name, &primary_path);
        }
        Err(StoreError::NoModelFiles { dir: model_dir })
    }

    pub(crate) fn from_gguf(
        name: String,
        files: &GgufFiles,
        header: &GgufHeader,
        mmproj: Option<PathBuf>,
    ) -> Result<Self, StoreError> {
        let primary = &files.primary;
        if !files.missing_parts.is_empty() {
            return Err(StoreError::MissingGgufParts {
                primary: primary.clone(),
                missing: files.missing_parts.clone(),
            });
        }
        let architecture =
            header.architecture().ok_or_else(|| StoreError::MissingArchitecture { path: primary.clone() })?.to_string();
        let mut capabilities = vec![if is_embedding_model(header) { Capability::Embedding } else { Capability::Text }];
        if mmproj.is_some() {
            capabilities.push(Capability::Vision);
        }
        let mut size_bytes = 0;
        for path in files.all().chain(&mmproj) {
            size_bytes += file_size(path)?;
        }
        Ok(Self {
            name,
            format: Format::Gguf,
            model_dir: primary.parent().map(Path::to_path_buf).unwrap_or_default(),
            primary_file: primary.clone(),
            runtime: runtime_for(Format::Gguf, &architecture).to_string(),
            architecture,
            quantization: header.quantization().map(str::to_string),
            context_length: header.context_length(),
            mmproj,
            capabilities,
            size_bytes,
        })
    }

    pub(crate) fn from_safetensors(name: String, dir: &Path, model: SafetensorsModel) -> Result<Self, StoreError> {
        let mut capabilities = vec![Capability::Text];
        if model.vision {
            capabilities.push(Capability::Vision);
        }
        let mut size_bytes = 0;
        for path in &model.weights {
            size_bytes += file_size(path)?;
        }
        Ok(Self {
            name,
            format: Format::Safetensors,
            model_dir: dir.to_path_buf(),
            primary_file: model.primary,
            runtime: runtime_for(Format::Safetensors, &model.architecture).to_string(),
            architecture: model.architecture,
            quantization: None,
            context_length: model.context_length,
            mmproj: None,
            capabilities,
            size_bytes,
        })
    }

    pub fn has(&self, capability: Capability) -> bool {
        self.capabilities.contains(&capability)
    }

    /// `capabilities` as the wire names them (`/v1/models`, heartbeats).
    pub fn capability_names(&self) -> Vec<String> {
        self.capabilities.iter().map(|c| c.as_str().to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_follow_the_spec_table() {
        assert_eq!(runtime_for(Format::Gguf, "llama"), "LlamaCpp");
        assert_eq!(runtime_for(Format::Safetensors, "gpt_oss"), "GptOssCpp");
        assert_eq!(runtime_for(Format::Safetensors, "nemotron_h"), "NemotronCpp");
        assert_eq!(runtime_for(Format::Safetensors, "llama"), "Native");
        assert_eq!(runtime_for(Format::Onnx, "vits"), "OnnxRuntime");
    }
}
