//! Picking the lines that explain a CRIU failure out of `dump.log` / `restore.log`.

use std::fmt;
use std::path::PathBuf;

/// Lines CRIU logs as errors on this machine although nothing is wrong.
const HARMLESS: &[&str] = &["Can't setup RLIMIT_NOFILE"];

/// The relevant part of a CRIU log, carried by checkpoint and restore errors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CriuLog {
    /// The log file.
    pub path: PathBuf,
    /// Its error lines (and the last lines when there are none).
    pub lines: Vec<String>,
}

impl fmt::Display for CriuLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lines.is_empty() {
            return write!(f, "(no CRIU log at {})", self.path.display());
        }
        write!(f, "{}: {}", self.path.display(), self.lines.join(" | "))
    }
}

impl CriuLog {
    /// Reads `path` and keeps its relevant lines; a missing log gives no lines.
    pub fn read(path: PathBuf) -> Self {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        Self {
            lines: error_lines(&text, 12),
            path,
        }
    }
}

/// The `Error (...)` lines of a CRIU log (without the harmless ones), at most `max`; when there
/// are none, the last `max.min(3)` lines.
pub fn error_lines(log: &str, max: usize) -> Vec<String> {
    let errors: Vec<String> = log
        .lines()
        .filter(|l| l.contains("Error (") || l.contains("Error:"))
        .filter(|l| !HARMLESS.iter().any(|h| l.contains(h)))
        .map(|l| l.trim().to_string())
        .collect();
    if !errors.is_empty() {
        let skip = errors.len().saturating_sub(max);
        return errors.into_iter().skip(skip).collect();
    }
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(max.min(3))..]
        .iter()
        .map(|l| l.trim().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_real_errors_and_drops_the_rlimit_noise() {
        let log = "(00.01) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n\
                   (00.02) Dumping path for 3 fd via self 11 [/tmp/x]\n\
                   (00.03) Error (criu/sk-inet.c:123): inet: Can't dump socket 7\n\
                   (00.04) Error (criu/cr-dump.c:2000): Dumping FAILED.\n";
        let lines = error_lines(log, 10);
        assert_eq!(lines.len(), 2);
        assert!(lines[0].contains("Can't dump socket"));
    }

    #[test]
    fn falls_back_to_the_tail() {
        let lines = error_lines("a\nb\nc\nd\n", 10);
        assert_eq!(lines, ["b", "c", "d"]);
    }
}
