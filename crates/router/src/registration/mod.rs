//! Model registration (`POST /v0/models`): turns a [`RegisterModel`] into the [`ModelManifest`]
//! nodes sync from, fixing once the format, the primary file and every file's size and sha256
//! (spec 003). Nothing is written and no model bytes are kept: LFS files are known from the
//! hub's listing, small files are downloaded and hashed, GGUF metadata comes from `Range`
//! requests of the file's head.
//!
//! - `rules`: which files of a listing make the model (format, GGUF choice, safetensors rules).
//! - `local`: a directory or GGUF file on a mount every node reads at the same path.
//! - `url`: one GGUF file at an http(s) URL.
//! - `gguf_head`: architecture, quantization and chat template from a GGUF's head.
//!
//! Every hub and URL request goes through the one hub client (`llmr_hub`): listings pinned to
//! their commit, redirects, the token's scope, Range reads and hashing; its errors become
//! [`RegisterError`]s in one place, `RegisterError::hub`.

mod error;
mod gguf_head;
mod local;
mod rules;
mod speech_rules;
mod url;

pub use error::RegisterError;

use self::gguf_head::{GgufFacts, HEAD_LIMITS};
use self::rules::{Plan, Wanted, CONFIG, TOKENIZER_CONFIG};
use llmr_cluster::{
    check_model_name, check_relative_path, ManifestFile, ModelFormat, ModelManifest, ModelSource, RegisterModel,
};
use llmr_hub::{sha256_hex, Hub, HubError, ListedFile, Listing, Remote, Url};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::PathBuf;

/// JSON files read for their content (configs, safetensors index); larger ones are refused.
const JSON_LIMIT: u64 = 32 << 20;

/// Registers models from a Hugging Face compatible hub, a shared path or a URL. Not `Debug`, so
/// the token cannot end up in a log.
pub struct Registrar {
    /// The client of the hub for `repo` registrations, or why the endpoint is unusable.
    hub: Result<Hub, HubError>,
    endpoint: String,
}

/// Where a listing's files are read: a hub repository or a local directory.
enum Source {
    Hub(Listing),
    Local(PathBuf),
}

impl Registrar {
    /// `default_endpoint`: the hub for `repo` registrations (`HF_ENDPOINT`); `token` is sent to
    /// it (only) as a bearer token.
    pub fn new(default_endpoint: String, token: Option<String>) -> Self {
        let endpoint = default_endpoint.trim_end_matches('/').to_string();
        Self { hub: Hub::new(&endpoint, token), endpoint }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn hub(&self) -> Result<&Hub, RegisterError> {
        self.hub.as_ref().map_err(|e| RegisterError::internal(format!("the router's hub: {e}")))
    }

    /// The client for a registered URL: the hub's (with its token) when the URL is on the
    /// hub's origin, else one for the URL's own server, without the token.
    fn client_for(&self, url: &Url) -> Result<Hub, RegisterError> {
        match &self.hub {
            Ok(hub) => Ok(hub.for_url(url)),
            Err(_) => Hub::new(&url.origin().ascii_serialization(), None).map_err(|e| RegisterError::hub("url", e)),
        }
    }

    /// Checks the request and builds its manifest (registered at `now_unix`).
    pub async fn manifest(&self, req: &RegisterModel, now_unix: u64) -> Result<ModelManifest, RegisterError> {
        check_request(req)?;
        let mut manifest = match (&req.repo, &req.path, &req.url) {
            (Some(repo), None, None) => self.by_repo(repo, req).await?,
            (None, Some(path), None) => self.by_path(path, req).await?,
            (None, None, Some(url)) => self.by_url(url, req).await?,
            _ => unreachable!("check_request allows exactly one source"),
        };
        manifest.registered_at = now_unix;
        for file in &manifest.files {
            // Every path was checked on the way in; this is the invariant nodes rely on.
            debug_assert!(check_relative_path(&file.path).is_ok(), "{}", file.path);
        }
        Ok(manifest)
    }

    async fn by_repo(&self, repo: &str, req: &RegisterModel) -> Result<ModelManifest, RegisterError> {
        let revision = req.revision.as_deref().unwrap_or("main");
        let listing = self.hub()?.list(repo, revision).await.map_err(|e| RegisterError::hub("repo", e))?;
        let name = req.name.clone().unwrap_or_else(|| repo.to_string());
        let model_source = ModelSource::Hub {
            endpoint: self.endpoint.clone(),
            repo: repo.to_string(),
            revision: listing.revision.clone(),
        };
        let files = listing.files.clone();
        self.build(&Source::Hub(listing), &files, wanted(req, "repo"), name, model_source).await
    }

    async fn by_path(&self, path: &str, req: &RegisterModel) -> Result<ModelManifest, RegisterError> {
        let owned = path.to_string();
        let model = blocking(move || local::open(&owned)).await?;
        let mut wanted = wanted(req, "path");
        if model.file.is_some() {
            for (param, given) in [("file", req.file.is_some()), ("quantization", req.quantization.is_some())] {
                if given {
                    return Err(RegisterError::invalid(param, "applies to a directory; `path` names one file"));
                }
            }
            wanted.file = model.file.as_deref();
        }
        let name = default_name(req, model.stem.as_deref(), "path")?;
        let dir = model.dir.to_str().ok_or_else(|| RegisterError::invalid("path", "is not UTF-8"))?.to_string();
        self.build(&Source::Local(model.dir.clone()), &model.files, wanted, name, ModelSource::Path { dir }).await
    }

    async fn by_url(&self, url: &str, req: &RegisterModel) -> Result<ModelManifest, RegisterError> {
        if req.format == Some(ModelFormat::Safetensors) {
            return Err(RegisterError::invalid("format", "a URL registers one GGUF file"));
        }
        let (parsed, file_name) = url::parse(url)?;
        let model = url::inspect(&self.client_for(&parsed)?, parsed, file_name).await?;
        let name = default_name(req, Some(&model.stem), "url")?;
        Ok(ModelManifest {
            name,
            format: ModelFormat::Gguf,
            source: ModelSource::Url { url: url.to_string() },
            primary: model.file.path.clone(),
            files: vec![model.file],
            quantization: model.facts.quantization,
            architecture: model.facts.architecture,
            has_chat_template: model.facts.has_chat_template,
            registered_at: 0,
        })
    }

    /// The manifest of a listing (a repository or a directory) whose files are read from `source`
    /// and which nodes fetch from `model_source`.
    async fn build(
        &self,
        source: &Source,
        listing: &[ListedFile],
        wanted: Wanted<'_>,
        name: String,
        model_source: ModelSource,
    ) -> Result<ModelManifest, RegisterError> {
        let paths: Vec<String> = listing.iter().map(|l| l.path.clone()).collect();
        let by_name: HashMap<&str, &ListedFile> = listing.iter().map(|l| (l.path.as_str(), l)).collect();
        let listed = |path: &str| -> &ListedFile { by_name[path] };
        let mut plan: Plan = rules::plan(&paths, &wanted)?;

        // Configs and the index are read for their content; they are small JSON.
        let mut contents: HashMap<String, Vec<u8>> = HashMap::new();
        if rules::needs_shards(&plan) {
            let index = self.read_json(source, listed(&plan.primary), wanted.param).await?;
            rules::add_shards(&mut plan, &index, &paths, wanted.param)?;
            contents.insert(plan.primary.clone(), index);
        }
        for meta in [CONFIG, TOKENIZER_CONFIG] {
            if plan.files.iter().any(|f| f == meta) {
                contents.insert(meta.to_string(), self.read_json(source, listed(meta), wanted.param).await?);
            }
        }

        let mut files = Vec::with_capacity(plan.files.len());
        for path in &plan.files {
            let (size, sha256) = match contents.get(path) {
                Some(bytes) => (bytes.len() as u64, sha256_hex(bytes)),
                None => self.size_and_sha256(source, listed(path), wanted.param).await?,
            };
            files.push(ManifestFile { path: path.clone(), size, sha256 });
        }

        let tokenizer_template = match contents.get(TOKENIZER_CONFIG) {
            Some(bytes) => has_template(bytes, wanted.param)?,
            None => false,
        };
        let facts = match plan.format {
            ModelFormat::Gguf => {
                let primary = files.iter().find(|f| f.path == plan.primary).expect("the primary is among the files");
                let mut facts = self.gguf_facts(source, primary, wanted.param).await?;
                facts.has_chat_template |= tokenizer_template;
                facts.quantization = facts.quantization.or(wanted.quantization.map(str::to_string));
                facts
            }
            ModelFormat::Safetensors => {
                let (architecture, dtype) = config_facts(&contents[CONFIG], wanted.param)?;
                GgufFacts { architecture, quantization: dtype, has_chat_template: tokenizer_template }
            }
            // A speech model's architecture follows from its format; its file is checked when a
            // node loads it.
            ModelFormat::Ggml | ModelFormat::Onnx => GgufFacts {
                architecture: speech_rules::architecture(plan.format).map(str::to_string),
                quantization: None,
                has_chat_template: false,
            },
        };
        Ok(ModelManifest {
            name,
            format: plan.format,
            source: model_source,
            files,
            primary: plan.primary,
            quantization: facts.quantization,
            architecture: facts.architecture,
            has_chat_template: facts.has_chat_template,
            registered_at: 0,
        })
    }

    /// The hub client and the file of the listing at its pinned revision.
    fn remote(&self, listing: &Listing, path: &str) -> Result<(&Hub, Remote), RegisterError> {
        let hub = self.hub()?;
        Ok((hub, listing.file(hub, path)))
    }

    async fn read_json(
        &self,
        source: &Source,
        file: &ListedFile,
        param: &'static str,
    ) -> Result<Vec<u8>, RegisterError> {
        let bytes = match source {
            Source::Hub(listing) => {
                let (hub, remote) = self.remote(listing, &file.path)?;
                hub.read(&remote, JSON_LIMIT).await.map_err(|e| RegisterError::hub(param, e))?
            }
            Source::Local(dir) => {
                let path = dir.join(&file.path);
                blocking(move || local::read_limited(&path, JSON_LIMIT)).await?
            }
        };
        if let Some(size) = file.size.filter(|&s| s != bytes.len() as u64) {
            return Err(RegisterError::upstream(format!(
                "'{}' was listed with {size} bytes, {} were read",
                file.path,
                bytes.len()
            )));
        }
        Ok(bytes)
    }

    /// From the listing when it knows both (LFS files), else by hashing the file as it streams.
    async fn size_and_sha256(
        &self,
        source: &Source,
        file: &ListedFile,
        param: &'static str,
    ) -> Result<(u64, String), RegisterError> {
        if let (Some(size), Some(sha256)) = (file.size, &file.sha256) {
            return Ok((size, sha256.clone()));
        }
        let (size, sha256) = match source {
            Source::Hub(listing) => {
                let (hub, remote) = self.remote(listing, &file.path)?;
                hub.hash(&remote).await.map_err(|e| RegisterError::hub(param, e))?
            }
            Source::Local(dir) => {
                let path = dir.join(&file.path);
                blocking(move || local::hash_file(&path)).await?
            }
        };
        if let Some(listed) = file.size.filter(|&s| s != size) {
            return Err(RegisterError::upstream(format!(
                "'{}' was listed with {listed} bytes, {size} were read",
                file.path
            )));
        }
        Ok((size, sha256))
    }

    async fn gguf_facts(
        &self,
        source: &Source,
        file: &ManifestFile,
        param: &'static str,
    ) -> Result<GgufFacts, RegisterError> {
        match source {
            Source::Hub(listing) => {
                let (hub, remote) = self.remote(listing, &file.path)?;
                let what = format!("'{}' of repository '{}'", file.path, listing.repo);
                gguf_head::read_remote(hub, &remote, file.size, HEAD_LIMITS, param, &what).await
            }
            Source::Local(dir) => gguf_head::read_local(dir.join(&file.path), param, format!("'{}'", file.path)).await,
        }
    }
}

fn wanted<'a>(req: &'a RegisterModel, param: &'static str) -> Wanted<'a> {
    Wanted { format: req.format, file: req.file.as_deref(), quantization: req.quantization.as_deref(), param }
}

/// The checks that need no I/O: one source, and every name and path plain.
fn check_request(req: &RegisterModel) -> Result<(), RegisterError> {
    let given: Vec<&'static str> =
        [("repo", req.repo.is_some()), ("path", req.path.is_some()), ("url", req.url.is_some())]
            .into_iter()
            .filter_map(|(field, set)| set.then_some(field))
            .collect();
    match given.as_slice() {
        [_] => {}
        [] => return Err(RegisterError::invalid("repo", "give one of `repo`, `path` or `url`")),
        [_, second, ..] => {
            return Err(RegisterError::invalid(
                second,
                format!("give only one of `repo`, `path` or `url` (got {})", given.join(", ")),
            ));
        }
    }
    if let Some(name) = &req.name {
        check_model_name(name).map_err(|p| RegisterError::invalid("name", format!("{name:?} {p}")))?;
    }
    if let Some(repo) = &req.repo {
        check_model_name(repo).map_err(|p| RegisterError::invalid("repo", format!("{repo:?} {p}")))?;
        if repo.split('/').count() != 2 || repo.contains(':') {
            return Err(RegisterError::invalid("repo", format!("{repo:?} is not a repository id ('owner/name')")));
        }
    }
    if let Some(file) = &req.file {
        check_relative_path(file).map_err(|p| RegisterError::invalid("file", format!("{file:?} {p}")))?;
    }
    if let Some(tag) = &req.quantization {
        if tag.is_empty() || !tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(RegisterError::invalid(
                "quantization",
                format!("{tag:?} is not a quantization tag such as Q4_K_M"),
            ));
        }
    }
    if let Some(revision) = &req.revision {
        if req.repo.is_none() {
            return Err(RegisterError::invalid("revision", "applies to `repo` registrations only"));
        }
        if revision.len() > 256 {
            return Err(RegisterError::invalid("revision", "is longer than 256 bytes"));
        }
        check_relative_path(revision).map_err(|p| RegisterError::invalid("revision", format!("{revision:?} {p}")))?;
    }
    if req.url.is_some() {
        for (param, given) in [("file", req.file.is_some()), ("quantization", req.quantization.is_some())] {
            if given {
                return Err(RegisterError::invalid(param, "applies to `repo` and `path` registrations only"));
            }
        }
    }
    Ok(())
}

/// The request's `name`, else the file stem (or directory name), which must be a valid name.
fn default_name(req: &RegisterModel, stem: Option<&str>, from: &'static str) -> Result<String, RegisterError> {
    if let Some(name) = &req.name {
        return Ok(name.clone());
    }
    let stem =
        stem.ok_or_else(|| RegisterError::invalid("name", format!("the {from} gives no default name; set `name`")))?;
    check_model_name(stem).map_err(|p| {
        RegisterError::invalid("name", format!("the default name {stem:?} (from the {from}) {p}; set `name`"))
    })?;
    Ok(stem.to_string())
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, RegisterError> + Send + 'static,
) -> Result<T, RegisterError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| RegisterError::internal(format!("a blocking task failed: {e}")))?
}

fn parse_json<T: for<'de> Deserialize<'de>>(bytes: &[u8], file: &str, param: &'static str) -> Result<T, RegisterError> {
    serde_json::from_slice(bytes).map_err(|e| RegisterError::invalid(param, format!("{file} is not valid: {e}")))
}

/// `model_type` (else the first of `architectures`) and `torch_dtype` (`dtype` in newer
/// transformers) of a `config.json`.
fn config_facts(bytes: &[u8], param: &'static str) -> Result<(Option<String>, Option<String>), RegisterError> {
    #[derive(Deserialize)]
    struct Config {
        model_type: Option<String>,
        #[serde(default)]
        architectures: Vec<String>,
        torch_dtype: Option<String>,
        dtype: Option<String>,
    }
    let config: Config = parse_json(bytes, CONFIG, param)?;
    let architecture = config.model_type.or_else(|| config.architectures.into_iter().next());
    Ok((architecture, config.torch_dtype.or(config.dtype)))
}

/// Whether a `tokenizer_config.json` has a `chat_template` (a string, or a list of named ones).
fn has_template(bytes: &[u8], param: &'static str) -> Result<bool, RegisterError> {
    let value: serde_json::Value = parse_json(bytes, TOKENIZER_CONFIG, param)?;
    Ok(match value.get("chat_template") {
        Some(serde_json::Value::String(t)) => !t.trim().is_empty(),
        Some(serde_json::Value::Array(list)) => !list.is_empty(),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(f: impl FnOnce(&mut RegisterModel)) -> RegisterModel {
        let mut r = RegisterModel { repo: Some("org/m".into()), ..RegisterModel::default() };
        f(&mut r);
        r
    }

    fn param(r: RegisterModel) -> Option<&'static str> {
        check_request(&r).err().and_then(|e| e.param())
    }

    #[test]
    fn requests_name_one_source_and_plain_paths() {
        assert_eq!(check_request(&req(|_| {})).ok(), Some(()));
        assert_eq!(param(RegisterModel::default()), Some("repo"));
        assert_eq!(param(req(|r| r.url = Some("https://h/m.gguf".into()))), Some("url"));
        assert_eq!(param(req(|r| r.name = Some("../etc".into()))), Some("name"));
        assert_eq!(param(req(|r| r.name = Some("/abs".into()))), Some("name"));
        assert_eq!(param(req(|r| r.file = Some("../../x.gguf".into()))), Some("file"));
        assert_eq!(param(req(|r| r.file = Some("/etc/x.gguf".into()))), Some("file"));
        assert_eq!(param(req(|r| r.repo = Some("../x".into()))), Some("repo"));
        assert_eq!(param(req(|r| r.repo = Some("org/m/extra".into()))), Some("repo"));
        assert_eq!(param(req(|r| r.revision = Some("../main".into()))), Some("revision"));
        assert_eq!(param(req(|r| r.quantization = Some("Q4 K".into()))), Some("quantization"));
        let path_and_revision =
            RegisterModel { path: Some("/m".into()), revision: Some("main".into()), ..Default::default() };
        assert_eq!(param(path_and_revision), Some("revision"));
    }

    #[test]
    fn config_and_template_facts() {
        let (arch, dtype) = config_facts(br#"{"model_type": "qwen2", "torch_dtype": "bfloat16"}"#, "repo").unwrap();
        assert_eq!((arch.as_deref(), dtype.as_deref()), (Some("qwen2"), Some("bfloat16")));
        let (arch, dtype) =
            config_facts(br#"{"architectures": ["LlamaForCausalLM"], "dtype": "float16"}"#, "repo").unwrap();
        assert_eq!((arch.as_deref(), dtype.as_deref()), (Some("LlamaForCausalLM"), Some("float16")));
        assert_eq!(config_facts(b"{", "repo").unwrap_err().param(), Some("repo"));
        assert!(has_template(br#"{"chat_template": "{{ x }}"}"#, "repo").unwrap());
        assert!(has_template(br#"{"chat_template": [{"name": "default", "template": "x"}]}"#, "repo").unwrap());
        assert!(!has_template(br#"{"chat_template": null}"#, "repo").unwrap());
        assert!(!has_template(br#"{"eos_token": "</s>"}"#, "repo").unwrap());
    }
}
