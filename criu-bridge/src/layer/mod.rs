//! Filesystem layers: capture of an overlay upper dir's changes, mounting a chain, compaction.

mod at;
mod capture;
mod compact;
mod copy;
mod index;
mod mount;

pub use capture::{CaptureError, CaptureStats, capture_layer};
pub use compact::{CompactError, compact_layers};
pub use copy::CopyError;
pub use index::{IndexEntry, LayerIndex, UpperIdentity, decode_path, encode_path};
pub use mount::{MAX_LOWER_DIRS, MountError, mount_chain, overlay_options, unmount};
