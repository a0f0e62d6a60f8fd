//! Repeated load/unload must not leak file descriptors or memory. A test binary of its own:
//! RSS is per process, so no other test may allocate beside it.

#[path = "it/support.rs"]
mod support;
use llmr_engine_host::{load_one, EngineInstance, EngineRegistry, InferParams, InstanceConfig, Manifest};
use support::*;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// dlopen, create, load a model, generate, unload, destroy, dlclose.
fn cycle(dir: &std::path::Path, model: &std::path::Path) {
    let mut registry = EngineRegistry::new();
    let plugin = load_one(dir, Manifest::load(dir, 1).unwrap(), &mut registry).unwrap();
    let engine = EngineInstance::create(&plugin, &InstanceConfig::default()).unwrap();
    load_as_m(&engine, model);
    let res = engine.infer(&InferParams::greedy(1, "m", "one two three four"), |_| true).unwrap();
    assert_eq!(res.completion_tokens, 4);
    engine.unload_model("m").unwrap();
    drop(engine);
    drop(registry);
    assert_eq!(std::sync::Arc::strong_count(&plugin), 1, "nothing else holds the library");
}

#[test]
fn a_hundred_load_unload_cycles_do_not_leak() {
    let root = tempfile::tempdir().unwrap();
    let build = tempfile::tempdir().unwrap();
    let c_lib = build_c_template(build.path(), &[]);
    let dirs = [install_echo(root.path()), install(root.path(), "c_echo", "cpu", &c_template_manifest(), Some(&c_lib))];
    let model = dummy_model(root.path());
    for dir in &dirs {
        // Warm up: the first cycle maps the library and grows allocator arenas.
        for _ in 0..5 {
            cycle(dir, &model);
        }
        let (fds_before, rss_before) = (open_fds(), rss_kib());
        for i in 0..400 {
            cycle(dir, &model);
            if i % 50 == 0 {
                eprintln!(
                    "{} cycle {i}: RSS {} KiB, maps {}",
                    dir.display(),
                    rss_kib(),
                    std::fs::read_to_string("/proc/self/maps")
                        .unwrap()
                        .lines()
                        .filter(|l| l.contains(".so") && l.contains("tmp"))
                        .count()
                );
            }
        }
        let (fds_after, rss_after) = (open_fds(), rss_kib());
        eprintln!("{}: fds {fds_before} -> {fds_after}, RSS {rss_before} -> {rss_after} KiB", dir.display());
        assert_eq!(fds_after, fds_before, "file descriptors leaked");
        assert!(rss_after <= rss_before + 2048, "RSS grew by {} KiB over 100 cycles", rss_after - rss_before);
    }
}
