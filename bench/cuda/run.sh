#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, CUDA's libraries and PyTorch + transformers, but no Rust: runs
# the native engine's GPU tests and benchmarks from what bench/cuda/stage.sh gathered, in the
# repository's root. Results go to OUT.
#   bench/cuda/run.sh STAGED OUT [BUILD_REPO]
# BUILD_REPO: the repository path the binaries were built in (the tests read goldens and
# manifests by it); default /work/main.
set -uo pipefail
staged=$(realpath "$1"); out=$(realpath -m "$2"); repo=${3:-/work/main}
mkdir -p "$out"
lib_dir() { dirname "$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name "$1" -print 2>/dev/null | head -1)"; }
export LD_LIBRARY_PATH="$(lib_dir 'libnvrtc.so*'):$(lib_dir 'libcublas.so*')${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
if [ "$(realpath -m "$repo")" != "$PWD" ]; then mkdir -p "$(dirname "$repo")" && ln -sfn "$PWD" "$repo"; fi
export LLMR_MODEL_CACHE=/tmp/llmr-models
for m in smollm2-hf gemma3-hf qwen2.5-hf; do
  [ -f "$LLMR_MODEL_CACHE/$m/model.safetensors" ] || python3 bench/cuda/random_weights.py "$staged/models/$m" "$LLMR_MODEL_CACHE/$m"
done
"$staged/release/deps/it" cuda:: --test-threads 1 --nocapture 2>&1 | tee "$out/tests.log"
plugin=/tmp/llmr-plugin/native/cuda
mkdir -p "$plugin" && cp engines/native/cuda/manifest.json "$staged/release/libllmr_native_engine.so" "$plugin/"
for m in ${BENCH_MODELS:-smollm2-hf gemma3-hf}; do
  "$staged/release/engine-bench" --plugin "$plugin" --model "$LLMR_MODEL_CACHE/$m" --pp 512 --tg 128 --reps 5 \
    --concurrency 1,4,16,64 --npp 32 --ntg 64 >"$out/native-$m.json" 2>"$out/native-$m.log"
  python3 bench/transformers_bench.py "$LLMR_MODEL_CACHE/$m" --device cuda --pp 512 --tg 128 --reps 5 >"$out/transformers-$m.json"
  echo "$m native: $(cat "$out/native-$m.json")"
  echo "$m transformers: $(cat "$out/transformers-$m.json")"
done
