//! `belayer inspect CONTAINER CHECKPOINT`: the checkpoint as JSON, read from the store.

use belayer_api::{CheckpointInfo, parse_checkpoint_id};

use super::{Context, print_pretty};
use crate::error::Result;

pub fn run(cx: &Context, container: &str, checkpoint: &str) -> Result<()> {
    let seq = parse_checkpoint_id(checkpoint)?;
    let cp = cx
        .store
        .load(&cx.namespace, container, seq)
        .map_err(|e| cx.not_found_or(container, e))?;
    print_pretty(&CheckpointInfo::from(&cp))
}
