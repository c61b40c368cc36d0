//! Failure tests with real processes: a broker, a primary worker and a pre-started shadow running
//! SmolLM2-135M. Each compares the final tokens with a failure-free run of the same requests
//! (mixed greedy and seeded sampling, prompts of 200–231 tokens).

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use gpu_broker::worker::jobs::Results;

const JOBS: &[&str] = &[
    "--requests",
    "4",
    "--prompt-len",
    "200",
    "--max-new",
    "24",
    "--mode",
    "mixed",
];
const LONG: Duration = Duration::from_secs(240);

fn baseline() -> &'static Results {
    static B: OnceLock<Results> = OnceLock::new();
    B.get_or_init(|| {
        let d = Dir::new("baseline");
        let _b = broker(&d.0, &[]);
        let mut p = worker(&d.0, "primary", "base.json", JOBS, &[]);
        assert_eq!(
            p.wait_exit(LONG),
            0,
            "baseline worker failed: {}",
            p.stderr_text()
        );
        let r = results(&d.0, "base.json");
        assert_eq!(r.requests.len(), 4);
        assert!(r.requests.iter().all(|(_, t)| t.len() == 24));
        r
    })
}

#[test]
fn sigkilled_primary_is_replaced_by_shadow_with_identical_tokens() {
    let base = baseline();
    let d = Dir::new("kill");
    let _b = broker(&d.0, &[]);
    let p = worker(&d.0, "primary", "p.json", JOBS, &[]);
    let mut s = worker(&d.0, "shadow", "s.json", JOBS, &[]);
    s.wait_event("shadow_ready", LONG);
    wait_generated(&d.0, 1, 6, LONG);
    p.signal(libc::SIGKILL);
    assert_eq!(s.wait_exit(LONG), 0, "shadow failed: {}", s.stderr_text());
    assert_eq!(
        &results(&d.0, "s.json"),
        base,
        "tokens after takeover differ from the failure-free run"
    );
    let g = s.event("granted").unwrap();
    assert_eq!(g["takeover"], true);
    assert_eq!(g["weights_ok"], true);
    assert!(
        s.event("cold_load").is_none(),
        "the shadow must reuse the broker's weights"
    );
    let r = s.event("rebuilt").unwrap();
    assert_eq!(r["requests"], 4);
    assert!(r["tokens"].as_u64().unwrap() >= 4 * 206);
    let st = status(&d.0);
    assert_eq!(st.takeovers, 1);
    assert_eq!(st.weights_refused, 0);
}

#[test]
fn stopped_primary_is_fenced_and_its_stale_commits_are_refused() {
    let base = baseline();
    let d = Dir::new("zombie");
    let _b = broker(&d.0, &["--lease-ms", "1500"]);
    let mut p = worker(&d.0, "primary", "p.json", JOBS, &[]);
    let mut s = worker(&d.0, "shadow", "s.json", JOBS, &[]);
    s.wait_event("shadow_ready", LONG);
    wait_generated(&d.0, 1, 4, LONG);
    p.signal(libc::SIGSTOP);
    // The lease expires; the broker fences the stopped primary and promotes the shadow.
    s.wait_event("granted", LONG);
    assert_eq!(status(&d.0).takeovers, 1);
    p.signal(libc::SIGCONT);
    let code = p.wait_exit(LONG);
    assert_eq!(code, 75, "the zombie must be refused: {}", p.stderr_text());
    assert!(p.stderr_text().contains("stale"), "{}", p.stderr_text());
    assert_eq!(s.wait_exit(LONG), 0, "shadow failed: {}", s.stderr_text());
    assert_eq!(&results(&d.0, "s.json"), base);
}

#[test]
fn corrupted_weights_are_refused_and_the_successor_cold_loads() {
    let base = baseline();
    let d = Dir::new("corrupt");
    // Unsealed weights so a buggy worker can scribble on them; the checksum must catch it.
    let _b = broker(&d.0, &["--no-seal-weights"]);
    let mut p = worker(&d.0, "primary", "p.json", JOBS, &["--scribble-after", "3"]);
    let mut s = worker(&d.0, "shadow", "s.json", JOBS, &[]);
    s.wait_event("shadow_ready", LONG);
    let e = p.wait_event("scribbled", LONG);
    assert_eq!(e["ok"], true, "{e}");
    p.signal(libc::SIGKILL);
    assert_eq!(s.wait_exit(LONG), 0, "shadow failed: {}", s.stderr_text());
    assert_eq!(s.event("granted").unwrap()["weights_ok"], false);
    assert!(
        s.event("cold_load").is_some(),
        "the successor must cold load"
    );
    assert_eq!(&results(&d.0, "s.json"), base);
    assert_eq!(status(&d.0).weights_refused, 1);
}

#[test]
fn sealed_weights_cannot_be_scribbled_on() {
    model();
    let d = Dir::new("sealed");
    let _b = broker(&d.0, &[]);
    let mut p = worker(
        &d.0,
        "primary",
        "p.json",
        &["--requests", "1", "--prompt-len", "8", "--max-new", "4"],
        &["--scribble-after", "1"],
    );
    let e = p.wait_event("scribbled", LONG);
    assert_eq!(
        e["ok"], false,
        "a write-sealed region must refuse a writable mapping: {e}"
    );
}

#[test]
fn restarted_broker_gives_workers_a_clear_error() {
    model();
    let d = Dir::new("restart");
    let b = broker(&d.0, &[]);
    let mut p = worker(
        &d.0,
        "primary",
        "p.json",
        &["--requests", "2", "--prompt-len", "16", "--max-new", "2000"],
        &[],
    );
    wait_generated(&d.0, 1, 2, LONG);
    drop(b); // SIGKILL
    let _b2 = broker(&d.0, &[]);
    let code = p.wait_exit(LONG);
    let err = p.stderr_text();
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("broker restarted"), "{err}");
    assert!(err.contains("token log are gone"), "{err}");
}
