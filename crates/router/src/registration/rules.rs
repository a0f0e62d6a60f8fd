//! Which files of a listing make the model (pure, no I/O): the format, the GGUF file by
//! `file`/`quantization` (the rules `llmr pull` shares, `llmr_hub::choose_gguf`), and spec 003's
//! safetensors rules.

use super::{speech_rules, RegisterError};
use llmr_cluster::ModelFormat;
use llmr_hub::{base_name, choose_gguf, gguf_models, is_gguf_model, GgufChoiceError, PREFERRED_QUANTIZATIONS};
use llmr_model_store::{split_part, split_part_name};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

pub(super) const CONFIG: &str = "config.json";
pub(super) const TOKENIZER: &str = "tokenizer.json";
pub(super) const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
/// Beside a GGUF, when the repository has them (they can carry a chat template).
const GGUF_OPTIONAL: &[&str] = &[CONFIG, TOKENIZER_CONFIG];
const SAFETENSORS_OPTIONAL: &[&str] = &[TOKENIZER_CONFIG, "generation_config.json", "special_tokens_map.json"];
const INDEX_SUFFIX: &str = ".safetensors.index.json";
const WEIGHTS_SUFFIX: &str = ".safetensors";

/// What the request asks of the listing.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Wanted<'a> {
    pub format: Option<ModelFormat>,
    pub file: Option<&'a str>,
    pub quantization: Option<&'a str>,
    /// The request field naming the listing: `repo` or `path`.
    pub param: &'static str,
}

/// The files of the model, primary included, in manifest order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Plan {
    pub format: ModelFormat,
    pub primary: String,
    pub files: Vec<String>,
}

fn ends_with_ci(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len() && name.get(name.len() - suffix.len()..).is_some_and(|t| t.eq_ignore_ascii_case(suffix))
}

/// Safetensors weights at the top of the listing (the model directory of spec 003).
fn safetensors_weights(files: &[String]) -> Vec<&str> {
    files
        .iter()
        .map(String::as_str)
        .filter(|f| !f.contains('/') && (ends_with_ci(f, WEIGHTS_SUFFIX) || ends_with_ci(f, INDEX_SUFFIX)))
        .collect()
}

/// Decides the format and the files of the model. For safetensors with an index, the shards are
/// added later by [`add_shards`], once the index is read.
pub(super) fn plan(files: &[String], wanted: &Wanted) -> Result<Plan, RegisterError> {
    let (ggufs, safetensors) = (gguf_models(files), safetensors_weights(files));
    if let Some(format @ (ModelFormat::Ggml | ModelFormat::Onnx)) = wanted.format {
        return speech_rules::plan(format, files, wanted);
    }
    // Speech models are chosen only where there is no LLM's weights to mistake them for.
    if let (None, true, true, Some(format)) =
        (wanted.format, ggufs.is_empty(), safetensors.is_empty(), speech_rules::speech_format(files))
    {
        return speech_rules::plan(format, files, wanted);
    }
    let format = match (wanted.format, ggufs.is_empty(), safetensors.is_empty()) {
        (Some(ModelFormat::Gguf), true, _) => {
            return Err(RegisterError::invalid(
                "format",
                format!("'gguf' asked, but the {} has no GGUF model file", noun(wanted.param)),
            ));
        }
        (Some(ModelFormat::Safetensors), _, true) => {
            return Err(RegisterError::invalid(
                "format",
                format!("'safetensors' asked, but the {} has no *.safetensors weights", noun(wanted.param)),
            ));
        }
        (Some(format), _, _) => format,
        (None, false, false) => {
            return Err(RegisterError::invalid(
                "format",
                format!(
                    "the {} has both GGUF ({}) and safetensors ({}) weights: set `format` to \"gguf\" or \"safetensors\"",
                    noun(wanted.param),
                    ggufs.join(", "),
                    safetensors.join(", ")
                ),
            ));
        }
        (None, false, true) => ModelFormat::Gguf,
        (None, true, false) => ModelFormat::Safetensors,
        (None, true, true) => {
            return Err(RegisterError::invalid(
                wanted.param,
                format!(
                    "the {} has no GGUF (*.gguf), safetensors (*.safetensors), whisper.cpp (ggml-*.bin) or Piper (*.onnx) model",
                    noun(wanted.param)
                ),
            ));
        }
    };
    match format {
        ModelFormat::Ggml | ModelFormat::Onnx => speech_rules::plan(format, files, wanted),
        ModelFormat::Gguf => gguf_plan(files, wanted),
        ModelFormat::Safetensors => {
            for (param, given) in [("file", wanted.file.is_some()), ("quantization", wanted.quantization.is_some())] {
                if given {
                    return Err(RegisterError::invalid(param, "applies to GGUF models only"));
                }
            }
            safetensors_plan(files, wanted.param)
        }
    }
}

fn noun(source: &str) -> &'static str {
    if source == "repo" {
        "repository"
    } else {
        "directory"
    }
}

fn gguf_plan(files: &[String], wanted: &Wanted) -> Result<Plan, RegisterError> {
    let primary = match (wanted.file, wanted.quantization) {
        (Some(_), Some(_)) => {
            return Err(RegisterError::invalid("quantization", "give `file` or `quantization`, not both"))
        }
        (Some(file), None) => {
            if !files.iter().any(|f| f == file) {
                return Err(RegisterError::not_found(
                    "file",
                    format!("the {} has no file '{file}'", noun(wanted.param)),
                ));
            }
            if !is_gguf_model(file) {
                return Err(RegisterError::invalid(
                    "file",
                    format!("'{file}' is not a GGUF model file (projectors and later split parts are not)"),
                ));
            }
            file.to_string()
        }
        (None, tag) => choose_gguf(files, tag).map_err(|e| choice_error(e, wanted.param))?,
    };
    let mut plan = Plan { format: ModelFormat::Gguf, primary: primary.clone(), files: vec![primary.clone()] };
    if let Some((prefix, 1, count)) = split_part(base_name(&primary)) {
        let dir = &primary[..primary.len() - base_name(&primary).len()];
        let parts: Vec<String> =
            (2..=count).map(|part| format!("{dir}{}", split_part_name(prefix, part, count))).collect();
        let missing: Vec<&str> = parts.iter().filter(|p| !files.contains(p)).map(String::as_str).collect();
        if !missing.is_empty() {
            return Err(RegisterError::invalid(
                wanted.param,
                format!("the split model '{primary}' is missing parts: {}", missing.join(", ")),
            ));
        }
        plan.files.extend(parts);
    }
    plan.files.extend(present(files, GGUF_OPTIONAL));
    Ok(plan)
}

fn choice_error(error: GgufChoiceError, source: &'static str) -> RegisterError {
    match error {
        GgufChoiceError::NoGguf => {
            RegisterError::invalid(source, format!("the {} has no GGUF model file", noun(source)))
        }
        GgufChoiceError::NoMatchingFile { requested, available } => RegisterError::invalid(
            "quantization",
            format!(
                "no GGUF file is tagged '{requested}' (exact, case-sensitive); available: {}",
                available.join(", ")
            ),
        ),
        GgufChoiceError::Ambiguous { requested: Some(tag), candidates } => RegisterError::invalid(
            "file",
            format!("several GGUF files are tagged '{tag}': {}; set `file` to one of them", candidates.join(", ")),
        ),
        GgufChoiceError::Ambiguous { requested: None, candidates } => RegisterError::invalid(
            "quantization",
            format!(
                "several GGUF files and none tagged {}: {}; set `quantization` or `file`",
                PREFERRED_QUANTIZATIONS.join(" or "),
                candidates.join(", ")
            ),
        ),
    }
}

fn present(files: &[String], names: &[&str]) -> Vec<String> {
    names.iter().filter(|n| files.iter().any(|f| f == *n)).map(|n| n.to_string()).collect()
}

/// Spec 003: `config.json` and `tokenizer.json` are required; the primary file is the
/// `*.safetensors.index.json`, else the only `*.safetensors`.
fn safetensors_plan(files: &[String], source: &'static str) -> Result<Plan, RegisterError> {
    let missing: Vec<&str> = [CONFIG, TOKENIZER].into_iter().filter(|r| !files.iter().any(|f| f == r)).collect();
    if !missing.is_empty() {
        return Err(RegisterError::invalid(
            source,
            format!("safetensors models need config.json and tokenizer.json; missing: {}", missing.join(", ")),
        ));
    }
    let weights = safetensors_weights(files);
    let (indexes, singles): (Vec<&str>, Vec<&str>) = weights.into_iter().partition(|f| ends_with_ci(f, INDEX_SUFFIX));
    let primary = match (indexes.as_slice(), singles.as_slice()) {
        ([index], _) => index.to_string(),
        ([], [single]) => single.to_string(),
        ([], several) => {
            return Err(RegisterError::invalid(
                source,
                format!(
                    "several *.safetensors files and no *.safetensors.index.json, so the primary file is ambiguous: {}",
                    several.join(", ")
                ),
            ));
        }
        (several, _) => {
            return Err(RegisterError::invalid(
                source,
                format!("several *.safetensors.index.json files: {}", several.join(", ")),
            ));
        }
    };
    let mut files_out = vec![CONFIG.to_string(), TOKENIZER.to_string()];
    files_out.extend(present(files, SAFETENSORS_OPTIONAL));
    files_out.push(primary.clone());
    Ok(Plan { format: ModelFormat::Safetensors, primary, files: files_out })
}

/// Whether the plan's primary file is an index whose shards must be added.
pub(super) fn needs_shards(plan: &Plan) -> bool {
    plan.format == ModelFormat::Safetensors && ends_with_ci(&plan.primary, INDEX_SUFFIX)
}

#[derive(Deserialize)]
struct RawIndex {
    weight_map: BTreeMap<String, String>,
}

/// Adds every shard the index names (each a plain `*.safetensors` name present in the listing).
pub(super) fn add_shards(
    plan: &mut Plan,
    index_json: &[u8],
    files: &[String],
    source: &'static str,
) -> Result<(), RegisterError> {
    let index = &plan.primary;
    let raw: RawIndex = serde_json::from_slice(index_json)
        .map_err(|e| RegisterError::invalid(source, format!("{index} is not a safetensors index: {e}")))?;
    let shards: BTreeSet<String> = raw.weight_map.into_values().collect();
    if shards.is_empty() {
        return Err(RegisterError::invalid(source, format!("{index}: the weight_map is empty")));
    }
    if let Some(bad) = shards.iter().find(|s| {
        !ends_with_ci(s, WEIGHTS_SUFFIX)
            || s.starts_with('.')
            || s.contains(['/', '\\', ':'])
            || s.chars().any(char::is_control)
    }) {
        return Err(RegisterError::invalid(
            source,
            format!("{index}: shard name {bad:?} is not a plain *.safetensors file name in the model directory"),
        ));
    }
    let missing: Vec<&str> = shards.iter().filter(|s| !files.contains(s)).map(String::as_str).collect();
    if !missing.is_empty() {
        return Err(RegisterError::invalid(
            source,
            format!("{index}: shards named by the index are missing: {}", missing.join(", ")),
        ));
    }
    plan.files.extend(shards);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn repo<'a>() -> Wanted<'a> {
        Wanted { param: "repo", ..Wanted::default() }
    }

    fn err(result: Result<Plan, RegisterError>) -> (u16, &'static str, String) {
        let e = result.unwrap_err();
        (e.status(), e.param().unwrap(), e.to_string())
    }

    #[test]
    fn gguf_choice_follows_llmr_pull() {
        let all = files(&["README.md", "config.json", "m-Q8_0.gguf", "m-Q4_K_M.gguf", "mmproj-m-f16.gguf"]);
        let plan = plan(&all, &repo()).unwrap();
        assert_eq!((plan.format, plan.primary.as_str()), (ModelFormat::Gguf, "m-Q4_K_M.gguf"));
        assert_eq!(plan.files, ["m-Q4_K_M.gguf", "config.json"]);
        let q8 = super::plan(&all, &Wanted { quantization: Some("Q8_0"), ..repo() }).unwrap();
        assert_eq!(q8.primary, "m-Q8_0.gguf");
        let by_file = super::plan(&all, &Wanted { file: Some("m-Q8_0.gguf"), ..repo() }).unwrap();
        assert_eq!(by_file.primary, "m-Q8_0.gguf");

        let (status, param, message) = err(super::plan(&all, &Wanted { quantization: Some("q8_0"), ..repo() }));
        assert_eq!((status, param), (400, "quantization"));
        assert!(message.contains("available: m-Q8_0.gguf, m-Q4_K_M.gguf"), "{message}");
        let (status, param, _) = err(super::plan(&all, &Wanted { file: Some("absent.gguf"), ..repo() }));
        assert_eq!((status, param), (404, "file"));
        let (status, param, _) = err(super::plan(&all, &Wanted { file: Some("mmproj-m-f16.gguf"), ..repo() }));
        assert_eq!((status, param), (400, "file"));
        let (_, param, message) = err(super::plan(&files(&["a-F16.gguf", "a-Q5_0.gguf"]), &repo()));
        assert_eq!(param, "quantization");
        assert!(message.contains("a-F16.gguf, a-Q5_0.gguf"), "{message}");
        let (_, param, _) = err(super::plan(
            &files(&["x/a-Q4_0.gguf", "y/a-Q4_0.gguf"]),
            &Wanted { quantization: Some("Q4_0"), ..repo() },
        ));
        assert_eq!(param, "file");
    }

    #[test]
    fn split_ggufs_bring_every_part() {
        let all = files(&["d/m-00001-of-00002.gguf", "d/m-00002-of-00002.gguf"]);
        let plan = plan(&all, &repo()).unwrap();
        assert_eq!(plan.files, ["d/m-00001-of-00002.gguf", "d/m-00002-of-00002.gguf"]);
        let (_, param, message) =
            err(super::plan(&files(&["m-00001-of-00003.gguf", "m-00002-of-00003.gguf"]), &repo()));
        assert_eq!(param, "repo");
        assert!(message.contains("missing parts: m-00003-of-00003.gguf"), "{message}");
    }

    #[test]
    fn both_formats_need_a_choice() {
        let all = files(&["config.json", "tokenizer.json", "model.safetensors", "gguf/m-Q4_0.gguf"]);
        let (status, param, message) = err(plan(&all, &repo()));
        assert_eq!((status, param), (400, "format"));
        assert!(message.contains("GGUF (gguf/m-Q4_0.gguf) and safetensors (model.safetensors)"), "{message}");
        assert_eq!(
            plan(&all, &Wanted { format: Some(ModelFormat::Gguf), ..repo() }).unwrap().primary,
            "gguf/m-Q4_0.gguf"
        );
        let st = plan(&all, &Wanted { format: Some(ModelFormat::Safetensors), ..repo() }).unwrap();
        assert_eq!(st.files, ["config.json", "tokenizer.json", "model.safetensors"]);
        let (_, param, _) =
            err(plan(&all, &Wanted { format: Some(ModelFormat::Safetensors), quantization: Some("Q4_0"), ..repo() }));
        assert_eq!(param, "quantization");
        let (_, param, _) = err(plan(
            &files(&["model.safetensors", "config.json", "tokenizer.json"]),
            &Wanted { format: Some(ModelFormat::Gguf), ..repo() },
        ));
        assert_eq!(param, "format");
        let (_, param, _) = err(plan(&files(&["README.md"]), &repo()));
        assert_eq!(param, "repo");
    }

    #[test]
    fn safetensors_rules_of_spec_003() {
        let (_, param, message) = err(plan(&files(&["config.json", "model.safetensors"]), &repo()));
        assert_eq!(param, "repo");
        assert!(message.contains("missing: tokenizer.json"), "{message}");
        let (_, _, message) =
            err(plan(&files(&["config.json", "tokenizer.json", "a.safetensors", "b.safetensors"]), &repo()));
        assert!(message.contains("ambiguous: a.safetensors, b.safetensors"), "{message}");

        let all = files(&[
            "config.json",
            "tokenizer.json",
            "generation_config.json",
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ]);
        let mut plan = plan(&all, &repo()).unwrap();
        assert!(needs_shards(&plan));
        let index = br#"{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}}"#;
        add_shards(&mut plan, index, &all, "repo").unwrap();
        assert_eq!(
            plan.files,
            [
                "config.json",
                "tokenizer.json",
                "generation_config.json",
                "model.safetensors.index.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
    }

    #[test]
    fn index_shards_must_be_present_and_plain() {
        let all = files(&["config.json", "tokenizer.json", "m.safetensors.index.json", "a.safetensors"]);
        let base = plan(&all, &repo()).unwrap();
        for (index, expected) in [
            (r#"{"weight_map": {"x": "b.safetensors"}}"#, "missing: b.safetensors"),
            (r#"{"weight_map": {"x": "../a.safetensors"}}"#, "not a plain"),
            (r#"{"weight_map": {}}"#, "empty"),
            (r#"{"nope": 1}"#, "not a safetensors index"),
        ] {
            let e = add_shards(&mut base.clone(), index.as_bytes(), &all, "repo").unwrap_err();
            assert!(e.to_string().contains(expected), "{index}: {e}");
        }
    }
}
