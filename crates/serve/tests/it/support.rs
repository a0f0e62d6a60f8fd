//! An engines folder with the echo plugin, and echo models.

use llmr_model_store::ModelDescriptor;
use llmr_node::NodeConfig;
use llmr_serve::{CorsOrigins, ServeConfig};
use std::path::Path;

pub use llmr_testkit::echo_engines;

/// A GGUF with only `general.architecture = echo`, written to `path`, as the model `name`.
pub fn echo_model(path: &Path, name: &str) -> ModelDescriptor {
    std::fs::write(path, llmr_testkit::gguf_with_architecture("echo", 64)).unwrap();
    let mut desc = ModelDescriptor::from_gguf_file(path).unwrap();
    desc.name = name.to_owned();
    desc
}

/// `llmr serve` on 127.0.0.1 (a free port) serving one echo model `name`, everything under `dir`.
pub fn serve_config(dir: &Path, name: &str, delay_ms: u64) -> ServeConfig {
    let engines = echo_engines(&dir.join("engines"), delay_ms);
    let model = echo_model(&dir.join(format!("{name}.gguf")), name);
    ServeConfig {
        host: "127.0.0.1".into(),
        port: 0,
        api_key: None,
        no_auth: false,
        cors: CorsOrigins::Loopback,
        responses_retention: llmr_router::DEFAULT_RESPONSES_RETENTION,
        node: NodeConfig { engines_dir: engines, models: vec![model], cache_bytes: Some(0), ..NodeConfig::default() },
        store: dir.join("models"),
        scan_store: false,
        default_model: name.to_owned(),
        router_db: Some(dir.join("router.db")),
    }
}
