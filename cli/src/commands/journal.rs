//! `belayer journal CONTAINER [--json]`: the action journal, one action a line.

use belayer_api::journal::Entry;

use super::Context;
use crate::error::{Error, Result};

pub fn run(cx: &Context, container: &str, json: bool) -> Result<()> {
    let ctl = cx.require_control(container)?;
    let entries: Vec<Entry> = ctl.call("GET", "journal", None::<&()>)?;
    for e in entries {
        if json {
            println!("{}", serde_json::to_string(&e).map_err(Error::Print)?);
        } else {
            println!("{}", line(&e));
        }
    }
    Ok(())
}

/// An entry as a tab-separated line.
fn line(e: &Entry) -> String {
    let code = e
        .exit_code
        .map_or("running".to_string(), |c| format!("exit={c}"));
    let after = e
        .after_checkpoint
        .map_or("-".to_string(), |c| c.to_string());
    let took = e.ended_unix_ms.map_or(String::new(), |end| {
        format!(" {}ms", end.saturating_sub(e.started_unix_ms))
    });
    format!(
        "{}\t{}\t{code}{took}\tafter-checkpoint={after}\tcwd={}\t{}",
        e.index,
        e.exec_id,
        e.cwd,
        e.args.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_one_tab_separated_line() {
        let mut e = Entry {
            index: 2,
            exec_id: "e2".into(),
            args: vec!["sh".into(), "-c".into(), "true".into()],
            cwd: "/".into(),
            env_sha256: String::new(),
            started_unix_ms: 1_000,
            ended_unix_ms: None,
            exit_code: None,
            after_checkpoint: None,
            spec: serde_json::Value::Null,
        };
        assert_eq!(
            line(&e),
            "2\te2\trunning\tafter-checkpoint=-\tcwd=/\tsh -c true"
        );
        e.ended_unix_ms = Some(1_250);
        e.exit_code = Some(0);
        e.after_checkpoint = Some(3);
        assert_eq!(
            line(&e),
            "2\te2\texit=0 250ms\tafter-checkpoint=3\tcwd=/\tsh -c true"
        );
    }
}
