//! CRIU-side pieces that runc does not cover: the version gate, feature probes,
//! `stats-dump`/`stats-restore` decoding, and picking the failure lines out of CRIU's logs.

pub mod images;
mod log;
pub mod privilege;
mod stats;
mod version;

pub use log::{CriuLog, error_lines};
pub use privilege::{PrivilegeError, check_restore_privilege};
pub use stats::{DumpStats, RestoreStats, StatsError, read_dump_stats, read_restore_stats};
pub use version::{
    CriuVersion, MIN_CRIU_VERSION, VersionError, check_criu, check_criu_with, parse_version,
};

/// Does `criu check --feature FEATURE` pass, that is, do this kernel and this CRIU both support
/// it? Blocks for one CRIU run (a few ms once CRIU's kernel-probe cache exists).
pub fn supports_feature(runc: &crate::runc::Runc, feature: &str) -> bool {
    let mut c = std::process::Command::new(&runc.criu);
    c.args(["check", "--feature", feature])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    runc.spawner.output(c).is_ok_and(|o| o.status.success())
}
