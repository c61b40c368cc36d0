//! `belayer status CONTAINER`: the shim's view of the container as JSON.

use super::{Context, print_pretty};
use crate::error::Result;

pub fn run(cx: &Context, container: &str) -> Result<()> {
    let ctl = cx.require_control(container)?;
    // Printed as the shim sent it: fields this CLI does not know yet are kept.
    let status: serde_json::Value = ctl.call("GET", "status", None::<&()>)?;
    print_pretty(&status)
}
