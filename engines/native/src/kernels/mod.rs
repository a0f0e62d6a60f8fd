//! CPU kernels of the forward pass (f32 compute over weights as stored on disk).

pub mod linear;
pub mod ops;
