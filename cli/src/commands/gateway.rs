//! `belayer gateway --listen ADDR --upstream URL [--map KEY=CONTAINER]...`: serves until killed.

use std::net::SocketAddr;

use super::Context;
use crate::error::Result;
use crate::gateway::{self, Config, Limits};

pub fn run(
    cx: &Context,
    listen: SocketAddr,
    upstream: String,
    maps: Vec<(String, String)>,
    limits: Limits,
) -> Result<()> {
    gateway::run(Config {
        listen,
        upstream,
        maps,
        namespace: cx.namespace.clone(),
        limits,
    })?;
    Ok(())
}
