//! What every benchmark records beside its figures, and how it writes them: the machine and
//! its load at the start and the end, the commit, the date and the exact command; the files of
//! `--out` (results.json, table.md, plot.svg); and the last stdout line, one JSON object.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::{Value, json};

/// The first line `program args` prints (stdout, else stderr), or why it could not run.
pub fn first_line(program: &str, args: &[&str]) -> String {
    match Command::new(program).args(args).output() {
        Ok(o) => String::from_utf8_lossy(if o.stdout.is_empty() {
            &o.stderr
        } else {
            &o.stdout
        })
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string(),
        Err(e) => format!("{program}: {e}"),
    }
}

/// The 1-, 5- and 15-minute load averages (`/proc/loadavg`).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The commit the benchmark was built from, `+dirty` when tracked files differ from it.
pub fn git_commit() -> String {
    let repo = env!("CARGO_MANIFEST_DIR");
    let dirty = !first_line(
        "git",
        &["-C", repo, "status", "--porcelain", "--untracked-files=no"],
    )
    .is_empty();
    first_line("git", &["-C", repo, "rev-parse", "--short", "HEAD"])
        + if dirty { "+dirty" } else { "" }
}

/// The suites that drive containerd, runc or CRIU, and so run as root.
const ROOT: [&str; 8] = [
    "env",
    "auto",
    "gateway",
    "rollout",
    "chaos",
    "zdtm",
    "push",
    "openhands",
];

/// The command that reproduces a run of `suite`: `belayer-bench` and the arguments it was given.
pub fn command(suite: &str) -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sudo = if ROOT.contains(&suite) { "sudo " } else { "" };
    format!("{sudo}belayer-bench {}", args.join(" "))
}

/// A run's record: read when the benchmark starts (the tree and its HEAD may move while it
/// runs), completed when it ends.
pub struct Record {
    started: Instant,
    pub suite: &'static str,
    pub out: PathBuf,
    pub context: Value,
}

impl Record {
    /// Captures the context and creates `out`.
    pub fn start(suite: &'static str, out: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(out).map_err(|e| format!("create {}: {e}", out.display()))?;
        let context = json!({
            "suite": suite,
            "date_utc": first_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
            "git": git_commit(),
            "command": command(suite),
            "cpus": std::thread::available_parallelism().map_or(0, usize::from),
            "cpu": cpu_model(),
            "kernel": first_line("uname", &["-r"]),
            "load_average_start": loadavg(),
        });
        Ok(Self {
            started: Instant::now(),
            suite,
            out: out.to_path_buf(),
            context,
        })
    }

    /// Seconds since [`Record::start`].
    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The context with the load average at the end and the wall time.
    pub fn finish(&self) -> Value {
        let mut c = self.context.clone();
        c["load_average_end"] = json!(loadavg());
        c["wall_s"] = json!(self.elapsed_s().round());
        c
    }

    /// Writes `name` into the output directory.
    pub fn write(&self, name: &str, text: &str) -> Result<(), String> {
        let p = self.out.join(name);
        std::fs::write(&p, text).map_err(|e| format!("write {}: {e}", p.display()))
    }

    /// Writes `results.json` (`results` with the finished context), `table.md` (the table, the
    /// context and the command) and `plot.svg` when given; prints the table, where the files
    /// went and, last, `summary` with the context as one line of JSON.
    pub fn report(
        &self,
        table: &str,
        mut results: Value,
        plot: Option<String>,
        mut summary: Value,
    ) -> Result<(), String> {
        let context = self.finish();
        results["context"] = context.clone();
        let head = format!(
            "{} on {} (git {}), {} cores, load average {} → {}; {:.0} s\n\nReproduce: `{}`\n",
            self.suite,
            context["date_utc"].as_str().unwrap_or_default(),
            context["git"].as_str().unwrap_or_default(),
            context["cpus"],
            context["load_average_start"].as_str().unwrap_or_default(),
            context["load_average_end"].as_str().unwrap_or_default(),
            self.elapsed_s(),
            context["command"].as_str().unwrap_or_default(),
        );
        let md = format!("{table}\n{head}");
        self.write("table.md", &md)?;
        self.write(
            "results.json",
            &(serde_json::to_string_pretty(&results).unwrap_or_default() + "\n"),
        )?;
        let mut files = vec!["results.json", "table.md"];
        if let Some(svg) = plot {
            self.write("plot.svg", &svg)?;
            files.push("plot.svg");
        }
        println!("{md}");
        println!("Wrote {}/{{{}}}", self.out.display(), files.join(","));
        if summary.is_object() {
            summary["suite"] = json!(self.suite);
            summary["context"] = context;
        }
        println!("{summary}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_writes_files_and_context() {
        let dir = std::env::temp_dir().join(format!("bench-record-{}", std::process::id()));
        let r = Record::start("unit", &dir).unwrap();
        assert_eq!(r.context["suite"], "unit");
        assert!(r.context["load_average_start"].as_str().is_some());
        r.report(
            "| a |\n",
            json!({"x": 1}),
            Some("<svg/>".into()),
            json!({"y": 2}),
        )
        .unwrap();
        let results: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap())
                .unwrap();
        assert_eq!(results["x"], 1);
        assert!(results["context"]["wall_s"].is_number());
        assert!(dir.join("plot.svg").is_file());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
