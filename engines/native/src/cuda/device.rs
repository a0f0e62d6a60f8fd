//! One GPU as the model sees it: its context and stream, the kernels of `kernels.cu` compiled
//! for it, cuBLAS, and device buffers addressed by raw pointers.
//!
//! Everything CUDA is loaded at run time (cudarc's dynamic loading): the driver, NVRTC and
//! cuBLAS libraries are looked up when a model is loaded onto a GPU, so the `cuda` feature
//! builds anywhere, and a machine without them gets an error, not a crash.

use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use cudarc::driver::{result as drv, sys as drv_sys, CudaContext, CudaFunction, CudaSlice, CudaStream};
use cudarc::driver::{DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no usable CUDA device: {0}")]
    Unavailable(String),
    #[error("out of GPU memory: {0}")]
    OutOfMemory(String),
    #[error("CUDA error: {0}")]
    Cuda(String),
}

pub(super) fn cuda(e: impl std::fmt::Debug) -> GpuError {
    GpuError::Cuda(format!("{e:?}"))
}

/// The element type of a buffer as the kernels number it (`dt`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    F32 = 0,
    Bf16 = 1,
    F16 = 2,
}

impl Elem {
    fn blas(self) -> blas_sys::cudaDataType {
        match self {
            Elem::F32 => blas_sys::cudaDataType::CUDA_R_32F,
            Elem::Bf16 => blas_sys::cudaDataType::CUDA_R_16BF,
            Elem::F16 => blas_sys::cudaDataType::CUDA_R_16F,
        }
    }
}

/// A row-major `rows x cols` matrix of `elem` on the device.
pub struct Matrix {
    pub buf: DevBuf,
    pub elem: Elem,
    pub rows: usize,
    pub cols: usize,
}

/// Device memory, freed on drop; kernels take its address.
pub struct DevBuf {
    _mem: CudaSlice<u8>,
    pub ptr: u64,
    pub bytes: usize,
}

pub struct Kernels {
    pub embed: CudaFunction,
    pub rms_norm: CudaFunction,
    pub add_bias: CudaFunction,
    pub add: CudaFunction,
    pub rope_store: CudaFunction,
    pub attention: CudaFunction,
    pub gated: CudaFunction,
    pub gather: CudaFunction,
    pub softcap: CudaFunction,
    /// The passes that pick ids on the device, in launch order (kernels.cu).
    pub pick: [CudaFunction; 6],
}

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    blas: CudaBlas,
    /// cuBLAS's scratch, given to it so that it never allocates while a step is captured.
    _workspace: DevBuf,
    pub k: Kernels,
    pub name: String,
}

/// cuBLAS workspace (what NVIDIA recommends for Hopper).
const BLAS_WORKSPACE: usize = 32 << 20;

const SOURCE: &str = include_str!("kernels.cu");

impl Gpu {
    /// Opens GPU `ordinal` and compiles the kernels for its architecture.
    pub fn open(ordinal: usize) -> Result<Self, GpuError> {
        // SAFETY: these only try to open the libraries (cudarc panics on first use otherwise).
        let (driver, nvrtc, cublas) = unsafe {
            (
                cudarc::driver::sys::is_culib_present(),
                cudarc::nvrtc::sys::is_culib_present(),
                cudarc::cublas::sys::is_culib_present(),
            )
        };
        for (present, lib) in
            [(driver, "the CUDA driver (libcuda)"), (nvrtc, "NVRTC (libnvrtc)"), (cublas, "cuBLAS (libcublas)")]
        {
            if !present {
                return Err(GpuError::Unavailable(format!(
                    "{lib} was not found; is CUDA installed (LD_LIBRARY_PATH)?"
                )));
            }
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| GpuError::Unavailable(format!("GPU {ordinal}: {e:?}")))?;
        // One stream orders everything: cudarc's per-buffer events would only add work.
        // SAFETY: no buffer exists yet, and every later operation runs on `stream`.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own: the legacy default stream cannot be captured into a graph.
        let stream = ctx.new_stream().map_err(cuda)?;
        let (major, minor) = ctx.compute_capability().map_err(cuda)?;
        let ptx = compile_ptx_with_opts(
            SOURCE,
            CompileOptions {
                options: vec![
                    format!("--gpu-architecture=compute_{major}{minor}"),
                    "--std=c++17".into(),
                    // kernels.cu checks its scratch layout against model.rs's size.
                    format!("-DPICK_SCRATCH_BYTES={}", super::model::PICK_SCRATCH_BYTES),
                ],
                ..Default::default()
            },
        )
        .map_err(|e| GpuError::Cuda(format!("compiling the kernels for compute capability {major}.{minor}: {e}")))?;
        let module = ctx.load_module(ptx).map_err(cuda)?;
        let f = |name: &str| module.load_function(name).map_err(cuda);
        let k = Kernels {
            embed: f("embed")?,
            rms_norm: f("rms_norm")?,
            add_bias: f("add_bias")?,
            add: f("add")?,
            rope_store: f("rope_store")?,
            attention: f("attention")?,
            gated: f("gated")?,
            gather: f("gather")?,
            softcap: f("softcap")?,
            pick: [
                f("pick_max")?,
                f("pick_coarse")?,
                f("pick_fine")?,
                f("pick_low")?,
                f("pick_weights")?,
                f("pick_choose")?,
            ],
        };
        let blas = CudaBlas::new(stream.clone()).map_err(cuda)?;
        let name = ctx.name().unwrap_or_else(|_| format!("GPU {ordinal}"));
        let workspace = alloc(&stream, BLAS_WORKSPACE)?;
        // SAFETY: the workspace outlives the handle (both live in `Gpu`; the handle is dropped
        // first, as fields drop in order) and is used only on this stream.
        let status =
            unsafe { blas_sys::cublasSetWorkspace_v2(*blas.handle(), workspace.ptr as *mut _, BLAS_WORKSPACE) };
        if status != blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(GpuError::Cuda(format!("cublasSetWorkspace: {status:?}")));
        }
        Ok(Gpu { ctx, stream, blas, _workspace: workspace, k, name })
    }

    /// Records what `enqueue` puts on the stream, without running it, as a graph to replay.
    /// Nothing may synchronize the stream meanwhile; on an error the capture is ended and
    /// dropped.
    pub fn capture(&self, enqueue: impl FnOnce() -> Result<(), GpuError>) -> Result<Graph, GpuError> {
        self.stream.begin_capture(drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(cuda)?;
        let queued = enqueue();
        let graph = self.stream.end_capture(drv_sys::CUgraphInstantiate_flags(0)).map_err(cuda);
        queued?;
        graph?.map(Graph).ok_or_else(|| GpuError::Cuda("the captured step is empty".into()))
    }

    /// `bytes` of zeroed device memory.
    pub fn alloc(&self, bytes: usize) -> Result<DevBuf, GpuError> {
        alloc(&self.stream, bytes)
    }

    /// A device copy of `data`.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<DevBuf, GpuError> {
        let buf = self.alloc(std::mem::size_of_val(data))?;
        self.write(&buf, data)?;
        Ok(buf)
    }

    /// Copies `data` to the start of `buf`.
    pub fn write<T: DeviceRepr>(&self, buf: &DevBuf, data: &[T]) -> Result<(), GpuError> {
        assert!(std::mem::size_of_val(data) <= buf.bytes);
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `buf` holds at least as many bytes; the copy is ordered on our stream and
        // `data` outlives it (the driver stages pageable memory before returning).
        unsafe { drv::memcpy_htod_async(buf.ptr, data, self.stream.cu_stream()) }.map_err(cuda)
    }

    /// Waits for the stream, then reads `out.len()` values from the start of `buf`.
    pub fn read<T: DeviceRepr>(&self, buf: &DevBuf, out: &mut [T]) -> Result<(), GpuError> {
        self.read_at(buf, 0, out)
    }

    /// Waits for the stream, then reads `out.len()` values from `buf`, starting `at` values in.
    pub fn read_at<T: DeviceRepr>(&self, buf: &DevBuf, at: usize, out: &mut [T]) -> Result<(), GpuError> {
        let offset = at * std::mem::size_of::<T>();
        assert!(offset + std::mem::size_of_val(out) <= buf.bytes);
        // SAFETY: as in `write`, from `offset` bytes in, which the assert keeps inside `buf`;
        // synchronizing makes the values final before returning.
        unsafe { drv::memcpy_dtoh_async(out, buf.ptr + offset as u64, self.stream.cu_stream()) }.map_err(cuda)?;
        self.stream.synchronize().map_err(cuda)
    }

    /// Launches `f` on `grid` blocks of `block` threads with `args` (pointers as u64).
    pub fn launch(&self, f: &CudaFunction, grid: (u32, u32), block: u32, args: &[Arg]) -> Result<(), GpuError> {
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::Ptr(v) | Arg::U64(v) => b.arg(v),
                Arg::I32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig { grid_dim: (grid.0, grid.1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: each kernel's arguments are given in its order and types by the callers in
        // model.rs, with buffers sized for the launch.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda)
    }

    /// One thread per element of `n`.
    pub fn launch_flat(&self, f: &CudaFunction, n: usize, args: &[Arg]) -> Result<(), GpuError> {
        self.launch(f, ((n as u32).div_ceil(256).max(1), 1), 256, args)
    }

    /// `y (n x rows, f32) = x (n x cols, in w's type) · wᵀ`.
    pub fn matmul(&self, w: &Matrix, x: u64, n: usize, y: u64) -> Result<(), GpuError> {
        let (rows, cols, elem) = (w.rows, w.cols, w.elem);
        let (alpha, beta) = (1f32, 0f32);
        // Column-major view: yᵀ (rows x n) = w (its memory is wᵀ, cols x rows, transposed) · xᵀ.
        // SAFETY: the buffers hold rows*cols, n*cols and n*rows elements (callers size them).
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                rows as i32,
                n as i32,
                cols as i32,
                (&alpha as *const f32).cast(),
                w.buf.ptr as *const _,
                elem.blas(),
                cols as i32,
                x as *const _,
                elem.blas(),
                cols as i32,
                (&beta as *const f32).cast(),
                y as *mut _,
                blas_sys::cudaDataType::CUDA_R_32F,
                rows as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(cuda)
    }
}

fn alloc(stream: &Arc<CudaStream>, bytes: usize) -> Result<DevBuf, GpuError> {
    let mem = stream.alloc_zeros::<u8>(bytes.max(1)).map_err(|e| {
        if format!("{e:?}").contains("OUT_OF_MEMORY") {
            GpuError::OutOfMemory(format!("{bytes} bytes"))
        } else {
            cuda(e)
        }
    })?;
    let ptr = mem.device_ptr(stream).0;
    Ok(DevBuf { _mem: mem, ptr, bytes })
}

/// A captured step, replayed on the stream it was captured from.
pub struct Graph(cudarc::driver::CudaGraph);

// SAFETY: a graph's executable may be launched from any thread with the context bound (the
// model binds it at the start of every step), and the model launches it only while holding
// the lock of its graph cache, never from two threads at once.
unsafe impl Send for Graph {}

impl Graph {
    pub fn launch(&self) -> Result<(), GpuError> {
        self.0.launch().map_err(cuda)
    }
}

/// A kernel argument.
pub enum Arg {
    /// A device address (0: null).
    Ptr(u64),
    U64(u64),
    I32(i32),
    F32(f32),
}
