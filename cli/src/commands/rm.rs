//! `belayer rm CONTAINER CHECKPOINT`: through the shim when the container has a task (it knows
//! which checkpoints its rootfs stacks on), else from the store directly.

use belayer_api::parse_checkpoint_id;

use super::Context;
use crate::error::Result;

pub fn run(cx: &Context, container: &str, checkpoint: &str) -> Result<()> {
    let seq = parse_checkpoint_id(checkpoint)?;
    let ctl = cx.control(container);
    if ctl.exists() {
        ctl.call::<serde_json::Value>("DELETE", &format!("checkpoints/{seq}"), None::<&()>)?;
    } else {
        cx.store
            .delete(&cx.namespace, container, seq)
            .map_err(|e| cx.not_found_or(container, e))?;
    }
    Ok(())
}
