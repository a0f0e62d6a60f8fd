//! Which file of a repository to pull: parsing `owner/repo[:QUANT]` and `owner/repo/path`,
//! choosing among the listed GGUF files, and refusing names that could leave a directory.

use super::{FileChoice, PullError, PullSpec, PREFERRED_QUANTIZATIONS};
use crate::layout;
use crate::name::{ModelName, ModelRef};

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

pub(super) fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Refuses repository paths that could leave a directory: absolute, `..`, backslashes, NULs,
/// empty segments. Only the last segment is ever used locally, but a hub that sends such a name
/// is not to be trusted with the rest either.
fn check_remote_path(repo: &str, path: &str) -> Result<(), PullError> {
    let unsafe_path = path.is_empty()
        || path.starts_with('/')
        || path.contains("..")
        || path.contains(['\\', '\0'])
        || path.split('/').any(|seg| seg.is_empty() || seg == ".");
    if unsafe_path {
        return Err(PullError::UnsafePath { repo: repo.to_string(), file: path.to_string() });
    }
    Ok(())
}

/// A file the store can import: a visible, single-file, non-projector `.gguf`.
fn check_model_file(path: &str) -> Result<(), PullError> {
    let name = base_name(path);
    if !layout::is_gguf(name) || name.starts_with('.') || layout::is_mmproj(name) || layout::split_part(name).is_some()
    {
        return Err(PullError::NotGguf { file: path.to_string() });
    }
    Ok(())
}

/// The files a repository offers as models: `.gguf` files that are not projectors. The first
/// part of a split model is listed (so that asking for it explains that splits are not pulled).
fn candidates(siblings: &[String]) -> Vec<&str> {
    siblings
        .iter()
        .map(String::as_str)
        .filter(|f| layout::is_gguf(f) && !layout::is_mmproj(f))
        .filter(|f| layout::split_part(base_name(f)).is_none_or(|(_, part, _)| part == 1))
        .collect()
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

/// Chooses a GGUF model file among a repository's paths: the one whose file name carries
/// `quantization` (exact, case-sensitive, a whole word); without a tag Q4_K_M, then Q8_0, else the
/// only one. Projectors are never chosen; a split model is offered as its first part (the caller
/// decides whether it can use splits). Paths are not checked here.
pub fn choose_gguf(siblings: &[String], quantization: Option<&str>) -> Result<String, GgufChoiceError> {
    let found = candidates(siblings);
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
                return Err(PullError::FileNotFound {
                    repo: repo_s,
                    file: path.clone(),
                    endpoint: endpoint.to_string(),
                });
            }
            check_remote_path(repo.as_str(), path)?;
            check_model_file(path)?;
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
            assert!(matches!(PullSpec::parse(escape), Err(PullError::UnsafePath { .. })), "{escape}");
        }
        assert!(matches!(PullSpec::parse("../m:Q4_0"), Err(PullError::Name(_))));
    }

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
            assert!(matches!(err, PullError::UnsafePath { .. }), "{bad}: {err}");
        }
    }
}
