//! CRIU-side pieces that runc does not cover: the version gate, `stats-dump`/`stats-restore`
//! decoding, and picking the failure lines out of CRIU's logs.

mod log;
mod stats;
mod version;

pub use log::{CriuLog, error_lines};
pub use stats::{DumpStats, RestoreStats, StatsError, read_dump_stats, read_restore_stats};
pub use version::{
    CriuVersion, MIN_CRIU_VERSION, VersionError, check_criu, check_criu_with, parse_version,
};
