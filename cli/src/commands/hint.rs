//! `belayer hint CONTAINER llm-start|llm-end [--expected-ms MS] [--expected-tokens N]`.

use belayer_api::HintRequest;

use super::Context;
use crate::error::Result;

pub fn run(cx: &Context, container: &str, hint: HintRequest) -> Result<()> {
    let ctl = cx.require_control(container)?;
    ctl.call::<serde_json::Value>("POST", "hint", Some(&hint))?;
    Ok(())
}
