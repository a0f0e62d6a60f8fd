//! The memory guard of spec 000: when the machine's memory in use passes 90%, idle models are
//! unloaded, least recently used first, one at a time (each unload ends a worker process, whose
//! memory the kernel takes back before the next reading), before the kernel's out-of-memory
//! killer picks a victim itself. A GPU past 90% (as its driver reports it) gets the same, for
//! the models on it. The node's supervisor runs it with the engine watchdog.

use crate::devices::Device;
use crate::models::ModelManager;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The share of memory in use past which idle models are unloaded (spec 000).
pub const MEMORY_HIGH_WATER: f64 = 0.9;

/// How long after an unload the guard waits before it reads memory again: the time a worker
/// takes to exit and give its memory back.
const SETTLE: Duration = Duration::from_secs(2);

/// A model's worker is restarted for memory at most this often.
const RESTART_SPACING: Duration = Duration::from_secs(600);

/// Where the guard reads the share of memory in use (0..1); `None`: unknown, nothing is done.
#[derive(Clone)]
pub struct MemoryProbe(pub Arc<dyn Fn() -> Option<f64> + Send + Sync>);

impl MemoryProbe {
    /// This machine's RAM: `1 - MemAvailable / MemTotal` from `/proc/meminfo`.
    pub fn host() -> MemoryProbe {
        MemoryProbe(Arc::new(host_memory_used))
    }

    fn read(&self) -> Option<f64> {
        (self.0)()
    }
}

impl std::fmt::Debug for MemoryProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemoryProbe")
    }
}

/// `1 - MemAvailable / MemTotal` (what the kernel could hand out without swapping, against all).
pub fn host_memory_used() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    let (total, available) = (field("MemTotal:")?, field("MemAvailable:")?);
    (total > 0.0).then(|| 1.0 - available / total)
}

/// The guard's state between supervisor ticks.
#[derive(Debug)]
pub struct MemoryGuard {
    probe: MemoryProbe,
    /// No decision before this (after an unload, or after a warning that nothing was idle).
    quiet_until: Instant,
    /// The same, per GPU ordinal.
    device_quiet_until: HashMap<u32, Instant>,
    /// Models whose worker the guard restarted, and when.
    restarted: HashMap<String, Instant>,
}

impl MemoryGuard {
    pub fn new(probe: MemoryProbe) -> Self {
        MemoryGuard {
            probe,
            quiet_until: Instant::now(),
            device_quiet_until: HashMap::new(),
            restarted: HashMap::new(),
        }
    }

    /// One look at the GPUs (`devices`, as their driver reported them just now); unloads at most
    /// one idle model per GPU past the high-water mark. Returns the models unloaded.
    pub fn check_devices(&mut self, models: &ModelManager, devices: &[Device]) -> Vec<String> {
        let mut unloaded = Vec::new();
        let now = Instant::now();
        for d in devices.iter().filter(|d| d.memory_total_bytes > 0 && d.memory_free_bytes > 0) {
            if self.device_quiet_until.get(&d.index).is_some_and(|t| now < *t) {
                continue;
            }
            let used = 1.0 - d.memory_free_bytes as f64 / d.memory_total_bytes as f64;
            if used <= MEMORY_HIGH_WATER {
                continue;
            }
            let percent = (used * 100.0).round();
            match models.unload_least_recently_used_on(d.index) {
                Some(name) => {
                    tracing::warn!(model = %name, gpu = d.index, "GPU memory {percent}% in use: unloaded the least recently used idle model on it");
                    metrics::counter!(crate::metrics::MEMORY_UNLOADS, "model" => name.clone()).increment(1);
                    self.device_quiet_until.insert(d.index, now + SETTLE);
                    unloaded.push(name);
                }
                None => {
                    tracing::warn!(gpu = d.index, "GPU memory {percent}% in use and no idle model on it to unload");
                    self.device_quiet_until.insert(d.index, now + Duration::from_secs(30));
                }
            }
        }
        unloaded
    }

    /// One look at memory; unloads at most one idle model, or with none idle restarts one
    /// worker. Returns the model unloaded or restarted.
    pub fn check(&mut self, models: &ModelManager) -> Option<String> {
        if Instant::now() < self.quiet_until {
            return None;
        }
        let used = self.probe.read()?;
        if used <= MEMORY_HIGH_WATER {
            return None;
        }
        let percent = (used * 100.0).round();
        match models.unload_least_recently_used() {
            Some(name) => {
                tracing::warn!(model = %name, "memory {percent}% in use: unloaded the least recently used idle model");
                metrics::counter!(crate::metrics::MEMORY_UNLOADS, "model" => name.clone()).increment(1);
                self.quiet_until = Instant::now() + SETTLE;
                Some(name)
            }
            None => {
                // Spec 000: still short with nothing idle, restart a worker (the largest; each
                // model at most once per `RESTART_SPACING`, since memory other processes hold
                // does not come back this way).
                let now = Instant::now();
                self.restarted.retain(|_, at| now.duration_since(*at) < RESTART_SPACING);
                let spared: Vec<String> = self.restarted.keys().cloned().collect();
                self.quiet_until = now + Duration::from_secs(30);
                match models.restart_largest_worker(&spared) {
                    Some((name, bytes)) => {
                        tracing::warn!(
                            model = %name,
                            resident_mib = bytes >> 20,
                            "memory {percent}% in use and no idle model to unload: restarting the largest engine worker once its requests finish"
                        );
                        metrics::counter!(crate::metrics::MEMORY_RESTARTS, "model" => name.clone()).increment(1);
                        self.restarted.insert(name.clone(), now);
                        Some(name)
                    }
                    None => {
                        tracing::warn!("memory {percent}% in use and no idle model to unload or worker to restart");
                        None
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machines_memory_reads_as_a_share() {
        let used = host_memory_used().expect("/proc/meminfo on Linux");
        assert!((0.0..=1.0).contains(&used), "{used}");
    }
}
