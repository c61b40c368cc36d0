//! Worker events: one JSON object per stdout line, with a wall-clock timestamp so a supervisor
//! can time a takeover across processes.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Prints `{"event": name, "t": now, ...fields}` and flushes.
pub fn emit(name: &str, fields: serde_json::Value) {
    let mut v = serde_json::json!({ "event": name, "t": now(), "pid": std::process::id() });
    if let (Some(o), serde_json::Value::Object(f)) = (v.as_object_mut(), fields) {
        o.extend(f);
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}
