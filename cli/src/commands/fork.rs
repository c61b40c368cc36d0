//! `belayer fork CONTAINER --checkpoint N [--count K]`: K new containers restored from the
//! checkpoint, each with its own writable layer; prints their ids.

use belayer_api::parse_checkpoint_id;

use super::Context;
use crate::error::Result;

pub fn run(cx: &Context, container: &str, checkpoint: &str, count: u32) -> Result<()> {
    let seq = parse_checkpoint_id(checkpoint)?;
    cx.store
        .load(&cx.namespace, container, seq)
        .map_err(|e| cx.not_found_or(container, e))?;
    for id in cx.containerd.fork(container, seq, count)? {
        println!("{id}");
    }
    Ok(())
}
