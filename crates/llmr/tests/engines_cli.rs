//! `llmr engines list` and `llmr engines check`, run as the real binary on real plugins.

#[path = "../../engine-host/tests/it/support.rs"]
#[allow(dead_code)]
mod support;

use std::process::Command;
use support::*;

fn llmr(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_llmr")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn list_shows_loaded_and_refused_plugins_with_reasons() {
    let root = tempfile::tempdir().unwrap();
    install_echo(root.path());
    install(root.path(), "ghost", "cpu", &echo_manifest(|m| m["id"] = "ghost".into()), None);
    let (ok, out) = llmr(&["engines", "list", "--dir", root.path().to_str().unwrap()]);
    assert!(ok, "{out}");
    let echo = out.lines().find(|l| l.starts_with("echo ")).expect(&out);
    assert!(
        echo.contains("0.1.0") && echo.contains("Echo") && echo.contains("gguf") && echo.ends_with("loaded"),
        "{echo}"
    );
    let ghost = out.lines().find(|l| l.starts_with("ghost ")).expect(&out);
    assert!(ghost.contains("refused: Binary not found:"), "{ghost}");

    let (ok, out) = llmr(&["engines", "list", "--dir", root.path().to_str().unwrap(), "--no-cpu"]);
    assert!(ok);
    assert!(out.contains("skipped: CPU plugins are not allowed on this node"), "{out}");
}

#[test]
fn check_passes_for_the_rust_sdk_plugin_and_the_c_template() {
    let root = tempfile::tempdir().unwrap();
    let build = tempfile::tempdir().unwrap();
    let c_lib = build_c_template(build.path(), &[]);
    let model = dummy_model(root.path());
    for dir in [install_echo(root.path()), install(root.path(), "c_echo", "cpu", &c_template_manifest(), Some(&c_lib))]
    {
        let (ok, out) = llmr(&["engines", "check", dir.to_str().unwrap(), "--model", model.to_str().unwrap()]);
        assert!(ok, "{out}");
        let last = out.lines().last().unwrap();
        assert!(last.ends_with(" passed, 0 failed, 2 skipped"), "{out}");
        // Only the optional capabilities of ABI minor 1, which neither echo engine claims, skip.
        let skipped: Vec<&str> = out.lines().filter(|l| l.starts_with("SKIP")).collect();
        assert!(
            skipped.len() == 2
                && skipped.iter().all(|l| {
                    (l.contains("infer: constrained output") || l.contains("infer: token-id prompt"))
                        && l.contains("does not report LLMR_CAP_")
                }),
            "{out}"
        );
        for check in [
            "infer: streaming",
            "infer: cancel from another thread",
            "unsupported calls",
            "bad arguments: NULL request",
        ] {
            assert!(out.lines().any(|l| l.starts_with("PASS") && l.contains(check)), "{check} missing:\n{out}");
        }
    }
}

#[test]
fn check_fails_loudly_on_a_broken_plugin() {
    let root = tempfile::tempdir().unwrap();
    let build = tempfile::tempdir().unwrap();
    let lib = build_c_template(build.path(), &["-DECHO_ABI_MAJOR=3"]);
    let dir = install(root.path(), "c_echo", "cpu", &c_template_manifest(), Some(&lib));
    let (ok, out) = llmr(&["engines", "check", dir.to_str().unwrap()]);
    assert!(!ok);
    assert!(out.contains("FAIL load") && out.contains("ABI version mismatch: expected 1, got 3"), "{out}");
    assert!(out.trim_end().ends_with("1 passed, 1 failed"), "{out}");
}
