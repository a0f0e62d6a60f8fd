//! Which GPU backend this machine offers, by cheap checks that need no GPU library.

use crate::manifest::GpuBackend;

/// `Some(Cuda)` when an NVIDIA driver is present, `Some(Metal)` on Apple Silicon macOS,
/// `None` otherwise. `LLMR_GPU_BACKEND=cuda|metal|directml|cpu|none` overrides the detection.
pub fn detect_gpu() -> Option<GpuBackend> {
    if let Ok(forced) = std::env::var("LLMR_GPU_BACKEND") {
        return GpuBackend::parse(&forced).filter(|b| *b != GpuBackend::Cpu);
    }
    if cfg!(all(target_os = "macos", target_arch = "aarch64")) {
        return Some(GpuBackend::Metal);
    }
    if std::path::Path::new("/proc/driver/nvidia/version").exists() || std::path::Path::new("/dev/nvidiactl").exists() {
        return Some(GpuBackend::Cuda);
    }
    None
}
