//! `belayer checkpoints CONTAINER`: the container's checkpoint ids, oldest first, one a line.

use super::Context;
use crate::error::Result;

pub fn run(cx: &Context, container: &str) -> Result<()> {
    for seq in cx.list(container)? {
        println!("{seq}");
    }
    Ok(())
}
