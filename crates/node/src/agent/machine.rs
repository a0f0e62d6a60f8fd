//! What the node tells the router about its machine: host, OS, cores, memory (its GPUs come
//! from the device inventory, `devices.rs`).

use crate::models::total_memory_bytes;
use llmr_cluster::MachineInfo;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_is_described() {
        let m = machine_info();
        assert!(!m.hostname.is_empty() && !m.os.is_empty() && m.cpu_cores >= 1);
    }
}
