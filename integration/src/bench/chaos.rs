//! `belayer-bench chaos`: the seeded fault-injection soak ([`crate::chaos`]). N sandboxes with
//! automatic checkpoints and recovery run agent-like trajectories while a seeded schedule kills
//! inits and CRIU, races explicit requests against the automatic ones and corrupts checkpoints;
//! prints faults survived per kind, trajectories lost, recovery latency, frozen time, the seed
//! and the command that reproduces the run, and a JSON last line.

use std::time::Duration;

use serde_json::json;

use crate::bench::record::Record;
use crate::chaos::{self, Config, Kind};
use crate::{Containerd, Flavor};

/// `belayer-bench chaos`: needs root, containerd 2.x, runc, CRIU and the workspace's binaries.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Sandboxes side by side
    #[arg(long, default_value_t = 12)]
    pub sandboxes: usize,
    /// How long the trajectories run, minutes (fractions allowed)
    #[arg(long, default_value_t = 30.0)]
    pub minutes: f64,
    /// The schedule's seed [default: from the clock, printed]
    #[arg(long)]
    pub seed: Option<u64>,
    /// Fault kinds drawn, comma-separated [default: all: init-kill-gap, init-kill-action,
    /// init-kill-checkpoint, criu-kill-dump, race-checkpoint, race-restore, race-fork, race-rm,
    /// corrupt-newest, shim-kill, criu-kill-restore, init-kill-restore, lazy-pages-kill,
    /// containerd-restart, disk-full (with --store-mb), worker-kill (needs the reference model
    /// and the workspace's belayer-gpu-broker and belayer-worker)]
    #[arg(long, value_delimiter = ',', value_parser = kind)]
    pub kinds: Vec<Kind>,
    /// Probability that a turn carries a fault
    #[arg(long, default_value_t = 0.2)]
    pub rate: f64,
    /// Memory each sandbox's background process holds, MB
    #[arg(long, default_value_t = 32)]
    pub holder_mb: u32,
    /// Print every fault and what came of it
    #[arg(long)]
    pub events: bool,
    /// Keep the store on a private tmpfs of this many MB (its rootfs uppers on a second one),
    /// which `disk-full` fills and frees; without it `disk-full` is refused
    #[arg(long)]
    pub store_mb: Option<u64>,
    /// Then run the same trajectories under runc-v2 without faults, as long, on the same
    /// containerd, and print the overhead as a ratio
    #[arg(long)]
    pub baseline: bool,
    /// Every this-many-th sandbox has docker as its client (docker run --runtime
    /// io.containerd.belayer.v1, docker exec, on a dockerd over the same containerd); 0: none
    #[arg(long, default_value_t = 3)]
    pub docker_every: usize,
    #[command(flatten)]
    pub common: super::Common,
}

fn kind(s: &str) -> Result<Kind, String> {
    Kind::parse(s).ok_or(format!("unknown kind {s:?}"))
}

impl Args {
    /// The soak's configuration, with the command that reproduces it.
    pub fn config(&self) -> Config {
        let seed = self.seed.unwrap_or_else(chaos::rng::fresh_seed);
        let mut cfg = Config::new(
            self.sandboxes,
            Duration::from_secs_f64(self.minutes * 60.0),
            seed,
        );
        if !self.kinds.is_empty() {
            cfg.schedule.kinds = self.kinds.clone();
        } else if self.store_mb.is_none() {
            // Every kind but the one that needs a private store filesystem.
            cfg.schedule.kinds.retain(|k| *k != Kind::DiskFull);
        }
        cfg.schedule.rate = self.rate;
        cfg.holder_mb = self.holder_mb;
        cfg.docker_every = self.docker_every;
        let bin_dir = std::env::var("BELAYER_BIN_DIR").unwrap_or_default();
        let kinds: Vec<&str> = cfg.schedule.kinds.iter().map(|k| k.name()).collect();
        cfg.command = format!(
            "{}belayer-bench chaos --sandboxes {} --minutes {} --seed {} --kinds {} --rate {} --holder-mb {} --docker-every {}",
            if bin_dir.is_empty() {
                String::new()
            } else {
                format!("BELAYER_BIN_DIR={bin_dir} ")
            },
            cfg.sandboxes,
            self.minutes,
            cfg.seed,
            kinds.join(","),
            cfg.schedule.rate,
            cfg.holder_mb,
            cfg.docker_every
        );
        if let Some(mb) = self.store_mb {
            cfg.command.push_str(&format!(" --store-mb {mb}"));
        }
        if self.baseline {
            cfg.command.push_str(" --baseline");
        }
        cfg
    }
}

/// Runs the soak; `Ok(false)` when it lost a trajectory or broke an invariant.
pub fn run(args: &Args) -> Result<bool, String> {
    let mut cfg = args.config();
    if cfg.schedule.kinds.contains(&Kind::DiskFull) && args.store_mb.is_none() {
        return Err(
            "disk-full fills the store's filesystem: give --store-mb (a private tmpfs)".into(),
        );
    }
    eprintln!("chaos: seed {} — reproduce with: {}", cfg.seed, cfg.command);
    // A soak of half an hour tests one build, whatever is built meanwhile.
    let bins = crate::bench::snapshot_bins(&["containerd-shim-belayer-v1", "belayer"])?;
    let rec = Record::start("chaos", &args.common.out("chaos"))?;
    // Dropped after the containerd (declared first): unmounted once nothing uses it.
    let disk = args.store_mb.map(StoreDisk::mount).transpose()?;
    cfg.store_fs = disk.as_ref().map(|d| d.root.clone());
    let c = Containerd::start_with_store(Flavor::V2, disk.as_ref().map(|d| d.root.join("store")));
    cfg.baseline = args.baseline;
    let report = chaos::run(&c, &cfg).map_err(|e| format!("{:#}", anyhow::Error::new(e)))?;
    if args.events {
        report.print_events();
    }
    let results = report.json();
    let mut summary = results.clone();
    // The detail stays in results.json; the last line keeps the figures.
    if let Some(o) = summary.as_object_mut() {
        o.remove("violations");
        o.remove("leaks");
        o.remove("over_retention");
    }
    summary["violations"] = json!(report.violations.len());
    summary["leaks"] = json!(report.leaks.len());
    summary["over_retention_checks"] = json!(report.over_retention.0);
    rec.report(&report.table(), results, Some(report.plot()), summary)?;
    drop(bins);
    Ok(report.passed())
}

/// The store's private filesystem: a tmpfs of `--store-mb` at `/tmp/belayer-chaos-<pid>`, and a
/// second one on its `store/uppers` (the restored rootfs uppers, where the sandboxes write), so
/// that filling the first denies checkpoints their space, not the sandboxes' own appends.
/// Unmounted when dropped.
struct StoreDisk {
    root: std::path::PathBuf,
}

impl StoreDisk {
    fn mount(mb: u64) -> Result<Self, String> {
        let root = std::path::PathBuf::from(format!("/tmp/belayer-chaos-{}", std::process::id()));
        let disk = Self { root };
        let uppers = disk.root.join("store/uppers");
        tmpfs(&disk.root, mb)?;
        std::fs::create_dir_all(&uppers).map_err(|e| format!("{}: {e}", uppers.display()))?;
        tmpfs(&uppers, mb)?;
        Ok(disk)
    }
}

fn tmpfs(dir: &std::path::Path, mb: u64) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={mb}m"), "tmpfs"])
        .arg(dir)
        .status()
        .map_err(|e| format!("mount: {e}"))?;
    if ok.success() {
        Ok(())
    } else {
        Err(format!("mount tmpfs at {}: {ok}", dir.display()))
    }
}

impl Drop for StoreDisk {
    fn drop(&mut self) {
        for dir in [self.root.join("store/uppers"), self.root.clone()] {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&dir)
                .status();
        }
        let _ = std::fs::remove_dir(&self.root);
    }
}
