//! The node's GPUs and their memory (spec 003's multi-GPU placement reads them before every
//! load). A `DeviceInventory` is injectable: the node reads the machine's (NVIDIA through
//! `nvidia-smi`, an Apple GPU as one device sharing the machine's memory), and tests describe a
//! node with several devices.

use crate::models::total_memory_bytes;
use llmr_cluster::GpuInfo;
use llmr_engine_host::{detect_gpu, GpuBackend};
use std::process::Command;
use std::sync::Arc;

/// One GPU as the node sees it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// The driver's ordinal: what an engine instance is created with (`device_id`).
    pub index: u32,
    pub name: String,
    pub memory_total_bytes: u64,
    /// 0: unknown (an Apple GPU shares the machine's memory).
    pub memory_free_bytes: u64,
}

impl Device {
    pub fn gpu_info(&self) -> GpuInfo {
        GpuInfo {
            name: self.name.clone(),
            memory_total_bytes: self.memory_total_bytes,
            memory_free_bytes: self.memory_free_bytes,
        }
    }
}

/// Where the node reads its GPUs: the backend its plugins must be built for, and the devices
/// with their memory now (read before each placement; blocking, it may run a process).
#[derive(Clone)]
pub struct DeviceInventory {
    pub backend: Option<GpuBackend>,
    read: Arc<dyn Fn() -> Vec<Device> + Send + Sync>,
}

impl std::fmt::Debug for DeviceInventory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceInventory").field("backend", &self.backend).finish_non_exhaustive()
    }
}

impl DeviceInventory {
    /// This machine's GPUs.
    pub fn host() -> Self {
        let backend = detect_gpu();
        let read: Arc<dyn Fn() -> Vec<Device> + Send + Sync> = match backend {
            Some(GpuBackend::Cuda) => Arc::new(nvidia_devices),
            Some(GpuBackend::Metal) => Arc::new(|| {
                vec![Device {
                    index: 0,
                    name: "Apple GPU (Metal)".into(),
                    memory_total_bytes: total_memory_bytes().unwrap_or(0),
                    memory_free_bytes: 0,
                }]
            }),
            _ => Arc::new(Vec::new),
        };
        DeviceInventory { backend, read }
    }

    /// Devices described by `read` (tests: a node with several GPUs), for plugins of `backend`.
    pub fn new(backend: GpuBackend, read: impl Fn() -> Vec<Device> + Send + Sync + 'static) -> Self {
        DeviceInventory { backend: Some(backend), read: Arc::new(read) }
    }

    /// The devices and their memory now (blocking).
    pub fn devices(&self) -> Vec<Device> {
        (self.read)()
    }

    /// Whether reading the devices tells anything (a node without a GPU skips it).
    pub fn has_devices(&self) -> bool {
        self.backend.is_some_and(|b| b != GpuBackend::Cpu)
    }
}

fn nvidia_devices() -> Vec<Device> {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=index,name,memory.total,memory.free", "--format=csv,noheader,nounits"])
        .output();
    match out {
        Ok(out) if out.status.success() => parse_nvidia_smi(&String::from_utf8_lossy(&out.stdout)),
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            tracing::warn!("nvidia-smi failed ({}): {}; reporting no GPU", out.status, err.trim());
            Vec::new()
        }
        Err(e) => {
            tracing::warn!("an NVIDIA driver is present but nvidia-smi cannot run ({e}); reporting no GPU");
            Vec::new()
        }
    }
}

/// `INDEX, NAME, TOTAL_MIB, FREE_MIB` per line (`--format=csv,noheader,nounits`). Lines that do
/// not parse (`[N/A]` on some boards) are skipped.
fn parse_nvidia_smi(text: &str) -> Vec<Device> {
    text.lines()
        .filter_map(|line| {
            let (index, rest) = line.split_once(',')?;
            let mut fields = rest.rsplitn(3, ',').map(str::trim);
            let free: u64 = fields.next()?.parse().ok()?;
            let total: u64 = fields.next()?.parse().ok()?;
            let name = fields.next()?.to_string();
            Some(Device {
                index: index.trim().parse().ok()?,
                name,
                memory_total_bytes: total << 20,
                memory_free_bytes: free << 20,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_lines_become_devices_in_bytes() {
        let text = "0, NVIDIA H100 80GB HBM3, 81559, 81008\n1, NVIDIA A10, 23028, [N/A]\n\n";
        assert_eq!(
            parse_nvidia_smi(text),
            [Device {
                index: 0,
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_total_bytes: 81559 << 20,
                memory_free_bytes: 81008 << 20
            }]
        );
    }
}
