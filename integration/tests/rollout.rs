//! End-to-end rollout with injected failures (the small version of `belayer-bench rollout`):
//! 2 sandboxes x 3 turns against the serving rollout worker, one sandbox init SIGKILLed and the
//! worker SIGKILLed. With Belayer every trajectory completes and each sandbox's final state is
//! exactly the one its actions produce; the shim recovered the killed sandbox and the shadow
//! worker took over without a cold load.

use belayer_integration::bench::rollout::{self, Mode, args::Args, faults};
use belayer_integration::{Containerd, Flavor, prereq};

#[test]
fn every_trajectory_survives_a_sandbox_kill_and_a_worker_kill() {
    let bin_dir = prereq::bin_dir();
    for b in ["belayer-gpu-broker", "belayer-worker"] {
        if !bin_dir.join(b).is_file() {
            prereq::missing(
                &format!("{}/{b}", bin_dir.display()),
                "cargo build --release --workspace --bins",
            );
        }
    }
    let model = gpu_broker::worker::model_path();
    if !model.is_file() {
        prereq::missing(
            &model.display().to_string(),
            "run gpu-broker/scripts/fetch-model",
        );
    }
    let args = Args {
        sandboxes: 2,
        turns: 3,
        seed: 5,
        sandbox_kills: 1,
        worker_kills: 1,
        max_new: 12,
        ..Args::default()
    };
    let sched = faults::schedule(args.seed, args.sandboxes, args.turns, 1, 1);
    let c = Containerd::start(Flavor::V2);
    let dir = std::env::temp_dir().join(format!("belayer-rollout-test-{}", std::process::id()));
    let r = rollout::run(&c, &bin_dir, &args, Mode::Belayer, &sched, &dir).expect("run");
    let _ = std::fs::remove_dir_all(&dir);
    for t in &r.trajectories {
        assert!(t.verified, "trajectory {} lost: {:?}", t.traj, t.lost);
        assert_eq!(t.turns_done, 3);
    }
    let killed = &r.trajectories[sched.sandbox[0].traj];
    assert_eq!(
        killed.recoveries.len(),
        1,
        "no recovery recorded: {killed:?}"
    );
    assert!(killed.recoveries[0].recovered_s.is_some(), "{killed:?}");
    assert_eq!(r.worker_failovers.len() + r.worker_kills_skipped, 1);
    for f in &r.worker_failovers {
        assert!(
            !f.cold_load,
            "the shadow must reuse the broker's weights: {f:?}"
        );
        assert!(f.takeover_s < 5.0, "{f:?}");
    }
}
