//! The settings of `llmr serve` and `llmr node`: one struct per concern, each deriving
//! `clap::Args` (a flag and its env var per field) and serde (a key of one flat TOML file per
//! field, named as the field), so the three name the same thing by construction.
//!
//! One merge for every concern ([`ConfigFile::merge`]): a flag or its env var (clap gives them
//! as one value) beats the file, which beats the default. Defaults and units are applied in one
//! conversion per concern: [`NodeSettings::node_config`], [`ServeSettings::serve_config`].
//!
//! The file is `--config PATH`, else `$LLMR_CONFIG`, else `~/.llmr/config.toml` when present.
//! Its keys are the fields of [`ServeSettings`] and [`NodeSettings`]; any other key is an error
//! that names it (checked against the structs' own field names, read from their derived
//! `Deserialize`, since serde's `deny_unknown_fields` cannot see through several structs).

use crate::net::is_loopback;
use crate::serve::{ServeConfig, DEFAULT_MODEL};
use crate::Error;
use clap::Args;
use llmr_model_store::{ModelDescriptor, ModelStore};
use llmr_node::{AudioLimits, EngineIsolation, GateMode, NodeConfig, RestartPolicy, WorkerCommand, DEFAULT_WATCHDOG};
use llmr_router::{CorsOrigins, DEFAULT_RESPONSES_RETENTION};
use serde::de::{self, DeserializeOwned, Visitor};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// The node: engines, slots, context, memory, cache, store (`llmr serve` and `llmr node`).
#[derive(Args, Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeSettings {
    /// The model store (default ~/.llmr/models).
    #[arg(long, env = "LLMR_MODELS")]
    pub store: Option<PathBuf>,
    #[arg(long, env = "LLMR_ENGINES_DIR")]
    pub engines_dir: Option<PathBuf>,
    /// Requests each model runs at once.
    #[arg(long, env = "LLMR_SLOTS")]
    pub slots: Option<u32>,
    /// Requests that may wait per model before the server answers 429.
    #[arg(long, env = "LLMR_QUEUE_LIMIT")]
    pub queue_limit: Option<usize>,
    /// One modality at a time on a GPU: while language-model (chat, embeddings), speech-to-text
    /// or text-to-speech requests run there, requests of another get 429 with Retry-After at once. `auto` (default):
    /// models on a GPU plugin; `on`: every model; `off`: all queue.
    #[arg(long, env = "LLMR_GPU_MODALITY_GATE", value_name = "auto|on|off")]
    pub gpu_modality_gate: Option<String>,
    /// CPU threads per engine (0: the engine's choice).
    #[arg(long, env = "LLMR_THREADS")]
    pub threads: Option<u32>,
    /// Context length per request (0: the engine's default).
    #[arg(long, env = "LLMR_CTX_SIZE")]
    pub ctx_size: Option<u32>,
    /// Memory the loaded models may use (default: 90% of RAM).
    #[arg(long, env = "LLMR_MEMORY_BUDGET_MIB")]
    pub memory_budget_mib: Option<u64>,
    /// Temperature-0 answer cache (default: 5% of RAM; 0 turns it off).
    #[arg(long, env = "LLMR_CACHE_MIB")]
    pub cache_mib: Option<usize>,
    /// Largest request body accepted (413 beyond).
    #[arg(long, env = "LLMR_BODY_LIMIT_MIB")]
    pub body_limit_mib: Option<usize>,
    /// Largest audio upload for transcription (413 beyond; default 25, OpenAI's limit).
    #[arg(long, env = "LLMR_MAX_AUDIO_MIB")]
    pub max_audio_mib: Option<usize>,
    /// Longest audio one transcription request may hold, in seconds (413 beyond; default 3600).
    #[arg(long, env = "LLMR_MAX_AUDIO_SECONDS")]
    pub max_audio_seconds: Option<f64>,
    /// Most characters of text one speech request may speak (413 beyond; default 4096).
    #[arg(long, env = "LLMR_MAX_SPEECH_CHARS")]
    pub max_speech_chars: Option<usize>,
    /// The KV-cache control API (POST /v1/policy, POST /v1/run-context, GET /v1/metrics,
    /// GET /v1/health) on 127.0.0.1 at this port; off by default.
    #[arg(long, env = "LLMR_CONTROL_PORT")]
    pub control_port: Option<u16>,
    /// Appends one JSON line of those metrics a second to this file.
    #[arg(long, env = "LLMR_METRICS_FILE")]
    pub metrics_file: Option<PathBuf>,
    /// The KV policy models start with, as JSON (`{"mode":"dynamic","profile":"balanced"}`);
    /// engines without KV levels ignore it.
    #[arg(long, env = "LLMR_KV_POLICY")]
    pub kv_policy: Option<String>,
    /// Where engine plugins run: `process` (default) gives each loaded model a worker process
    /// of its own, so a plugin crash fails only that model's requests in flight and the model is
    /// reloaded; `in-process` runs them in the server's process (a crash ends the server).
    #[arg(long, env = "LLMR_ENGINE_ISOLATION", value_name = "process|in-process")]
    pub engine_isolation: Option<String>,
    /// Seconds an engine call may make no progress before it counts as hung: its requests get
    /// 504 and its worker is restarted (default 30; 0: no watchdog). Needs `process` isolation.
    #[arg(long, env = "LLMR_ENGINE_WATCHDOG_SECS")]
    pub engine_watchdog_secs: Option<u64>,
    /// Restart each loaded model in a new engine after it has been loaded this many hours (the
    /// new one loads beside the old, which finishes its requests; none is dropped). Default: never.
    #[arg(long, env = "LLMR_ENGINE_RESTART_HOURS")]
    pub engine_restart_hours: Option<f64>,
    /// The same, after this many requests. Default: never.
    #[arg(long, env = "LLMR_ENGINE_RESTART_REQUESTS")]
    pub engine_restart_requests: Option<u64>,
    /// Copies of each GPU model, each on its own GPU (those with the most free memory), taking
    /// requests in turn; a crashed copy is skipped until it is back. Default 1.
    #[arg(long, env = "LLMR_GPU_REPLICAS")]
    pub gpu_replicas: Option<u32>,
}

impl NodeSettings {
    /// The model store: the setting, else `~/.llmr/models`.
    pub fn store_root(&self) -> Result<PathBuf, Error> {
        match &self.store {
            Some(p) => Ok(p.clone()),
            None => ModelStore::default_root().ok_or(Error::NoHome { what: "model store", flag: "--store" }),
        }
    }

    /// The node's configuration (MiB into bytes, the node's defaults), without models or keys.
    pub fn node_config(&self) -> Result<NodeConfig, Error> {
        let defaults = NodeConfig::default();
        let kv_policy = match &self.kv_policy {
            Some(text) => Some(
                serde_json::from_str(text)
                    .map_err(|e| Error::Setting { name: "--kv-policy", message: format!("not JSON: {e}") })?,
            ),
            None => None,
        };
        let gpu_modality_gate = match self.gpu_modality_gate.as_deref() {
            None => defaults.gpu_modality_gate,
            Some(s) => GateMode::parse(s).ok_or_else(|| Error::Setting {
                name: "--gpu-modality-gate",
                message: format!("`{s}` is not auto, on or off"),
            })?,
        };
        let watchdog = match self.engine_watchdog_secs {
            None => Some(DEFAULT_WATCHDOG),
            Some(0) => None,
            Some(secs) => Some(Duration::from_secs(secs)),
        };
        let engine_isolation = match self.engine_isolation.as_deref() {
            None | Some("process") => EngineIsolation::Worker {
                // `llmr engine-worker`: this binary is the worker program.
                command: WorkerCommand::this_binary(&["engine-worker"]).map_err(|e| Error::Setting {
                    name: "--engine-isolation",
                    message: format!("cannot find this program to start engine workers: {e}"),
                })?,
                watchdog,
            },
            Some("in-process") => EngineIsolation::InProcess,
            Some(other) => {
                return Err(Error::Setting {
                    name: "--engine-isolation",
                    message: format!("`{other}` is not process or in-process"),
                })
            }
        };
        let engine_restart = RestartPolicy {
            after: match self.engine_restart_hours {
                Some(h) if !(h > 0.0 && h.is_finite()) => {
                    return Err(Error::Setting {
                        name: "--engine-restart-hours",
                        message: format!("{h} is not a positive number of hours"),
                    })
                }
                h => h.map(|h| Duration::from_secs_f64(h * 3600.0)),
            },
            after_requests: match self.engine_restart_requests {
                Some(0) => {
                    return Err(Error::Setting { name: "--engine-restart-requests", message: "0 requests".into() })
                }
                n => n,
            },
        };
        Ok(NodeConfig {
            engines_dir: self.engines_dir.clone().unwrap_or(defaults.engines_dir),
            models: Vec::new(),
            slots: self.slots.unwrap_or(defaults.slots),
            queue_limit: self.queue_limit.unwrap_or(defaults.queue_limit),
            gpu_modality_gate,
            threads: self.threads.unwrap_or(defaults.threads),
            context_length: self.ctx_size.unwrap_or(defaults.context_length),
            memory_budget: self.memory_budget_mib.map(|m| m << 20),
            cache_bytes: self.cache_mib.map(|m| m << 20),
            api_keys: Vec::new(),
            body_limit: self.body_limit_mib.map_or(defaults.body_limit, |m| m << 20),
            control_port: self.control_port,
            metrics_file: self.metrics_file.clone(),
            kv_policy,
            engine_isolation,
            audio: AudioLimits {
                max_upload_bytes: self.max_audio_mib.map_or(defaults.audio.max_upload_bytes, |m| m << 20),
                max_seconds: self.max_audio_seconds.unwrap_or(defaults.audio.max_seconds),
                max_speech_chars: self.max_speech_chars.unwrap_or(defaults.audio.max_speech_chars),
            },
            memory_probe: defaults.memory_probe,
            engine_restart,
            // Beside the models it measured (the store keeps models in folders; files at its
            // root are not models).
            benchmarks_file: self.store_root().ok().map(|root| root.join(".engine-benchmarks.json")),
            devices: defaults.devices,
            gpu_replicas: match self.gpu_replicas {
                Some(0) => return Err(Error::Setting { name: "--gpu-replicas", message: "0 copies".into() }),
                n => n.unwrap_or(defaults.gpu_replicas),
            },
        })
    }
}

/// `llmr serve`'s front: where it listens, the clients' key, and the models.
#[derive(Args, Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ServeSettings {
    /// Address to listen on. Anything but loopback requires an API key (or --no-auth).
    #[arg(long, env = "LLMR_HOST")]
    pub host: Option<String>,
    /// Port (0 picks a free one; the address is printed).
    #[arg(long, env = "LLMR_PORT")]
    pub port: Option<u16>,
    /// Clients must send `Authorization: Bearer KEY`.
    #[arg(long, env = "LLMR_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Accept a non-loopback address without an API key.
    // A switch: off says nothing (it is left out of the merge), so the file can turn it on.
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub no_auth: bool,
    /// Web pages allowed to call the API from a browser: exact origins
    /// (`https://app.example.com`), or `*` for any. Default: pages served from this machine.
    #[arg(long, env = "LLMR_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Option<Vec<String>>,
    /// Days a stored response of /v1/responses is kept (default 30, as OpenAI).
    #[arg(long, env = "LLMR_RESPONSES_RETENTION_DAYS")]
    pub responses_retention_days: Option<u32>,
    /// A model to serve: a store name, a GGUF path, a safetensors model folder, or ALIAS=PATH.
    /// Repeatable; default: the whole store. The first one is preloaded.
    #[arg(long = "model", short = 'm', env = "LLMR_MODEL", value_delimiter = ',')]
    pub models: Option<Vec<String>>,
    /// The model to preload (file only).
    #[arg(skip)]
    pub default_model: Option<String>,
}

impl ServeSettings {
    /// The one conversion into a [`ServeConfig`]: the defaults (`127.0.0.1:8080`), the loopback
    /// rule, the store, the models (`--model` values resolved, else the whole store) and the
    /// model to preload (the file's `default_model`, else the first one named, else
    /// SmolLM2-135M-Instruct if served, else the first one).
    pub fn serve_config(self, node: &NodeSettings, router_db: Option<PathBuf>) -> Result<ServeConfig, Error> {
        let store_root = node.store_root()?;
        let node_config = node.node_config()?;
        let host = self.host.unwrap_or_else(|| "127.0.0.1".into());
        let port = self.port.unwrap_or(8080);
        let api_key = self.api_key.filter(|k| !k.is_empty());
        check_exposure(&host, api_key.as_deref(), self.no_auth)?;
        let cors = CorsOrigins::parse(&self.cors_origins.unwrap_or_default())
            .map_err(|message| Error::Setting { name: "--cors-origins", message })?;
        let responses_retention = match self.responses_retention_days {
            None => DEFAULT_RESPONSES_RETENTION,
            Some(0) => {
                return Err(Error::Setting {
                    name: "--responses-retention-days",
                    message: "must be at least 1 (a request can say `store: false` instead)".into(),
                })
            }
            Some(days) => Duration::from_secs(u64::from(days) * 24 * 3600),
        };
        let store = ModelStore::open(&store_root).map_err(|e| Error::Store(e.into()))?;
        let specs = self.models.unwrap_or_default();
        let models: Vec<ModelDescriptor> = if specs.is_empty() {
            store.list()
        } else {
            specs.iter().map(|s| resolve_model(s, &store)).collect::<Result<_, _>>()?
        };
        if models.is_empty() {
            return Err(Error::NoModels { store: store_root });
        }
        let default_model = self
            .default_model
            .or_else(|| (!specs.is_empty()).then(|| models[0].name.clone()))
            .or_else(|| models.iter().find(|m| m.name.starts_with(DEFAULT_MODEL)).map(|m| m.name.clone()))
            .unwrap_or_else(|| models[0].name.clone());
        Ok(ServeConfig {
            host,
            port,
            api_key,
            no_auth: self.no_auth,
            cors,
            responses_retention,
            node: NodeConfig { models, ..node_config },
            store: store_root,
            scan_store: specs.is_empty(),
            default_model,
            router_db,
        })
    }
}

/// Only loopback is served without an API key, unless `no_auth` says otherwise.
pub(crate) fn check_exposure(host: &str, api_key: Option<&str>, no_auth: bool) -> Result<(), Error> {
    if !is_loopback(host) && api_key.is_none() && !no_auth {
        return Err(Error::Exposed { host: host.to_owned() });
    }
    Ok(())
}

/// A `--model` value resolved to a descriptor: a model file (GGUF, whisper.cpp) or a model
/// folder (safetensors, a Piper voice), else a store name; `ALIAS=` renames.
fn resolve_model(spec: &str, store: &ModelStore) -> Result<ModelDescriptor, Error> {
    let (alias, target) = match spec.split_once('=') {
        Some((a, t)) if !a.is_empty() && !a.contains('/') => (Some(a), t),
        _ => (None, spec),
    };
    let path = Path::new(target);
    let mut desc = if path.is_file() || path.join("config.json").is_file() || llmr_model_store::is_model_dir(path) {
        ModelDescriptor::from_path(path).map_err(|e| Error::ModelFile { spec: target.to_owned(), source: e.into() })?
    } else {
        store.resolve(target).map_err(|e| Error::ModelNotFound {
            spec: target.to_owned(),
            store: store.root().to_path_buf(),
            source: e.into(),
        })?
    };
    if let Some(alias) = alias {
        desc.name = alias.to_owned();
    }
    Ok(desc)
}

/// `llmr node --api-key`: a key clients that reach the node directly may send, besides the
/// router's secret (the file's `api_key`).
#[derive(Args, Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeKey {
    /// Also accept this key on `/v1` (for clients that reach the node directly).
    #[arg(long, env = "LLMR_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// `--config FILE`: which file to read.
#[derive(Args, Debug, Clone, Default)]
pub struct ConfigPath {
    /// TOML config file (default ~/.llmr/config.toml when present).
    #[arg(long, env = "LLMR_CONFIG")]
    pub config: Option<PathBuf>,
}

impl ConfigPath {
    /// The file named (which must exist), else the default one if present, else none.
    pub fn load(&self) -> Result<ConfigFile, Error> {
        ConfigFile::load(self.config.as_deref())
    }
}

/// `~/.llmr/config.toml`.
pub fn default_config_path() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").or_else(|| std::env::var_os("USERPROFILE"))?;
    Some(PathBuf::from(home).join(".llmr").join("config.toml"))
}

/// The config file, checked whole: TOML, only known keys, each of its type.
#[derive(Debug, Clone, Default)]
pub struct ConfigFile {
    /// Empty when there is no file.
    path: PathBuf,
    text: String,
}

impl ConfigFile {
    /// Reads the file named (which must exist), else the default one if present.
    pub fn load(named: Option<&Path>) -> Result<ConfigFile, Error> {
        let path = match named {
            Some(p) => p.to_path_buf(),
            None => match default_config_path() {
                Some(p) if p.is_file() => p,
                _ => return Ok(ConfigFile::default()),
            },
        };
        let text = std::fs::read_to_string(&path).map_err(|source| Error::ConfigRead { path: path.clone(), source })?;
        ConfigFile::parse(path, text)
    }

    /// Checks `text` (read from `path`): TOML, known keys, and the type of each value.
    pub fn parse(path: PathBuf, text: String) -> Result<ConfigFile, Error> {
        let file = ConfigFile { path, text };
        file.layer::<KnownKeys>()?;
        file.layer::<ServeSettings>()?;
        file.layer::<NodeSettings>()?;
        Ok(file)
    }

    /// The file's values of one concern (the keys of other concerns are not its business).
    fn layer<T: DeserializeOwned>(&self) -> Result<T, Error> {
        toml::from_str(&self.text).map_err(|source| Error::ConfigParse { path: self.path.clone(), source })
    }

    /// `flags` (as clap parsed them: a flag, else its env var) over this file, over the defaults:
    /// every value the flags set replaces the file's.
    pub fn merge<T: Serialize + DeserializeOwned>(&self, flags: &T) -> Result<T, Error> {
        overlay(&self.layer::<T>()?, flags).map_err(Error::Merge)
    }
}

/// `upper`'s values (those that are set: not null, not left out) over `lower`'s.
fn overlay<T: Serialize + DeserializeOwned>(lower: &T, upper: &T) -> Result<T, serde_json::Error> {
    let mut merged = object(lower)?;
    merged.extend(object(upper)?.into_iter().filter(|(_, v)| !v.is_null()));
    serde_json::from_value(serde_json::Value::Object(merged))
}

fn object<T: Serialize>(value: &T) -> Result<serde_json::Map<String, serde_json::Value>, serde_json::Error> {
    match serde_json::to_value(value)? {
        serde_json::Value::Object(map) => Ok(map),
        other => Err(de::Error::custom(format!("settings serialize as an object, not {other}"))),
    }
}

/// Every key the file may have: the fields of the concerns it holds.
pub fn file_keys() -> &'static [&'static str] {
    static KEYS: OnceLock<&'static [&'static str]> = OnceLock::new();
    KEYS.get_or_init(|| [field_names::<ServeSettings>(), field_names::<NodeSettings>()].concat().leak())
}

/// A file whose top-level keys are all [`file_keys`]: an unknown one is refused as serde's
/// `deny_unknown_fields` refuses it, so the TOML error points at it.
struct KnownKeys;

impl<'de> Deserialize<'de> for KnownKeys {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Table;
        impl<'de> Visitor<'de> for Table {
            type Value = KnownKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a table of settings")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<KnownKeys, A::Error> {
                while map.next_key::<Key>()?.is_some() {
                    map.next_value::<de::IgnoredAny>()?;
                }
                Ok(KnownKeys)
            }
        }
        deserializer.deserialize_map(Table)
    }
}

struct Key;

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl Visitor<'_> for Name {
            type Value = Key;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a setting's name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<Key, E> {
                match file_keys().contains(&name) {
                    true => Ok(Key),
                    false => Err(E::unknown_field(name, file_keys())),
                }
            }
        }
        deserializer.deserialize_identifier(Name)
    }
}

/// The names a struct's `Deserialize` accepts, as serde derives them (a deserializer that asks
/// for a struct and records the field list it is given).
fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> de::Deserializer<'de> for Probe<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("fields recorded"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        serve: ServeSettings,
        #[command(flatten)]
        node: NodeSettings,
    }

    /// The message with its causes, as the binary prints it.
    fn chain(e: &Error) -> String {
        let mut out = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(cause) = source {
            out = format!("{out}: {cause}");
            source = cause.source();
        }
        out
    }

    fn file(text: &str) -> ConfigFile {
        ConfigFile::parse(PathBuf::from("c.toml"), text.to_owned()).unwrap()
    }

    #[test]
    fn the_file_keys_are_the_documented_ones() {
        // README's configuration table, plus `default_model` and `no_auth`.
        let keys = [
            "host",
            "port",
            "api_key",
            "no_auth",
            "cors_origins",
            "responses_retention_days",
            "models",
            "default_model",
            "store",
            "engines_dir",
            "slots",
            "queue_limit",
            "gpu_modality_gate",
            "threads",
            "ctx_size",
            "memory_budget_mib",
            "cache_mib",
            "body_limit_mib",
            "max_audio_mib",
            "max_audio_seconds",
            "max_speech_chars",
            "control_port",
            "metrics_file",
            "kv_policy",
            "engine_isolation",
            "engine_watchdog_secs",
            "engine_restart_hours",
            "engine_restart_requests",
            "gpu_replicas",
        ];
        assert_eq!(file_keys(), keys);
    }

    #[test]
    fn unknown_keys_are_errors_that_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "port = 9000\nprot = 1\n").unwrap();
        let err = chain(&ConfigFile::load(Some(&path)).unwrap_err());
        assert!(
            err.contains("line 2, column 1") && err.contains("unknown field `prot`, expected one of `host`"),
            "{err}"
        );
        std::fs::write(&path, "port = 9000\nmodels = [\"a\", \"b=/x.gguf\"]\nslots = 2\n").unwrap();
        let c = ConfigFile::load(Some(&path)).unwrap();
        let (serve, node) = (c.merge(&ServeSettings::default()).unwrap(), c.merge(&NodeSettings::default()).unwrap());
        assert_eq!((serve.port, node.slots, serve.models.unwrap().len()), (Some(9000), Some(2), 2));
        assert!(ConfigFile::load(Some(&dir.path().join("missing.toml"))).is_err());
    }

    #[test]
    fn values_of_the_wrong_type_are_errors_even_for_another_concern() {
        let err = chain(&ConfigFile::parse(PathBuf::from("c.toml"), "port = \"eighty\"\n".into()).unwrap_err());
        assert!(err.starts_with("config file c.toml: ") && err.contains("expected u16"), "{err}");
    }

    #[test]
    fn a_flag_beats_the_file_which_beats_the_default() {
        let f =
            file("port = 9000\nhost = \"0.0.0.0\"\nslots = 2\ncache_mib = 7\nno_auth = true\ndefault_model = \"x\"\n");
        let flags = Flags::try_parse_from(["llmr", "--port", "9001", "--cache-mib", "0", "-m", "a,b"]).unwrap();
        let serve = f.merge(&flags.serve).unwrap();
        let node = f.merge(&flags.node).unwrap();
        assert_eq!((serve.port, serve.host.as_deref()), (Some(9001), Some("0.0.0.0")));
        assert_eq!(serve.models, Some(vec!["a".to_string(), "b".to_string()]));
        assert!(serve.no_auth, "a switch left off does not turn the file's off");
        assert_eq!(serve.default_model.as_deref(), Some("x"));
        assert_eq!((node.slots, node.cache_mib, node.queue_limit), (Some(2), Some(0), None));
        let config = node.node_config().unwrap();
        assert_eq!((config.slots, config.cache_bytes, config.queue_limit), (2, Some(0), 64));
        assert_eq!(config.gpu_modality_gate, GateMode::Auto);
        let gated = Flags::try_parse_from(["llmr", "--gpu-modality-gate", "on"]).unwrap();
        assert_eq!(gated.node.node_config().unwrap().gpu_modality_gate, GateMode::On);
        let bad = Flags::try_parse_from(["llmr", "--gpu-modality-gate", "maybe"]).unwrap();
        let err = bad.node.node_config().unwrap_err().to_string();
        assert!(err.contains("--gpu-modality-gate") && err.contains("`maybe`"), "{err}");
        assert_eq!(config.body_limit, 16 << 20);
        let EngineIsolation::Worker { command, watchdog } = &config.engine_isolation else {
            panic!("plugins run in worker processes unless told otherwise: {:?}", config.engine_isolation)
        };
        assert_eq!((command.args.as_slice(), *watchdog), (&["engine-worker".to_string()][..], Some(DEFAULT_WATCHDOG)));
        let inline = Flags::try_parse_from(["llmr", "--engine-isolation", "in-process"]).unwrap();
        assert_eq!(inline.node.node_config().unwrap().engine_isolation, EngineIsolation::InProcess);
        let no_watchdog = Flags::try_parse_from(["llmr", "--engine-watchdog-secs", "0"]).unwrap();
        let config = no_watchdog.node.node_config().unwrap();
        assert!(matches!(config.engine_isolation, EngineIsolation::Worker { watchdog: None, .. }));
        assert_eq!(config.engine_restart, RestartPolicy::default(), "no periodic restart unless asked");
        let restart =
            Flags::try_parse_from(["llmr", "--engine-restart-hours", "0.5", "--engine-restart-requests", "1000"])
                .unwrap();
        assert_eq!(
            restart.node.node_config().unwrap().engine_restart,
            RestartPolicy { after: Some(Duration::from_secs(1800)), after_requests: Some(1000) }
        );
        let bad = Flags::try_parse_from(["llmr", "--engine-restart-hours=-1"]).unwrap();
        assert!(bad.node.node_config().unwrap_err().to_string().contains("--engine-restart-hours"));
        let bad = Flags::try_parse_from(["llmr", "--engine-isolation", "thread"]).unwrap();
        let err = bad.node.node_config().unwrap_err().to_string();
        assert!(err.contains("--engine-isolation") && err.contains("`thread`"), "{err}");

        let none = ConfigFile::default().merge(&Flags::try_parse_from(["llmr"]).unwrap().serve).unwrap();
        assert_eq!((none.port, none.no_auth, none.models), (None, false, None));
    }

    #[test]
    fn units_are_converted_once() {
        let node = NodeSettings {
            memory_budget_mib: Some(3),
            cache_mib: Some(2),
            body_limit_mib: Some(1),
            ctx_size: Some(512),
            ..NodeSettings::default()
        };
        let config = node.node_config().unwrap();
        assert_eq!(
            (config.memory_budget, config.cache_bytes, config.body_limit),
            (Some(3 << 20), Some(2 << 20), 1 << 20)
        );
        assert_eq!(config.context_length, 512);
    }

    #[test]
    fn a_public_address_needs_a_key_or_no_auth() {
        assert!(matches!(check_exposure("0.0.0.0", None, false), Err(Error::Exposed { .. })));
        assert!(check_exposure("0.0.0.0", Some("k"), false).is_ok());
        assert!(check_exposure("0.0.0.0", None, true).is_ok());
        assert!(check_exposure("localhost", None, false).is_ok());
    }
}
