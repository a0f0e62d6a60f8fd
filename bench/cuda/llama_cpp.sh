#!/usr/bin/env bash
# llama.cpp's CUDA backend beside the native engine on the GPU machine (no network there).
#   bench/cuda/llama_cpp.sh build SRC BUILD        llama-bench and llama-batched-bench, CUDA, sm_90
#   bench/cuda/llama_cpp.sh bench BUILD GGUF       the figures bench/cuda/run.sh takes of the plugin
# SRC: the llama.cpp tree of bench/reference/build.sh (the pinned llama-cpp-python sdist's
# vendor/llama.cpp, b11312), the backends other than CPU and CUDA left out to fit a call. GGUF: a
# model with random weights made there by random_gguf.py from a skeleton of the real F16 GGUF.
set -euo pipefail
case "${1:-}" in
build)
    src=$2 build=$3
    cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_BUILD_NUMBER=11312 -DLLAMA_BUILD_COMMIT=0c1e57098
    cmake --build "$build" -j "$(nproc)" --target llama-bench llama-batched-bench
    ;;
bench)
    build=$2 gguf=$3
    "$build/bin/llama-bench" -m "$gguf" -ngl 99 -p 512 -n 128 -r 5 -o json
    "$build/bin/llama-batched-bench" -m "$gguf" -ngl 99 -c 8192 -b 2048 -ub 512 -npp 32 -ntg 64 \
        -npl 1,4,16,64
    ;;
*)
    sed -n 2,7p "$0" >&2
    exit 2
    ;;
esac
