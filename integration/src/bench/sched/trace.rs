//! The trace file format (JSON lines, version 1): what one agent episode looks like to the
//! scheduler, so that real episodes can be replayed. Specified in `scheduler/README.md`.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

/// The `format` value of a trace file's header line.
pub const FORMAT: &str = "belayer-sched-trace";
/// The only version this simulator reads.
pub const VERSION: u32 = 1;

/// The first line of a trace file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`].
    pub version: u32,
    /// Free text: where the trace came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// One action of one episode, and the idle time before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    /// Episode (one container) this action belongs to.
    pub episode: String,
    /// Offset of the episode's start on the node, seconds; read from its first line only and
    /// moved to [`Episode::start_s`] by [`read`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_s: Option<f64>,
    /// Idle time before this action: the model generating it (or the agent loop's own work).
    pub llm_s: f64,
    /// Duration of the action (the exec), seconds.
    pub action_s: f64,
    /// Memory the action dirtied, bytes.
    #[serde(default)]
    pub dirty_bytes: u64,
    /// Resident memory after the action, bytes; absent: unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_bytes: Option<u64>,
    /// Filesystem bytes the action changed.
    #[serde(default)]
    pub fs_bytes: u64,
    /// Expected generation time the agent loop announces with `llm-start`; absent: no hints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint_ms: Option<u64>,
}

/// One episode, its turns in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    /// Its name.
    pub id: String,
    /// Start offset on the node, seconds.
    pub start_s: f64,
    /// Its actions.
    pub turns: Vec<Turn>,
}

/// A trace file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Reading failed.
    #[error("cannot read trace")]
    Io(#[from] std::io::Error),
    /// The first line is not a version-1 header.
    #[error("line 1: not a {FORMAT} version {VERSION} header")]
    Header(#[source] Option<serde_json::Error>),
    /// A line is not a valid turn.
    #[error("line {line}: not a valid turn")]
    Turn {
        /// 1-based line number.
        line: usize,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A duration is negative or not finite.
    #[error("line {line}: llm_s, action_s and start_s must be finite and ≥ 0")]
    Value {
        /// 1-based line number.
        line: usize,
    },
}

/// Reads a trace; episodes in order of first appearance, blank lines and `#` comments skipped.
pub fn read(r: impl BufRead) -> Result<Vec<Episode>, TraceError> {
    let mut lines = r.lines().enumerate();
    let header = loop {
        match lines.next() {
            None => return Err(TraceError::Header(None)),
            Some((_, l)) => {
                let l = l?;
                if !skip(&l) {
                    break l;
                }
            }
        }
    };
    let h: Header = serde_json::from_str(&header).map_err(|e| TraceError::Header(Some(e)))?;
    if h.format != FORMAT || h.version != VERSION {
        return Err(TraceError::Header(None));
    }
    let mut episodes: Vec<Episode> = Vec::new();
    for (i, l) in lines {
        let l = l?;
        if skip(&l) {
            continue;
        }
        let line = i + 1;
        let mut t: Turn =
            serde_json::from_str(&l).map_err(|source| TraceError::Turn { line, source })?;
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        if !ok(t.llm_s) || !ok(t.action_s) || !t.start_s.is_none_or(ok) {
            return Err(TraceError::Value { line });
        }
        let start_s = t.start_s.take();
        match episodes.iter_mut().find(|e| e.id == t.episode) {
            Some(e) => e.turns.push(t),
            None => episodes.push(Episode {
                id: t.episode.clone(),
                start_s: start_s.unwrap_or(0.0),
                turns: vec![t],
            }),
        }
    }
    Ok(episodes)
}

fn skip(l: &str) -> bool {
    let l = l.trim();
    l.is_empty() || l.starts_with('#')
}

/// Writes episodes as a trace, one after another.
pub fn write(mut w: impl Write, source: &str, episodes: &[Episode]) -> std::io::Result<()> {
    let h = Header {
        format: FORMAT.into(),
        version: VERSION,
        source: Some(source.into()),
    };
    writeln!(w, "{}", serde_json::to_string(&h)?)?;
    for e in episodes {
        for (i, t) in e.turns.iter().enumerate() {
            let t = Turn {
                start_s: (i == 0).then_some(e.start_s),
                ..t.clone()
            };
            writeln!(w, "{}", serde_json::to_string(&t)?)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_interleaving() {
        let text = r#"{"format":"belayer-sched-trace","version":1}
# a comment
{"episode":"a","start_s":2.0,"llm_s":3.0,"action_s":1.0,"hint_ms":2500}
{"episode":"b","llm_s":1.0,"action_s":0.5,"dirty_bytes":100,"resident_bytes":1000,"fs_bytes":10}
{"episode":"a","llm_s":4.0,"action_s":2.0}
"#;
        let eps = read(text.as_bytes()).unwrap();
        assert_eq!(eps.len(), 2);
        assert_eq!(
            (eps[0].id.as_str(), eps[0].start_s, eps[0].turns.len()),
            ("a", 2.0, 2)
        );
        assert_eq!(eps[1].turns[0].resident_bytes, Some(1000));
        let mut out = Vec::new();
        write(&mut out, "test", &eps).unwrap();
        assert_eq!(read(out.as_slice()).unwrap(), eps);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(read("".as_bytes()), Err(TraceError::Header(None))));
        let v2 = r#"{"format":"belayer-sched-trace","version":2}"#;
        assert!(matches!(read(v2.as_bytes()), Err(TraceError::Header(None))));
        let neg = "{\"format\":\"belayer-sched-trace\",\"version\":1}\n{\"episode\":\"a\",\"llm_s\":-1,\"action_s\":1}";
        assert!(matches!(
            read(neg.as_bytes()),
            Err(TraceError::Value { line: 2 })
        ));
        let typo = "{\"format\":\"belayer-sched-trace\",\"version\":1}\n{\"episode\":\"a\",\"llm\":1,\"action_s\":1}";
        assert!(matches!(
            read(typo.as_bytes()),
            Err(TraceError::Turn { line: 2, .. })
        ));
    }
}
