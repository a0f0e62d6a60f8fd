//! Multi-GPU placement (spec 003): a model of a GPU plugin is loaded on the GPU with the most
//! free memory, checked before the load; with `--gpu-replicas N` on up to N GPUs, one copy on
//! each, which requests take in turn (`CatalogEntry::live_replica`).
//!
//! A GPU's free memory is the smaller of what its driver reports now and its total less what
//! the node's models on it hold (the footprint estimate of each), less the memory promised to
//! loads in progress (`Reservations`, so two loads at once do not both take the same room).
//! When no GPU has room for a model with no copy loaded, idle models on GPUs are unloaded least
//! recently used first, as the host's budget does. A model larger than any one GPU is left to
//! the engine, which spreads it over several (llama.cpp's default split).

use super::ModelManager;
use crate::devices::Device;
use crate::error::NodeError;
use llmr_engine_host::{GpuBackend, Plugin};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// GPU memory promised to loads in progress, by device ordinal.
#[derive(Default)]
pub(super) struct Reservations(Arc<Mutex<HashMap<u32, u64>>>);

impl Reservations {
    fn of(&self, device: u32) -> u64 {
        self.0.lock().unwrap().get(&device).copied().unwrap_or(0)
    }

    fn reserve(&self, device: &Device, bytes: u64) -> Placement {
        *self.0.lock().unwrap().entry(device.index).or_default() += bytes;
        Placement { device: device.clone(), bytes, reservations: self.0.clone() }
    }
}

/// A GPU chosen for one load; its memory stays promised until this is dropped (the load ended
/// and the model counts as placed there, or it failed).
pub(super) struct Placement {
    pub device: Device,
    bytes: u64,
    reservations: Arc<Mutex<HashMap<u32, u64>>>,
}

impl Drop for Placement {
    fn drop(&mut self) {
        if let Some(held) = self.reservations.lock().unwrap().get_mut(&self.device.index) {
            *held = held.saturating_sub(self.bytes);
        }
    }
}

impl ModelManager {
    /// Where to load the missing copies of `model` run by `plugin`: `None` for one on the host
    /// (a CPU plugin, or no GPU to read), else a GPU each, the ones with the most free memory
    /// first, none of them in `taken` (a GPU holds one copy). Empty when no copy is missing, or
    /// when none fits and `have` copies serve already.
    pub(super) fn place(
        &self,
        plugin: &Plugin,
        model: &str,
        footprint: u64,
        have: usize,
        taken: &[u32],
    ) -> Result<Vec<Option<Placement>>, NodeError> {
        let on_gpu = self.policy.devices.has_devices() && plugin.manifest.gpu_backends[0] != GpuBackend::Cpu;
        if !on_gpu {
            return Ok(if have == 0 { vec![None] } else { Vec::new() });
        }
        let wanted = (self.policy.replicas.max(1) as usize).saturating_sub(have);
        if wanted == 0 {
            return Ok(Vec::new());
        }
        // Memory this call freed by unloading, which the driver may not report yet.
        let mut freed: HashMap<u32, u64> = HashMap::new();
        loop {
            let devices = self.policy.devices.devices();
            if devices.is_empty() {
                // The driver said nothing (nvidia-smi failed): the engine picks its device.
                return Ok(if have == 0 { vec![None] } else { Vec::new() });
            }
            let mut room: Vec<(Device, u64)> = devices
                .into_iter()
                .filter(|d| !taken.contains(&d.index))
                .map(|d| {
                    let free = self.device_free(&d, freed.get(&d.index).copied().unwrap_or(0));
                    (d, free)
                })
                .collect();
            room.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.index.cmp(&b.0.index)));
            let chosen: Vec<Option<Placement>> = room
                .iter()
                .filter(|(_, free)| *free >= footprint)
                .take(wanted)
                .map(|(d, _)| Some(self.reserved.reserve(d, footprint)))
                .collect();
            if !chosen.is_empty() || have > 0 {
                return Ok(chosen);
            }
            // Bigger than any one GPU: the engine spreads it over several (llama.cpp splits
            // its layers), which the node cannot place better.
            if room.iter().all(|(d, _)| d.memory_total_bytes < footprint) {
                tracing::info!(model, needed_mib = footprint >> 20, "larger than any one GPU: the engine spreads it");
                return Ok(vec![None]);
            }
            let Some((device, bytes)) = self.unload_idle_on_gpu() else {
                return Err(NodeError::NoDeviceMemory {
                    model: model.to_owned(),
                    needed_mib: footprint >> 20,
                    free_mib: room.first().map_or(0, |(_, free)| free >> 20),
                });
            };
            *freed.entry(device).or_default() += bytes;
        }
    }

    /// Bytes free on `device` for another model (see the module's comment), `freed` bytes
    /// having just been unloaded from it.
    fn device_free(&self, device: &Device, freed: u64) -> u64 {
        let ours: u64 = self.loaded().iter().filter(|m| m.device == Some(device.index)).map(|m| m.footprint).sum();
        let by_accounts = device.memory_total_bytes.saturating_sub(ours);
        let by_driver = if device.memory_free_bytes > 0 { device.memory_free_bytes + freed } else { by_accounts };
        by_accounts.min(by_driver).saturating_sub(self.reserved.of(device.index))
    }

    /// Unloads the least recently used idle copy of a model on a GPU; returns its GPU and the
    /// bytes it held, if there was one.
    fn unload_idle_on_gpu(&self) -> Option<(u32, u64)> {
        let m = self.unload_idle_where(|m| m.device.is_some())?;
        tracing::info!(model = %m.name, device = ?m.device, "unloaded (least recently used) to make room on a GPU");
        Some((m.device?, m.footprint))
    }

    /// The GPUs and their memory now, for the router (blocking: may run `nvidia-smi`).
    pub fn gpus(&self) -> Vec<llmr_cluster::GpuInfo> {
        self.policy.devices.devices().iter().map(Device::gpu_info).collect()
    }

    /// Where the node reads its GPUs.
    pub fn devices(&self) -> &crate::devices::DeviceInventory {
        &self.policy.devices
    }
}
