//! The CUDA backend (cargo feature `cuda`): the dense architectures' forward pass on one NVIDIA
//! GPU, under the same scheduler, block tables and prefix sharing as the CPU path.

mod device;
mod model;

pub use device::GpuError;
pub use model::{CudaModel, LoadError};
