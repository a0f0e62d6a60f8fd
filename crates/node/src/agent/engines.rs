//! The node's plugin folders as a router sees them (`NodeRegistration::engines`, the router's
//! `GET /v0/engines`): each manifest, and whether this node loaded it or why not.

use llmr_cluster::EngineReport;
use llmr_engine_host::{FoundPlugin, PluginState};

/// One report per folder discovery found, in its order.
pub fn engine_reports(found: &[FoundPlugin]) -> Vec<EngineReport> {
    found.iter().map(engine_report).collect()
}

fn engine_report(found: &FoundPlugin) -> EngineReport {
    let folder = format!("{}/{}", found.folder_id(), found.folder_backend());
    let mut report = match &found.manifest {
        Some(m) => EngineReport {
            folder,
            id: m.id.clone(),
            version: m.version.to_string(),
            gpu_backends: m.gpu_backends.iter().map(|b| b.as_str().to_owned()).collect(),
            runtimes: m.runtimes.clone(),
            formats: m.formats.clone(),
            architectures: m.architectures.clone(),
            modalities: m.modalities.clone(),
            builtin: m.builtin,
            ..EngineReport::default()
        },
        None => EngineReport { folder, ..EngineReport::default() },
    };
    match &found.state {
        PluginState::Loaded(plugin) => {
            report.state = "loaded".into();
            report.abi = Some(format!("{}.{}", plugin.info.abi_major, plugin.info.abi_minor));
        }
        PluginState::Refused(reason) => {
            report.state = "refused".into();
            report.reason = Some(reason.clone());
        }
        PluginState::Skipped(reason) => {
            report.state = "skipped".into();
            report.reason = Some(reason.clone());
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_folder_is_reported_with_its_reason() {
        let found = FoundPlugin {
            dir: "/srv/engines/broken/cuda".into(),
            manifest: None,
            state: PluginState::Refused("Cannot read manifest: missing".into()),
        };
        let report = engine_report(&found);
        assert_eq!((report.folder.as_str(), report.state.as_str()), ("broken/cuda", "refused"));
        assert_eq!(report.reason.as_deref(), Some("Cannot read manifest: missing"));
        assert_eq!((report.id.as_str(), report.abi), ("", None));
    }
}
