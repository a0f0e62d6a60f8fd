#!/usr/bin/env bash
# Builds llama.cpp's own benchmark tools (llama-bench, llama-batched-bench, llama-server) from the
# llama.cpp tree vendored in a pinned llama-cpp-python sdist, CPU only, with the cmake options that
# llama-cpp-sys-2 0.1.161 (what the llmr llama.cpp plugin links) uses, so that the two can be
# benchmarked side by side. See bench/reference/README.md.
#
# Everything (sdist, sources, build) lives in a cache outside the repo:
#   ${LLMR_REFERENCE_CACHE:-$HOME/.cache/llmr/reference}
# Nothing from llama.cpp is ever written into the repo.
#
# stdout, one per line (progress and build logs go to stderr / a log file):
#   llama-bench=PATH
#   llama-batched-bench=PATH
#   llama-server=PATH
#   version=bNNNNN-<commit>            llama.cpp build of the reference binaries
#   llama-cpp-python=X.Y.Z             the sdist it came from
#   ggml=X.Y.Z                         ggml version of the reference tree
#   sys-version=...                    what llama-cpp-sys-2 0.1.161 vendors (see README)
#
# Environment:
#   LLMR_REFERENCE_CACHE   cache directory (default $HOME/.cache/llmr/reference)
#   LLMR_REFERENCE_JOBS    make jobs (default 2)
#   LLMR_REFERENCE_VERBOSE=1  stream the cmake/make output to stderr instead of only the log file
#
# A second run with the binaries present only checks a stamp file and prints the lines above.
set -euo pipefail

# --- pins ------------------------------------------------------------------------------------
# Newest llama-cpp-python whose sdist `pip download --no-deps --no-binary :all:` fetches.
LCP_VERSION=0.3.36
LCP_SDIST=llama_cpp_python-${LCP_VERSION}.tar.gz
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# The llama.cpp commit that sdist's vendor/llama.cpp submodule is checked out at (recorded in the
# sdist as .git/modules/vendor/llama.cpp/HEAD; CHANGELOG.md "update llama.cpp to ...@0c1e57098").
# The sdist's clone is shallow (depth 1), so `git rev-list --count HEAD` - which is how llama.cpp's
# cmake/build-info.cmake derives LLAMA_BUILD_NUMBER - would say 1; the number below is upstream's
# release tag for that commit (b11312 = 0c1e57098), and both are passed to cmake explicitly.
LLAMA_COMMIT=0c1e57098bba43ac29e6e3b677cdceebdd22334f
LLAMA_BUILD_NUMBER=11312
# The crate whose build options are mirrored and whose vendored llama.cpp is reported.
SYS_CRATE=llama-cpp-sys-2
SYS_VERSION=0.1.161

TARGETS=(llama-bench llama-batched-bench llama-server)

# --- helpers ---------------------------------------------------------------------------------
die() {
    echo "bench/reference/build.sh: error: $*" >&2
    exit 1
}
note() { echo "bench/reference/build.sh: $*" >&2; }

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd "$SCRIPT_DIR/../.." && pwd -P)

CACHE=${LLMR_REFERENCE_CACHE:-$HOME/.cache/llmr/reference}
JOBS=${LLMR_REFERENCE_JOBS:-2}
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || die "LLMR_REFERENCE_JOBS must be a positive integer (got '$JOBS')"

CACHE=$(realpath -m -- "$CACHE") || die "cannot resolve the cache path '$CACHE'"
case "$CACHE/" in
    "$REPO_ROOT/"*) die "the cache ($CACHE) must be outside the repository ($REPO_ROOT)" ;;
esac
mkdir -p "$CACHE" || die "cannot create cache directory $CACHE"

WORK=$CACHE/llama-cpp-python-$LCP_VERSION
SRC=$WORK/llama.cpp
BUILD=$WORK/build
BIN=$BUILD/bin
STAMP=$BUILD/.llmr-reference-stamp
LOG=$BUILD/build.log

# --- what llama-cpp-sys-2 vendors --------------------------------------------------------------
# The crate ships llama.cpp without .git and without any version file; its own build therefore
# reports build number 0 / commit "unknown". What can be read from the tree: the ggml version,
# the llama-cpp-rs commit the crate was published from (.cargo_vcs_info.json), and
# LLAMA_SESSION_VERSION. Cheap (a few greps), so it is done on every run.
ggml_version_of() { # $1 = llama.cpp source dir
    local f=$1/ggml/CMakeLists.txt ma mi pa
    [[ -f $f ]] || { echo unknown; return; }
    ma=$(sed -n 's/^set(GGML_VERSION_MAJOR \([0-9]*\)).*/\1/p' "$f")
    mi=$(sed -n 's/^set(GGML_VERSION_MINOR \([0-9]*\)).*/\1/p' "$f")
    pa=$(sed -n 's/^set(GGML_VERSION_PATCH \([0-9]*\)).*/\1/p' "$f")
    echo "${ma:-?}.${mi:-?}.${pa:-?}"
}

sys_version() {
    local dir d vcs
    dir=
    for d in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"$SYS_CRATE-$SYS_VERSION"; do
        [[ -d $d/llama.cpp ]] && { dir=$d; break; }
    done
    if [[ -z $dir ]]; then
        echo "unknown ($SYS_CRATE $SYS_VERSION not in the cargo registry; run 'cargo fetch' first)"
        return
    fi
    vcs=$(sed -n 's/.*"sha1": *"\([0-9a-f]*\)".*/\1/p' "$dir/.cargo_vcs_info.json" 2>/dev/null | head -c 12)
    local sess
    sess=$(sed -n 's/^#define LLAMA_SESSION_VERSION \([0-9]*\).*/\1/p' "$dir/llama.cpp/include/llama.h" 2>/dev/null)
    echo "unrecorded ($SYS_CRATE $SYS_VERSION: ggml $(ggml_version_of "$dir/llama.cpp"), LLAMA_SESSION_VERSION ${sess:-?}, llama-cpp-rs commit ${vcs:-unknown}; the crate's llama.cpp tree has no .git or version file, its builds report build 0 / commit unknown)"
}

# --- cmake configuration (mirrors llama-cpp-sys-2 0.1.161 build.rs + the cmake crate) -----------
CC_BIN=$(command -v cc || true)
CXX_BIN=$(command -v c++ || true)
ARCH=$(uname -m)
# Flags the `cmake` crate (0.1.58, via cc 1.x) puts in CMAKE_{C,CXX,ASM}_FLAGS for the default
# x86_64-unknown-linux-gnu target (optimisation flags are left to CMAKE_BUILD_TYPE=Release).
case "$ARCH" in
    x86_64) BASE_FLAGS="-ffunction-sections -fdata-sections -fPIC -m64 -march=x86-64 -w" ;;
    *) BASE_FLAGS="-ffunction-sections -fdata-sections -fPIC -w" ;;
esac

CMAKE_ARGS=(
    -G "Unix Makefiles"
    -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_C_COMPILER=$CC_BIN"
    "-DCMAKE_CXX_COMPILER=$CXX_BIN"
    "-DCMAKE_C_FLAGS=$BASE_FLAGS"
    "-DCMAKE_CXX_FLAGS=$BASE_FLAGS"
    "-DCMAKE_ASM_FLAGS=$BASE_FLAGS"
    # build.rs: the rust target has no target-cpu=native, so GGML_NATIVE=OFF; ggml's defaults
    # then enable SSE4.2/AVX/AVX2/BMI2/FMA/F16C (no AVX512), as in the llmr build.
    -DGGML_NATIVE=OFF
    # llmr's plugin enables llama-cpp-2/openmp by default -> GGML_OPENMP=ON.
    -DGGML_OPENMP=ON
    -DGGML_WEBGPU=OFF
    -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_CURL=OFF
    -DLLAMA_BUILD_COMMON=ON
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_APP=OFF
    # Differences from the crate, needed for the tools (the crate builds only the libraries):
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON
    # No network at build time: do not fetch the prebuilt web UI from Hugging Face (or npm-build it).
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_BUILD_UI=OFF
    # Version info (the sdist has no usable git history, see the pins above).
    "-DLLAMA_BUILD_NUMBER=$LLAMA_BUILD_NUMBER"
    "-DLLAMA_BUILD_COMMIT=${LLAMA_COMMIT:0:9}"
)
if [[ $ARCH == aarch64 ]]; then
    CMAKE_ARGS+=(-DGGML_CPU_ARM_ARCH=armv8-a) # build.rs does this for non-native aarch64 Linux
fi

VERSION="b$LLAMA_BUILD_NUMBER-${LLAMA_COMMIT:0:9}"
STAMP_CONTENT=$(printf '%s\n' "sdist=$LCP_SDIST sha256=$LCP_SHA256" "version=$VERSION" "${CMAKE_ARGS[@]}")

print_result() {
    local t
    for t in "${TARGETS[@]}"; do
        echo "$t=$BIN/$t"
    done
    echo "version=$VERSION"
    echo "llama-cpp-python=$LCP_VERSION"
    echo "ggml=$(ggml_version_of "$SRC")"
    echo "sys-version=$(sys_version)"
}

binaries_present() {
    local t
    for t in "${TARGETS[@]}"; do
        [[ -x $BIN/$t ]] || return 1
    done
}

# --- fast path -----------------------------------------------------------------------------------
if [[ -f $STAMP ]] && binaries_present && [[ "$(cat "$STAMP")" == "$STAMP_CONTENT" ]]; then
    print_result
    exit 0
fi

# --- slow path: serialise concurrent runs ---------------------------------------------------------
exec 9>"$CACHE/.lock"
if command -v flock >/dev/null; then
    flock 9 || die "cannot lock $CACHE/.lock"
    # Another run may have finished the build while we waited.
    if [[ -f $STAMP ]] && binaries_present && [[ "$(cat "$STAMP")" == "$STAMP_CONTENT" ]]; then
        print_result
        exit 0
    fi
fi

# --- tools ---------------------------------------------------------------------------------------
if ! command -v cmake >/dev/null; then
    note "cmake is missing; installing it with apt-get"
    if [[ $(id -u) -eq 0 ]]; then
        apt-get install -y cmake >&2 || die "apt-get install -y cmake failed"
    else
        sudo apt-get install -y cmake >&2 || die "apt-get install -y cmake failed"
    fi
fi
for tool in make tar sha256sum python3; do
    command -v "$tool" >/dev/null || die "'$tool' is required but not installed"
done
[[ -n $CC_BIN && -n $CXX_BIN ]] || die "a C/C++ compiler ('cc' and 'c++') is required"

sha_ok() { [[ -f $1 ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$LCP_SHA256" ]]; }

# --- 1. the sdist ----------------------------------------------------------------------------------
SDIST=$CACHE/$LCP_SDIST
if ! sha_ok "$SDIST"; then
    if [[ -f $SDIST ]]; then
        note "cached $LCP_SDIST has the wrong sha256; downloading it again"
        rm -f "$SDIST"
    fi
    python3 -m pip --version >/dev/null 2>&1 || die "python3 -m pip is required to download the sdist"
    note "downloading llama-cpp-python==$LCP_VERSION (sdist) from PyPI"
    DL=$(mktemp -d "$CACHE/.download.XXXXXX")
    trap 'rm -rf "$DL"' EXIT
    if ! python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$LCP_VERSION" \
        -d "$DL" >&2; then
        die "pip download of llama-cpp-python==$LCP_VERSION failed"
    fi
    [[ -f $DL/$LCP_SDIST ]] || die "pip did not produce $LCP_SDIST (got: $(ls "$DL"))"
    got=$(sha256sum "$DL/$LCP_SDIST" | cut -d' ' -f1)
    [[ $got == "$LCP_SHA256" ]] ||
        die "sha256 mismatch for $LCP_SDIST: expected $LCP_SHA256, got $got"
    mv -f "$DL/$LCP_SDIST" "$SDIST"
    rm -rf "$DL"
    trap - EXIT
fi

# --- 2. extract vendor/llama.cpp -----------------------------------------------------------------
if [[ ! -f $WORK/.extracted ]] || [[ "$(cat "$WORK/.extracted")" != "$LCP_SHA256" ]]; then
    sha_ok "$SDIST" || die "sha256 mismatch for $SDIST"
    note "extracting vendor/llama.cpp from $LCP_SDIST"
    rm -rf "$SRC" "$BUILD" "$WORK/.extracted"
    mkdir -p "$WORK"
    X=$(mktemp -d "$WORK/.extract.XXXXXX")
    trap 'rm -rf "$X"' EXIT
    top=llama_cpp_python-$LCP_VERSION
    tar -xzf "$SDIST" -C "$X" "$top/vendor/llama.cpp" "$top/.git/modules/vendor/llama.cpp/HEAD" \
        "$top/CHANGELOG.md" || die "cannot extract vendor/llama.cpp from $SDIST"
    recorded=$(tr -d '[:space:]' <"$X/$top/.git/modules/vendor/llama.cpp/HEAD")
    [[ $recorded =~ ^[0-9a-f]{40}$ ]] ||
        die "the sdist does not record the vendored llama.cpp commit (.git/modules/vendor/llama.cpp/HEAD='$recorded')"
    [[ $recorded == "$LLAMA_COMMIT" ]] ||
        die "the sdist vendors llama.cpp $recorded, but the pins are for $LLAMA_COMMIT (b$LLAMA_BUILD_NUMBER); update LLAMA_COMMIT/LLAMA_BUILD_NUMBER"
    grep -q "llama.cpp@${LLAMA_COMMIT:0:9}" "$X/$top/CHANGELOG.md" ||
        note "warning: CHANGELOG.md does not mention llama.cpp@${LLAMA_COMMIT:0:9}"
    # The submodule's .git is a gitlink into the sdist's .git/modules, which is not extracted;
    # drop it so that nothing (cmake's build-info, git-vars) looks at a dangling git dir.
    rm -f "$X/$top/vendor/llama.cpp/.git"
    mv "$X/$top/vendor/llama.cpp" "$SRC"
    rm -rf "$X"
    trap - EXIT
    echo "$LCP_SHA256" >"$WORK/.extracted"
fi

# --- 3. configure and build ------------------------------------------------------------------------
mkdir -p "$BUILD"
rm -f "$STAMP"
if [[ -f $BUILD/CMakeCache.txt ]] && [[ "$(cat "$BUILD/.llmr-configured" 2>/dev/null)" != "$STAMP_CONTENT" ]]; then
    note "cmake options changed; reconfiguring from scratch"
    find "$BUILD" -mindepth 1 -delete
fi

run_logged() { # runs "$@" with output appended to $LOG (and to stderr when verbose)
    if [[ ${LLMR_REFERENCE_VERBOSE:-0} == 1 ]]; then
        "$@" 2>&1 | tee -a "$LOG" >&2
        return "${PIPESTATUS[0]}"
    else
        "$@" >>"$LOG" 2>&1
    fi
}
fail_with_log() {
    echo "---- last 40 lines of $LOG ----" >&2
    tail -n 40 "$LOG" >&2 || true
    die "$1"
}

: >"$LOG"
start=$(date +%s)
# SOURCE_DATE_EPOCH would flip ggml's GGML_NATIVE_DEFAULT and with it the AVX/AVX2/FMA/F16C
# defaults; cargo does not set it, so neither do we. GIT_CEILING_DIRECTORIES keeps cmake's git
# probes from walking up into an unrelated repository.
export GIT_CEILING_DIRECTORIES=$WORK
unset SOURCE_DATE_EPOCH CMAKE_BUILD_PARALLEL_LEVEL MAKEFLAGS

if [[ ! -f $BUILD/CMakeCache.txt ]]; then
    note "configuring llama.cpp $VERSION (log: $LOG)"
    run_logged nice -n 19 cmake -S "$SRC" -B "$BUILD" "${CMAKE_ARGS[@]}" ||
        fail_with_log "cmake configure failed"
    printf '%s\n' "$STAMP_CONTENT" >"$BUILD/.llmr-configured"
fi

note "building ${TARGETS[*]} with $JOBS jobs under nice (several minutes; log: $LOG)"
run_logged nice -n 19 cmake --build "$BUILD" --config Release -j "$JOBS" --target "${TARGETS[@]}" ||
    fail_with_log "build failed"
binaries_present || fail_with_log "build finished but not all of ${TARGETS[*]} are in $BIN"

# Sanity: the binaries report the version we configured.
v=$("$BIN/llama-bench" --version 2>&1 || true)
[[ $v == *"$LLAMA_BUILD_NUMBER"* ]] ||
    die "llama-bench --version does not report build $LLAMA_BUILD_NUMBER: $v"

printf '%s\n' "$STAMP_CONTENT" >"$STAMP"
note "built in $(($(date +%s) - start)) s"
print_result
