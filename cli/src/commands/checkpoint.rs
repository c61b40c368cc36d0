//! `belayer checkpoint CONTAINER [--exit]`: prints the new checkpoint's id.

use belayer_api::{CheckpointInfo, CheckpointRequest};

use super::Context;
use crate::error::Result;

pub fn run(cx: &Context, container: &str, exit: bool) -> Result<()> {
    let ctl = cx.require_control(container)?;
    let info: CheckpointInfo = ctl.call("POST", "checkpoint", Some(&CheckpointRequest { exit }))?;
    println!("{}", info.id);
    Ok(())
}
