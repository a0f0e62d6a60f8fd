//! What the node tells the router about its machine: host, OS, cores, memory, GPUs.

use crate::models::total_memory_bytes;
use llmr_cluster::{GpuInfo, MachineInfo};
use llmr_engine_host::{detect_gpu, GpuBackend};
use std::process::Command;

pub fn machine_info() -> MachineInfo {
    MachineInfo {
        hostname: hostname(),
        os: os_name(),
        cpu_cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        memory_total_bytes: total_memory_bytes().unwrap_or(0),
    }
}

/// The machine's host name (Linux: the kernel's; else `$HOSTNAME`, else `hostname`).
pub fn hostname() -> String {
    let from_kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    let from_env = || std::env::var("HOSTNAME").ok();
    let from_command = || {
        let out = Command::new("hostname").output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    from_kernel
        .or_else(from_env)
        .or_else(from_command)
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// `linux (Ubuntu 24.04 LTS)`: the OS family and, where `/etc/os-release` says, the distribution.
fn os_name() -> String {
    let pretty = std::fs::read_to_string("/etc/os-release").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("PRETTY_NAME="))?;
        Some(line["PRETTY_NAME=".len()..].trim_matches('"').to_string())
    });
    match pretty {
        Some(p) if !p.is_empty() => format!("{} ({p})", std::env::consts::OS),
        _ => std::env::consts::OS.to_string(),
    }
}

/// Whether GPU memory is worth asking for at each heartbeat (an NVIDIA driver is present).
pub fn has_nvidia_driver() -> bool {
    detect_gpu() == Some(GpuBackend::Cuda)
}

/// The GPUs with their memory: NVIDIA through `nvidia-smi`; an Apple GPU shares the machine's
/// memory (reported as its total, free unknown: 0). Blocking (runs a process): call it from
/// `spawn_blocking`.
pub fn gpus() -> Vec<GpuInfo> {
    match detect_gpu() {
        Some(GpuBackend::Cuda) => nvidia_gpus(),
        Some(GpuBackend::Metal) => vec![GpuInfo {
            name: "Apple GPU (Metal)".into(),
            memory_total_bytes: total_memory_bytes().unwrap_or(0),
            memory_free_bytes: 0,
        }],
        _ => Vec::new(),
    }
}

fn nvidia_gpus() -> Vec<GpuInfo> {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"])
        .output();
    match out {
        Ok(out) if out.status.success() => parse_nvidia_smi(&String::from_utf8_lossy(&out.stdout)),
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            tracing::warn!("nvidia-smi failed ({}): {}; reporting no GPU memory", out.status, err.trim());
            Vec::new()
        }
        Err(e) => {
            tracing::warn!("an NVIDIA driver is present but nvidia-smi cannot run ({e}); reporting no GPU memory");
            Vec::new()
        }
    }
}

/// `NAME, TOTAL_MIB, FREE_MIB` per line (`--format=csv,noheader,nounits`). Lines that do not
/// parse (`[N/A]` on some boards) are skipped.
fn parse_nvidia_smi(text: &str) -> Vec<GpuInfo> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.rsplitn(3, ',').map(str::trim);
            let free: u64 = fields.next()?.parse().ok()?;
            let total: u64 = fields.next()?.parse().ok()?;
            let name = fields.next()?.to_string();
            Some(GpuInfo { name, memory_total_bytes: total << 20, memory_free_bytes: free << 20 })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_lines_become_gpus_in_bytes() {
        let text = "NVIDIA H100 80GB HBM3, 81559, 81008\nNVIDIA A10, 23028, [N/A]\n\n";
        assert_eq!(
            parse_nvidia_smi(text),
            [GpuInfo {
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_total_bytes: 81559 << 20,
                memory_free_bytes: 81008 << 20
            }]
        );
    }

    #[test]
    fn this_machine_is_described() {
        let m = machine_info();
        assert!(!m.hostname.is_empty() && !m.os.is_empty() && m.cpu_cores >= 1);
    }
}
