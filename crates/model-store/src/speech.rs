//! Speech models: Whisper in whisper.cpp's ggml format (one `.bin` file) and Piper/VITS voices
//! for ONNX Runtime (`voice.onnx` with its `voice.onnx.json`).

use crate::descriptor::{runtime_for, Capability, Format, ModelDescriptor};
use crate::error::StoreError;
use crate::layout::{has_extension, DirListing};
use std::io::Read;
use std::path::{Path, PathBuf};

/// whisper.cpp's model files begin with "ggml" as a little-endian u32.
const GGML_MAGIC: [u8; 4] = 0x6767_6d6cu32.to_le_bytes();

/// A file that begins like a whisper.cpp model (the name may be anything: `ggml-tiny.en.bin`).
pub fn is_ggml_file(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && magic == GGML_MAGIC
}

/// The voice config beside a Piper voice: `voice.onnx.json`.
fn voice_config(onnx: &Path) -> PathBuf {
    let mut name = onnx.file_name().unwrap_or_default().to_os_string();
    name.push(".json");
    onnx.with_file_name(name)
}

impl DirListing {
    /// `.bin` files that are whisper.cpp models.
    pub fn ggml_models(&self) -> Vec<PathBuf> {
        self.files
            .iter()
            .filter(|f| has_extension(f, ".bin"))
            .map(|f| self.dir.join(f))
            .filter(|p| is_ggml_file(p))
            .collect()
    }

    /// `.onnx` files with their `.onnx.json` beside them: Piper voices.
    pub fn piper_voices(&self) -> Vec<PathBuf> {
        self.files
            .iter()
            .filter(|f| has_extension(f, ".onnx") && self.files.contains(&format!("{f}.json")))
            .map(|f| self.dir.join(f))
            .collect()
    }

    pub fn has_speech_model(&self) -> bool {
        !self.piper_voices().is_empty() || !self.ggml_models().is_empty()
    }

    /// The one speech model of a directory, described under `name`: a directory with several
    /// is ambiguous, as spec 003 decides for safetensors.
    pub(crate) fn speech_model(&self, name: String) -> Result<ModelDescriptor, StoreError> {
        let mut found = self.ggml_models();
        found.extend(self.piper_voices());
        match found.as_slice() {
            [one] => ModelDescriptor::from_speech_file(name, one),
            [] => Err(StoreError::NoModelFiles { dir: self.dir.clone() }),
            many => Err(StoreError::AmbiguousSpeechModel {
                dir: self.dir.clone(),
                files: many.iter().map(|p| p.file_name().unwrap_or_default().to_string_lossy().into()).collect(),
            }),
        }
    }
}

impl ModelDescriptor {
    /// Describes a whisper.cpp model file or a Piper voice (`.onnx`, its `.onnx.json` beside it).
    pub fn from_speech_file(name: String, path: &Path) -> Result<Self, StoreError> {
        let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let (format, architecture, capability, files) = if has_extension(file_name, ".onnx") {
            let config = voice_config(path);
            if !config.is_file() {
                return Err(StoreError::MissingVoiceConfig { path: path.to_path_buf(), config });
            }
            (Format::Onnx, "piper", Capability::Tts, vec![path.to_path_buf(), config])
        } else if is_ggml_file(path) {
            (Format::Ggml, "whisper", Capability::Asr, vec![path.to_path_buf()])
        } else {
            return Err(StoreError::NotSpeechModel { path: path.to_path_buf() });
        };
        let mut size_bytes = 0;
        for f in &files {
            size_bytes += std::fs::metadata(f).map_err(StoreError::io(f))?.len();
        }
        Ok(Self {
            name,
            format,
            model_dir: path.parent().map(Path::to_path_buf).unwrap_or_default(),
            primary_file: path.to_path_buf(),
            architecture: architecture.to_string(),
            runtime: runtime_for(format, architecture).to_string(),
            quantization: None,
            context_length: None,
            mmproj: None,
            capabilities: vec![capability],
            size_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whisper_file_and_a_voice_are_described_by_their_contents() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("ggml-tiny.en.bin");
        std::fs::write(&bin, [&GGML_MAGIC[..], &[0u8; 60]].concat()).unwrap();
        let d = ModelDescriptor::from_speech_file("whisper-1".into(), &bin).unwrap();
        assert_eq!((d.format, d.architecture.as_str(), d.runtime.as_str()), (Format::Ggml, "whisper", "WhisperCpp"));
        assert_eq!((d.capabilities.as_slice(), d.size_bytes), (&[Capability::Asr][..], 64));

        let other = dir.path().join("weights.bin");
        std::fs::write(&other, b"GGUF and more").unwrap();
        assert!(matches!(
            ModelDescriptor::from_speech_file("x".into(), &other),
            Err(StoreError::NotSpeechModel { .. })
        ));

        let onnx = dir.path().join("en_US-joe-medium.onnx");
        std::fs::write(&onnx, b"onnx").unwrap();
        assert!(matches!(
            ModelDescriptor::from_speech_file("joe".into(), &onnx),
            Err(StoreError::MissingVoiceConfig { .. })
        ));
        std::fs::write(dir.path().join("en_US-joe-medium.onnx.json"), b"{}").unwrap();
        let d = ModelDescriptor::from_speech_file("joe".into(), &onnx).unwrap();
        assert_eq!((d.format, d.architecture.as_str(), d.runtime.as_str()), (Format::Onnx, "piper", "OnnxRuntime"));
        assert_eq!((d.capabilities.as_slice(), d.size_bytes), (&[Capability::Tts][..], 6));

        let listing = crate::layout::read_dir(dir.path()).unwrap();
        assert_eq!(listing.ggml_models(), vec![bin]);
        assert_eq!(listing.piper_voices(), vec![onnx]);
        assert!(matches!(listing.speech_model("m".into()), Err(StoreError::AmbiguousSpeechModel { .. })));
    }
}
