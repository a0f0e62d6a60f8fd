#!/usr/bin/env bash
# Builds the native engine with `--features cuda` (no CUDA toolkit needed: cudarc opens the CUDA
# libraries at run time) and gathers what a GPU machine without Rust needs into DIR: the plugin,
# the integration-test binary, engine-bench, and the configs and tokenizers of the test models
# (their weights are made there by random_weights.py). With LLAMA_CPP=1, also llama.cpp's source
# tree (bench/reference/build.sh's, its other GPU backends left out) and skeletons of the F16
# GGUFs (random_gguf.py), for llama_cpp.sh there. A call carries 64 MiB: `tar cJf` the folder.
#   [LLAMA_CPP=1] bench/cuda/stage.sh DIR
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
if [ "${LLAMA_CPP:-0}" = 1 ]; then
  src="${LLMR_REFERENCE_CACHE:-$HOME/.cache/llmr/reference}/llama-cpp-python-0.3.36/llama.cpp"
  [ -f "$src/CMakeLists.txt" ] || { echo "stage.sh: no llama.cpp tree at $src: run bench/reference/build.sh first" >&2; exit 1; }
  others=(virtgpu cann openvino webgpu et metal hexagon sycl vulkan opencl zdnn musa zendnn)
  mkdir -p "$out/llama.cpp" "$out/skel"
  tar cf - -C "$src" --exclude=.git --exclude=tools/ui --exclude=tools/server/public "${others[@]/#/--exclude=ggml/src/ggml-}" \
    CMakeLists.txt cmake ggml src include common tools vendor app gguf-py LICENSE licenses | tar xf - -C "$out/llama.cpp"
  python="$cache/.venv/bin/python"  # scripts/fetch-models' own venv: numpy and gguf
  scripts/fetch-models smollm2-f16 gemma3-f16 >/dev/null
  for m in smollm2-135m-instruct gemma-3-270m; do
    PYTHONPATH="$out/llama.cpp/gguf-py" "$python" bench/cuda/random_gguf.py skeleton "$cache/$m-f16.gguf" "$out/skel/$m.skel.gguf"
  done
fi
du -sh "$out"
