//! Which files of a listing make a speech model (pure, no I/O): a whisper.cpp model
//! (`ggml-*.bin`, as whisper.cpp's own repository names them) or a Piper voice (`voice.onnx` with
//! its `voice.onnx.json`).

use super::rules::{Plan, Wanted};
use super::RegisterError;
use llmr_cluster::ModelFormat;
use llmr_hub::base_name;

fn is_whisper_file(path: &str) -> bool {
    let name = base_name(path).to_ascii_lowercase();
    name.starts_with("ggml-") && name.ends_with(".bin")
}

pub(super) fn whisper_models(files: &[String]) -> Vec<&str> {
    files.iter().map(String::as_str).filter(|f| is_whisper_file(f)).collect()
}

/// `.onnx` files with their config beside them.
pub(super) fn piper_voices(files: &[String]) -> Vec<&str> {
    files
        .iter()
        .map(String::as_str)
        .filter(|f| f.to_ascii_lowercase().ends_with(".onnx") && files.iter().any(|c| *c == format!("{f}.json")))
        .collect()
}

/// The speech format a listing holds, when it holds exactly one kind.
pub(super) fn speech_format(files: &[String]) -> Option<ModelFormat> {
    match (whisper_models(files).is_empty(), piper_voices(files).is_empty()) {
        (false, true) => Some(ModelFormat::Ggml),
        (true, false) => Some(ModelFormat::Onnx),
        _ => None,
    }
}

/// The architecture a speech format's models have (what plugins declare).
pub(super) fn architecture(format: ModelFormat) -> Option<&'static str> {
    match format {
        ModelFormat::Ggml => Some("whisper"),
        ModelFormat::Onnx => Some("piper"),
        _ => None,
    }
}

/// The model's file (the one `file` names, else the only candidate) and what it needs beside it.
pub(super) fn plan(format: ModelFormat, files: &[String], wanted: &Wanted) -> Result<Plan, RegisterError> {
    if wanted.quantization.is_some() {
        return Err(RegisterError::invalid("quantization", "applies to GGUF models only"));
    }
    let (candidates, what) = match format {
        ModelFormat::Ggml => (whisper_models(files), "whisper.cpp model (ggml-*.bin)"),
        _ => (piper_voices(files), "Piper voice (.onnx with its .onnx.json)"),
    };
    let primary = match (wanted.file, candidates.as_slice()) {
        (Some(file), _) if candidates.contains(&file) => file.to_string(),
        (Some(file), _) => return Err(RegisterError::invalid("file", format!("'{file}' is not a {what}"))),
        (None, [one]) => one.to_string(),
        (None, []) => return Err(RegisterError::invalid(wanted.param, format!("no {what} here"))),
        (None, several) => {
            return Err(RegisterError::invalid(
                "file",
                format!("several of them: {}; set `file` to one", several.join(", ")),
            ))
        }
    };
    let mut files = vec![primary.clone()];
    if format == ModelFormat::Onnx {
        files.push(format!("{primary}.json"));
    }
    Ok(Plan { format, primary, files })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn wanted(file: Option<&'static str>) -> Wanted<'static> {
        Wanted { format: None, file, quantization: None, param: "repo" }
    }

    #[test]
    fn whisper_models_and_voices_are_found_by_their_names() {
        let files = listing(&["README.md", "ggml-tiny.en.bin", "ggml-base.bin", "pytorch_model.bin"]);
        assert_eq!(speech_format(&files), Some(ModelFormat::Ggml));
        let e = plan(ModelFormat::Ggml, &files, &wanted(None)).unwrap_err();
        assert_eq!(e.param(), Some("file"));
        let p = plan(ModelFormat::Ggml, &files, &wanted(Some("ggml-tiny.en.bin"))).unwrap();
        assert_eq!((p.primary.as_str(), p.files.len()), ("ggml-tiny.en.bin", 1));
        assert_eq!(
            plan(ModelFormat::Ggml, &files, &wanted(Some("pytorch_model.bin"))).unwrap_err().param(),
            Some("file")
        );

        let voices = listing(&["en/joe/en_US-joe-medium.onnx", "en/joe/en_US-joe-medium.onnx.json", "x/lonely.onnx"]);
        assert_eq!(speech_format(&voices), Some(ModelFormat::Onnx));
        let p = plan(ModelFormat::Onnx, &voices, &wanted(None)).unwrap();
        assert_eq!(p.files, ["en/joe/en_US-joe-medium.onnx", "en/joe/en_US-joe-medium.onnx.json"]);
        assert_eq!(speech_format(&listing(&["model.safetensors", "pytorch_model.bin"])), None);
        let q = Wanted { quantization: Some("Q4_0"), ..wanted(None) };
        assert_eq!(plan(ModelFormat::Onnx, &voices, &q).unwrap_err().param(), Some("quantization"));
    }
}
