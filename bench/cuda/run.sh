#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, CUDA's libraries and PyTorch + transformers, but no Rust: runs
# the native engine's GPU tests and benchmarks from what bench/cuda/stage.sh gathered, in the
# repository's root. Results go to OUT: tests.log, bench.log and, with llama.cpp, llama-build.log.
#   bench/cuda/run.sh STAGED OUT [BUILD_REPO]
# STAGED/llama.cpp and STAGED/skel, when present (the source tree and GGUF skeletons, see
# llama_cpp.sh and random_gguf.py), add llama.cpp's CUDA backend on GGUFs of random weights;
# its build runs beside the tests and is over before any benchmark starts.
# TRANSFORMERS=0 leaves transformers out; TESTS=0 the GPU tests (a second run in one call).
# BENCH_ARGS: more engine-bench arguments (such as `--temperature 1` for sampled decoding).
# BASELINE=LIB: also a plugin library built earlier (the same command), benchmarked just before
# the staged one on each model.
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
if [ -d "$staged/llama.cpp" ]; then
  bench/cuda/llama_cpp.sh build "$staged/llama.cpp" /tmp/llama-cuda >"$out/llama-build.log" 2>&1 &
  llama_build=$!
fi
if [ "${TESTS:-1}" != 0 ]; then
  "$staged/release/deps/it" cuda:: --test-threads 1 --nocapture 2>&1 | tee "$out/tests.log"
fi
if [ -n "${llama_build:-}" ]; then
  wait "$llama_build" && echo "llama.cpp built" || echo "llama.cpp build failed: see llama-build.log"
fi
plugin=/tmp/llmr-plugin/native/cuda
mkdir -p "$plugin" && cp engines/native/cuda/manifest.json "$staged/release/libllmr_native_engine.so" "$plugin/"
if [ -n "${BASELINE:-}" ]; then
  baseline=/tmp/llmr-baseline/native/cuda
  mkdir -p "$baseline" && cp engines/native/cuda/manifest.json "$baseline/" && cp "$BASELINE" "$baseline/libllmr_native_engine.so"
fi
native_bench() {  # LABEL PLUGIN MODEL
  echo "== $3 $1 ${BENCH_ARGS:-}"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
  "$staged/release/engine-bench" --plugin "$2" --model "$LLMR_MODEL_CACHE/$3" --pp 512 --tg 128 --reps 5 \
    --concurrency 1,4,16,64 --npp 32 --ntg 64 ${BENCH_ARGS:-} 2>/tmp/native-$3.log || tail -20 /tmp/native-$3.log
}
declare -A skeleton=([smollm2-hf]=smollm2-135m-instruct [gemma3-hf]=gemma-3-270m)
for m in ${BENCH_MODELS:-smollm2-hf gemma3-hf}; do
  [ -n "${baseline:-}" ] && native_bench baseline "$baseline" "$m"
  native_bench native "$plugin" "$m"
  if [ "${TRANSFORMERS:-1}" != 0 ]; then
    echo "== $m transformers"
    python3 bench/transformers_bench.py "$LLMR_MODEL_CACHE/$m" --device cuda --pp 512 --tg 128 --reps 5
  fi
  skel="$staged/skel/${skeleton[$m]}.skel.gguf"
  if [ -x /tmp/llama-cuda/bin/llama-bench ] && [ -f "$skel" ]; then
    echo "== $m llama.cpp"
    gguf="$LLMR_MODEL_CACHE/$m.gguf"
    PYTHONPATH="$staged/llama.cpp/gguf-py" python3 bench/cuda/random_gguf.py fill "$skel" "$gguf"
    bench/cuda/llama_cpp.sh bench /tmp/llama-cuda "$gguf" 2>&1 | grep -v "^llama_\|^load\|^print_info\|^ggml_\|^\.\.\." 
  fi
done 2>&1 | tee "$out/bench.log"
