//! Which GGUF file of a listing (a hub repository's, or a directory's) is the model: the rules
//! `llmr pull` and the router's registrations share. Pure: names only, no I/O.

use llmr_model_store::{is_gguf, is_mmproj, split_part};

/// Tried in this order when no quantization is asked for.
pub const PREFERRED_QUANTIZATIONS: &[&str] = &["Q4_K_M", "Q8_0"];

/// The last segment of a `/`-separated path.
pub fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A GGUF model file: a `.gguf` that is not a projector, and of a split model only the first
/// part (the model's other parts come with it).
pub fn is_gguf_model(path: &str) -> bool {
    is_gguf(path) && !is_mmproj(path) && split_part(base_name(path)).is_none_or(|(_, part, _)| part == 1)
}

/// The GGUF model files of a listing, in its order.
pub fn gguf_models(paths: &[String]) -> Vec<&str> {
    paths.iter().map(String::as_str).filter(|p| is_gguf_model(p)).collect()
}

/// Whether a file name carries `tag` as a whole word: not preceded by a letter or digit (so
/// `Q4_XS` is not found in `IQ4_XS`), not followed by a letter, digit or `_` (so `Q4_K` is not
/// found in `Q4_K_M`). Case-sensitive, as spec 003 matches quantization names.
fn has_tag(file: &str, tag: &str) -> bool {
    let name = base_name(file);
    name.match_indices(tag).any(|(i, _)| {
        let before = name[..i].chars().next_back();
        let after = name[i + tag.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric())
            && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Why [`choose_gguf`] found no file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GgufChoiceError {
    /// The listing has no GGUF model file.
    NoGguf,
    /// No GGUF file carries the requested tag; `available` are the model files there are.
    NoMatchingFile { requested: String, available: Vec<String> },
    /// Several files carry the tag (`requested`), or there is no tag, no preferred one and
    /// several files.
    Ambiguous { requested: Option<String>, candidates: Vec<String> },
}

/// Chooses a GGUF model file among a listing's paths: the one whose file name carries
/// `quantization` (exact, case-sensitive, a whole word); without a tag Q4_K_M, then Q8_0, else the
/// only one. Projectors are never chosen; a split model is offered as its first part (the caller
/// decides whether it can use splits). Paths are not checked here.
pub fn choose_gguf(paths: &[String], quantization: Option<&str>) -> Result<String, GgufChoiceError> {
    let found = gguf_models(paths);
    let tagged = |tag: &str| found.iter().filter(|f| has_tag(f, tag)).map(|f| f.to_string()).collect::<Vec<_>>();
    if let Some(tag) = quantization {
        return match tagged(tag).as_slice() {
            [one] => Ok(one.clone()),
            [] => {
                let available = found.iter().map(|f| f.to_string()).collect();
                Err(GgufChoiceError::NoMatchingFile { requested: tag.to_string(), available })
            }
            several => {
                Err(GgufChoiceError::Ambiguous { requested: Some(tag.to_string()), candidates: several.to_vec() })
            }
        };
    }
    for tag in PREFERRED_QUANTIZATIONS {
        match tagged(tag).as_slice() {
            [] => continue,
            [one] => return Ok(one.clone()),
            several => {
                let (requested, candidates) = (Some(tag.to_string()), several.to_vec());
                return Err(GgufChoiceError::Ambiguous { requested, candidates });
            }
        }
    }
    match found.as_slice() {
        [only] => Ok(only.to_string()),
        [] => Err(GgufChoiceError::NoGguf),
        several => {
            let candidates = several.iter().map(|f| f.to_string()).collect();
            Err(GgufChoiceError::Ambiguous { requested: None, candidates })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_match_whole_words_case_sensitively() {
        assert!(has_tag("m-Q4_K_M.gguf", "Q4_K_M"));
        assert!(has_tag("m.Q8_0.gguf", "Q8_0"));
        assert!(has_tag("m_Q8_0-00001-of-00002.gguf", "Q8_0"));
        assert!(!has_tag("m-Q4_K_M.gguf", "Q4_K"));
        assert!(!has_tag("m-IQ4_XS.gguf", "Q4_XS"));
        assert!(!has_tag("m-q4_k_m.gguf", "Q4_K_M"));
        assert!(!has_tag("Q8_0/m-f16.gguf", "Q8_0"), "only the file name counts");
    }

    #[test]
    fn model_files_are_ggufs_without_projectors_and_later_split_parts() {
        let paths: Vec<String> =
            ["README.md", "a/m-Q4_0.gguf", "mmproj-m-f16.gguf", "s-00001-of-00002.gguf", "s-00002-of-00002.gguf"]
                .map(String::from)
                .into();
        assert_eq!(gguf_models(&paths), ["a/m-Q4_0.gguf", "s-00001-of-00002.gguf"]);
        assert!(!is_gguf_model("d/x-00002-of-00002.gguf") && is_gguf_model("d/x-00001-of-00002.gguf"));
    }
}
