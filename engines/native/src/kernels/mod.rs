//! CPU kernels of the forward pass (f32 compute over weights as stored on disk).

#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod linear;
pub mod mxfp4;
pub mod ops;
mod panel;
