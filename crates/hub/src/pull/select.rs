//! Which file of a repository to pull: parsing `owner/repo[:QUANT]` and `owner/repo/path`,
//! choosing among the listed GGUF files (the shared rules of [`crate::choice`]), and refusing
//! names that could leave a directory or that the store cannot import.

use super::{FileChoice, PullError, PullSpec};
use crate::choice::{base_name, choose_gguf, GgufChoiceError};
use crate::error::HubError;
use llmr_cluster::check_relative_path;
use llmr_model_store::{is_gguf, is_mmproj, split_part, ModelName, ModelRef};

impl PullSpec {
    pub fn parse(spec: &str) -> Result<Self, PullError> {
        let not_owner_repo = || PullError::NotOwnerRepo { spec: spec.to_string() };
        let segments: Vec<&str> = spec.split('/').collect();
        if segments.len() > 2 {
            let repo = ModelName::parse(&segments[..2].join("/"))?;
            let path = segments[2..].join("/");
            check_remote_path(repo.as_str(), &path)?;
            check_model_file(&path)?;
            return Ok(Self { repo, file: FileChoice::Path(path) });
        }
        let model_ref = ModelRef::parse(spec)?;
        if segments.len() != 2 {
            return Err(not_owner_repo());
        }
        let file = match model_ref.quantization {
            Some(tag) => FileChoice::Quantization(tag),
            None => FileChoice::Preferred,
        };
        Ok(Self { repo: model_ref.name, file })
    }
}

/// Refuses repository paths that could leave a directory (`check_relative_path`). Only the
/// last segment is ever used locally, but a name that could escape is not to be trusted at all.
fn check_remote_path(repo: &str, path: &str) -> Result<(), PullError> {
    check_relative_path(path).map_err(|problem| {
        PullError::Hub(HubError::UnsafePath { repo: repo.to_string(), file: path.to_string(), problem })
    })
}

/// A file the store can import: a visible, single-file, non-projector `.gguf`, or a speech
/// model (a whisper.cpp `ggml-*.bin`, a Piper `.onnx` voice).
fn check_model_file(path: &str) -> Result<(), PullError> {
    let name = base_name(path);
    if name.starts_with('.') {
        return Err(PullError::NotGguf { file: path.to_string() });
    }
    if speech_file(path) {
        return Ok(());
    }
    if !is_gguf(name) || is_mmproj(name) || split_part(name).is_some() {
        return Err(PullError::NotGguf { file: path.to_string() });
    }
    Ok(())
}

/// A whisper.cpp model (named `ggml-*.bin`, as whisper.cpp's repository names them) or a Piper
/// voice (`.onnx`).
pub(super) fn speech_file(path: &str) -> bool {
    let name = base_name(path).to_ascii_lowercase();
    (name.starts_with("ggml-") && name.ends_with(".bin")) || name.ends_with(".onnx")
}

/// The files a model file needs beside it: a Piper voice's config.
pub(super) fn companions(path: &str) -> Vec<String> {
    if base_name(path).to_ascii_lowercase().ends_with(".onnx") {
        vec![format!("{path}.json")]
    } else {
        Vec::new()
    }
}

/// Chooses the file to pull from a repository's listing.
pub(super) fn select_file(
    repo: &ModelName,
    siblings: &[String],
    choice: &FileChoice,
    endpoint: &str,
) -> Result<String, PullError> {
    let repo_s = repo.to_string();
    let tag = match choice {
        FileChoice::Path(path) => {
            if !siblings.contains(path) {
                let endpoint = endpoint.to_string();
                return Err(HubError::FileNotFound { repo: repo_s, file: path.clone(), endpoint }.into());
            }
            check_remote_path(repo.as_str(), path)?;
            check_model_file(path)?;
            if let Some(missing) = companions(path).into_iter().find(|c| !siblings.contains(c)) {
                let endpoint = endpoint.to_string();
                return Err(HubError::FileNotFound { repo: repo_s, file: missing, endpoint }.into());
            }
            return Ok(path.clone());
        }
        FileChoice::Quantization(tag) => Some(tag.as_str()),
        FileChoice::Preferred => None,
    };
    let chosen = choose_gguf(siblings, tag).map_err(|error| match error {
        GgufChoiceError::NoGguf => PullError::NoGguf { repo: repo_s.clone() },
        GgufChoiceError::NoMatchingFile { requested, available } => {
            PullError::NoMatchingFile { repo: repo_s.clone(), requested, available }
        }
        GgufChoiceError::Ambiguous { requested, candidates } => {
            PullError::Ambiguous { repo: repo_s.clone(), requested, candidates }
        }
    })?;
    check_remote_path(repo.as_str(), &chosen)?;
    check_model_file(&chosen)?;
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> ModelName {
        ModelName::parse("org/m").unwrap()
    }

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn pick(names: &[&str], choice: FileChoice) -> Result<String, PullError> {
        select_file(&repo(), &files(names), &choice, "http://hub")
    }

    #[test]
    fn specs_parse_into_repo_and_choice() {
        let spec = PullSpec::parse("org/m:Q4_K_M").unwrap();
        assert_eq!((spec.repo.as_str(), spec.file), ("org/m", FileChoice::Quantization("Q4_K_M".into())));
        assert_eq!(PullSpec::parse("org/m").unwrap().file, FileChoice::Preferred);
        let spec = PullSpec::parse("org/m/sub/x-Q8_0.gguf").unwrap();
        assert_eq!(spec.file, FileChoice::Path("sub/x-Q8_0.gguf".into()));
        assert!(matches!(PullSpec::parse("m"), Err(PullError::NotOwnerRepo { .. })));
        assert!(matches!(PullSpec::parse("org/m/README.md"), Err(PullError::NotGguf { .. })));
        assert!(matches!(PullSpec::parse("org/m/x-00002-of-00003.gguf"), Err(PullError::NotGguf { .. })));
        for escape in ["org/m/../../x.gguf", "org/m//etc/x.gguf", "org/m/a\\b.gguf", "org/m/./x.gguf"] {
            assert!(matches!(PullSpec::parse(escape), Err(PullError::Hub(HubError::UnsafePath { .. }))), "{escape}");
        }
        assert!(matches!(PullSpec::parse("../m:Q4_0"), Err(PullError::Name(_))));
    }

    #[test]
    fn without_a_tag_q4_k_m_then_q8_0_then_the_only_file() {
        let all = ["README.md", "m-Q8_0.gguf", "m-Q4_K_M.gguf", "mmproj-m-f16.gguf", "m-F16.gguf"];
        assert_eq!(pick(&all, FileChoice::Preferred).unwrap(), "m-Q4_K_M.gguf");
        assert_eq!(pick(&all[..3], FileChoice::Preferred).unwrap(), "m-Q4_K_M.gguf");
        assert_eq!(pick(&["m-Q8_0.gguf", "m-F16.gguf"], FileChoice::Preferred).unwrap(), "m-Q8_0.gguf");
        assert_eq!(pick(&["m-F16.gguf", "mmproj.gguf"], FileChoice::Preferred).unwrap(), "m-F16.gguf");
        match pick(&["m-F16.gguf", "m-Q5_0.gguf"], FileChoice::Preferred) {
            Err(e @ PullError::Ambiguous { .. }) => assert_eq!(
                e.to_string(),
                "model 'org/m' has several GGUF files: m-F16.gguf, m-Q5_0.gguf; ask for one as 'org/m:QUANT' or 'org/m/FILE'"
            ),
            other => panic!("{other:?}"),
        }
        assert!(matches!(pick(&["README.md"], FileChoice::Preferred), Err(PullError::NoGguf { .. })));
    }

    #[test]
    fn tagged_choices_and_their_errors() {
        let all = ["a/m-Q4_0.gguf", "b/m-Q4_0.gguf", "m-Q5_0.gguf"];
        assert_eq!(pick(&all, FileChoice::Quantization("Q5_0".into())).unwrap(), "m-Q5_0.gguf");
        let err = pick(&all, FileChoice::Quantization("Q4_0".into())).unwrap_err();
        assert!(err.to_string().contains("several GGUF files tagged 'Q4_0': a/m-Q4_0.gguf, b/m-Q4_0.gguf"), "{err}");
        let err = pick(&all, FileChoice::Quantization("q5_0".into())).unwrap_err();
        assert!(matches!(err, PullError::NoMatchingFile { .. }), "{err}");
        let err = pick(&all, FileChoice::Path("m-Q6_K.gguf".into())).unwrap_err();
        assert_eq!(err.to_string(), "file 'm-Q6_K.gguf' of model 'org/m' not found at http://hub");
        let err = pick(&["x-00001-of-00002.gguf", "x-00002-of-00002.gguf"], FileChoice::Preferred).unwrap_err();
        assert!(matches!(err, PullError::NotGguf { .. }), "split models are refused: {err}");
    }

    #[test]
    fn listed_names_that_escape_are_refused() {
        for bad in ["../../x-Q4_0.gguf", "/etc/x-Q4_0.gguf", "a/../x-Q4_0.gguf"] {
            let err = pick(&[bad], FileChoice::Quantization("Q4_0".into())).unwrap_err();
            assert!(matches!(err, PullError::Hub(HubError::UnsafePath { .. })), "{bad}: {err}");
        }
    }
}
