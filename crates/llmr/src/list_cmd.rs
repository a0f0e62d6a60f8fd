//! `llmr list`: the models in the local store, as a table or (`--json`) as JSON.

use crate::pull_cmd::StoreArgs;
use anyhow::Result;
use clap::Args;
use indicatif::HumanBytes;
use llmr_model_store::ModelDescriptor;
use serde_json::{json, Value};
use std::io::Write;

#[derive(Args)]
pub struct ListArgs {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: StoreArgs,
}

pub fn run(args: ListArgs) -> Result<()> {
    let store = args.store.open()?;
    let mut models = store.list();
    models.sort_by(|a, b| a.name.cmp(&b.name));
    let out = if args.json {
        serde_json::to_string_pretty(&Value::Array(models.iter().map(to_json).collect()))? + "\n"
    } else if models.is_empty() {
        eprintln!(
            "no models in {} (add one with `llmr pull owner/repo:QUANT` or `llmr pull --file PATH`)",
            store.root().display()
        );
        return Ok(());
    } else {
        table(&models)
    };
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        // `llmr list | head` is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        result => Ok(result?),
    }
}

fn to_json(d: &ModelDescriptor) -> Value {
    json!({
        "name": d.name,
        "format": d.format.as_str(),
        "architecture": d.architecture,
        "quantization": d.quantization,
        "size_bytes": d.size_bytes,
        "capabilities": d.capabilities.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
        "context_length": d.context_length,
        "runtime": d.runtime,
        "primary_file": d.primary_file.display().to_string(),
    })
}

fn table(models: &[ModelDescriptor]) -> String {
    let header = ["NAME", "FORMAT", "ARCH", "QUANT", "SIZE", "CAPABILITIES"].map(String::from);
    let rows: Vec<[String; 6]> = std::iter::once(header)
        .chain(models.iter().map(|d| {
            [
                d.name.clone(),
                d.format.to_string(),
                d.architecture.clone(),
                d.quantization.clone().unwrap_or_else(|| "-".into()),
                HumanBytes(d.size_bytes).to_string(),
                d.capabilities.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(","),
            ]
        }))
        .collect();
    let widths: Vec<usize> = (0..6).map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out += cells.join("  ").trim_end();
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmr_model_store::ModelStore;
    use std::path::PathBuf;

    /// The real SmolLM2 from `scripts/fetch-models` (fails, never skips, when it is missing).
    fn smollm2() -> PathBuf {
        let cache = match std::env::var_os("LLMR_MODEL_CACHE") {
            Some(dir) => PathBuf::from(dir),
            None => PathBuf::from(std::env::var_os("HOME").expect("HOME is not set")).join(".cache/llmr/models"),
        };
        let path = cache.join("smollm2-135m-instruct-q4_1.gguf");
        assert!(path.is_file(), "{} is missing: run `scripts/fetch-models smollm2`", path.display());
        path
    }

    #[test]
    fn a_pulled_file_is_listed_with_its_columns() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ModelStore::open(tmp.path()).unwrap();
        store.import_file("org/smol", &smollm2()).unwrap();
        let models = store.list();
        let lines: Vec<String> = table(&models).lines().map(str::to_string).collect();
        assert_eq!(lines.len(), 2);
        let words: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(words, ["NAME", "FORMAT", "ARCH", "QUANT", "SIZE", "CAPABILITIES"]);
        let words: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(words, ["org/smol", "gguf", "llama", "Q4_1", "93.81", "MiB", "text"]);
        assert_eq!(lines[0].find("FORMAT"), lines[1].find("gguf"), "columns line up");

        let row = to_json(&models[0]);
        assert_eq!(row["name"], "org/smol");
        assert_eq!(row["quantization"], "Q4_1");
        assert_eq!(row["size_bytes"], 98_362_432);
        assert_eq!(row["capabilities"], json!(["text"]));
    }
}
