//! `belayer restore CONTAINER [--checkpoint N]`: in place through the shim when the container
//! has a task, else as a new task that restores the checkpoint (default: the newest).

use belayer_api::{RestoreInfo, RestoreRequest, parse_checkpoint_id};

use super::Context;
use crate::error::{Error, Result};

pub fn run(cx: &Context, container: &str, checkpoint: Option<&str>) -> Result<()> {
    let seq = checkpoint.map(parse_checkpoint_id).transpose()?;
    let ctl = cx.control(container);
    if ctl.exists() {
        let _: RestoreInfo =
            ctl.call("POST", "restore", Some(&RestoreRequest { checkpoint: seq }))?;
        return Ok(());
    }
    let seq = match seq {
        Some(s) => s,
        None => *cx
            .list(container)?
            .last()
            .ok_or_else(|| Error::NoCheckpoints(container.to_string()))?,
    };
    cx.containerd.restore_task(container, seq)
}
