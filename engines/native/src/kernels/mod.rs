//! CPU kernels of the forward pass (f32 compute over weights as stored on disk).

#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod linear;
pub mod mxfp4;
pub mod ops;
pub(crate) mod panel;

/// Whether the AVX2 + FMA + F16C kernels can run on this CPU (the answer is cached by the
/// standard library).
pub(crate) fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}
