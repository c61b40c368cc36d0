//! `belayer restore CONTAINER [--checkpoint N] [--json]`: in place through the shim when the
//! container has a task, else as a new task that restores the checkpoint (default: the newest).
//! `--json` prints what was restored: in place, the shim's `RestoreInfo` (with its split of the
//! time); as a new task, `{"container", "checkpoint", "in_place": false}`.

use belayer_api::{RestoreInfo, RestoreRequest, parse_checkpoint_id};

use super::Context;
use crate::error::Result;

pub fn run(cx: &Context, container: &str, checkpoint: Option<&str>, json: bool) -> Result<()> {
    let seq = checkpoint.map(parse_checkpoint_id).transpose()?;
    let ctl = cx.control(container);
    if ctl.exists() {
        let info: RestoreInfo =
            ctl.call("POST", "restore", Some(&RestoreRequest { checkpoint: seq }))?;
        if json {
            println!("{}", serde_json::to_value(&info).unwrap_or_default());
        }
        return Ok(());
    }
    let seq = cx.checkpoint_or_newest(container, seq)?;
    cx.containerd.restore_task(container, seq)?;
    if json {
        let out = serde_json::json!({
            "container": container,
            "checkpoint": seq.to_string(),
            "in_place": false,
        });
        println!("{out}");
    }
    Ok(())
}
