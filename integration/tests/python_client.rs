//! The Python client (`integration/python`) against a real shim: a private containerd runs a
//! busybox container under the Belayer runtime, and the package's unittest suite — its pure
//! client logic and `test_real_shim.py`, which checkpoints, restores, forks, reads the journal and
//! status and sends hints through the control socket — runs against it.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use belayer_integration::containerd::run;
use belayer_integration::{Containerd, Flavor, prereq};
use common::*;

const CONTAINER: &str = "pyclient";

/// The real-shim tests that must have run and passed (a suite that skipped or lost one fails).
const REAL_SHIM_TESTS: &[&str] = &[
    "test_checkpoint_list_inspect_then_restore_undoes_a_change",
    "test_journal_records_execs",
    "test_status",
    "test_hints_are_accepted_and_an_unknown_one_is_refused",
    "test_missing_checkpoint_is_not_found",
    "test_delete_checkpoint_and_the_base_is_a_conflict",
    "test_fork_two_running_containers",
    "test_fork_of_a_missing_checkpoint_is_a_cli_error",
    "test_missing_container_is_shim_unavailable",
    "test_non_root_is_permission_denied",
];

#[test]
fn python_client_against_a_real_shim() {
    let python = prereq::require_bin("python3");
    let c = Containerd::start(Flavor::V2);
    run_detached(&c, BELAYER, CONTAINER, &["sleep", "100000"]);

    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    let belayer = prereq::bin_dir().join("belayer");
    assert!(
        belayer.is_file(),
        "prerequisite missing: {} (build it: cargo build --release -p belayer-cli)",
        belayer.display()
    );
    let mut cmd = Command::new(python);
    cmd.args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(package.join("tests"))
        .current_dir(&package)
        .env("PYTHONPATH", &package)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("BELAYER_TEST_NAMESPACE", &c.ns)
        .env("BELAYER_TEST_CONTAINER", CONTAINER)
        .env("CONTAINERD_ADDRESS", &c.sock)
        .env("BELAYER_BIN", &belayer)
        .env("BELAYER_STORE", &c.store);
    let out = run(&mut cmd, None, Duration::from_secs(540));
    // unittest reports on stderr.
    let report = format!("{}{}", out.stdout, out.stderr);
    println!("{report}");
    assert_eq!(
        out.code, 0,
        "the Python client's tests failed (their report is above)"
    );
    for name in REAL_SHIM_TESTS {
        assert!(
            report
                .lines()
                .any(|l| l.starts_with(&format!("{name} (test_real_shim.")) && l.ends_with(" ok")),
            "real-shim test {name} did not run and pass (report above)"
        );
    }
    assert!(
        !report.contains("skipped"),
        "a Python test skipped (report above)"
    );

    // The suite left the container running and removed its forks.
    assert_eq!(task_status(&c, CONTAINER), "RUNNING");
    assert_eq!(
        c.ctr(&["containers", "ls", "-q"]).stdout.trim(),
        CONTAINER,
        "the suite left containers behind"
    );
    remove(&c, CONTAINER);
}
