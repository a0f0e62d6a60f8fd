#!/usr/bin/env bash
# Builds the native engine with `--features cuda` (no CUDA toolkit needed: cudarc opens the CUDA
# libraries at run time) and gathers what a GPU machine without Rust needs into DIR: the plugin,
# the integration-test binary, engine-bench, and the configs and tokenizers of the test models
# (their weights are made there by random_weights.py).
#   bench/cuda/stage.sh DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$1"
target="${CARGO_TARGET_DIR:-target}"
cargo build --release -p llmr-native-engine --features cuda
cargo build --release -p llmr-bench --bin engine-bench
test_exe=$(cargo test --release -p llmr-native-engine --features cuda --test it --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it" and m.get("executable"): print(m["executable"])')
rm -rf "$out" && mkdir -p "$out/release/deps" "$out/models"
# The test binary finds the plugin two folders up from itself (support.rs).
cp "$test_exe" "$out/release/deps/it"
cp "$target/release/libllmr_native_engine.so" "$target/release/engine-bench" "$out/release/"
strip "$out/release/deps/it" "$out/release/engine-bench" "$out/release/libllmr_native_engine.so"
cache="${LLMR_MODEL_CACHE:-$HOME/.cache/llmr/models}"
for m in smollm2-hf gemma3-hf qwen2.5-hf; do
  mkdir -p "$out/models/$m"
  cp "$cache/$m"/*.json "$out/models/$m/"
done
du -sh "$out"
