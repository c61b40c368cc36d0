//! The rollout worker group the `worker-kill` fault hits: one broker, a serving primary and a
//! pre-started shadow (`bench::rollout::workers`), beside the sandboxes. An injection sends one
//! small greedy request, SIGKILLs the primary once it has generated a few tokens, and checks the
//! shadow's takeover: the request completes with exactly the tokens an unkilled run gave at
//! start-up, generation resumes within [`TAKEOVER_LIMIT`], and a fresh shadow is up for the next.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpu_broker::client::Client;
use gpu_broker::wire::Role;
use gpu_broker::worker::serve::protocol::{GenClient, GenRequest};

use crate::bench::rollout::workers::Workers;

/// Prompt tokens of the request (small: the group shares the cores with the sandboxes).
const PROMPT: usize = 16;
/// Tokens the request generates.
const MAX_NEW: u32 = 48;
/// Tokens generated before the primary is killed.
const KILL_AFTER: usize = 4;
/// Kill → generating again beyond this is a violation.
pub const TAKEOVER_LIMIT: Duration = Duration::from_secs(60);
/// How long one request may take in all (takeover included).
const REQUEST_LIMIT: Duration = Duration::from_secs(180);

/// Why the group could not be started: the run fails with it rather than skip the kind.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "worker-kill needs the reference model {0}, which is missing: run \
         gpu-broker/scripts/fetch-model (scripts/setup does)"
    )]
    MissingModel(PathBuf),
    #[error("worker-kill needs {0}, which is missing: cargo build --release --workspace")]
    MissingBin(PathBuf),
    #[error("the rollout worker group did not start in {dir}: {why}")]
    Start { dir: PathBuf, why: String },
    #[error("the rollout worker group's unkilled reference request failed: {0}")]
    Reference(#[source] gpu_broker::worker::serve::protocol::ServeError),
}

/// What one injection came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Injection {
    /// Taken over in time with the expected tokens; the detail says how fast.
    Survived { detail: String, takeover_ms: u64 },
    /// The request had finished before the kill landed.
    Missed(String),
    /// The tokens differ, the takeover was too slow, or a step failed: what differed.
    Violated(String),
}

/// The prompt of every request: fixed, so greedy decoding gives the same tokens each time.
pub fn prompt() -> Vec<u32> {
    (0..PROMPT as u32).map(|i| 100 + 37 * i).collect()
}

/// The outcome of an injection from what was seen: whether the request was still in flight at
/// the kill, the takeover's kill → generating-again time, and the tokens it ended with.
pub fn judge(
    in_flight: bool,
    takeover: Duration,
    got: &[u32],
    expected: &[u32],
) -> Result<(), String> {
    if got != expected {
        let at = got
            .iter()
            .zip(expected)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(expected.len()));
        return Err(format!(
            "the request's tokens differ from the unkilled run's at token {at} of {} (got {} \
             tokens: …{:?}, expected …{:?})",
            expected.len(),
            got.len(),
            &got[at.min(got.len())..(at + 4).min(got.len())],
            &expected[at.min(expected.len())..(at + 4).min(expected.len())],
        ));
    }
    if in_flight && takeover > TAKEOVER_LIMIT {
        return Err(format!(
            "the shadow generated again {:.1} s after the kill, over {TAKEOVER_LIMIT:?}",
            takeover.as_secs_f64()
        ));
    }
    Ok(())
}

/// Broker + serving primary + pre-started shadow; one injection at a time.
pub struct Group {
    workers: Mutex<Option<Workers>>,
    dir: PathBuf,
    /// The tokens of the unkilled reference request.
    expected: Vec<u32>,
    next_id: AtomicU64,
    /// How long the group took to start (reference request included).
    pub started_in: Duration,
}

impl Group {
    /// Starts the group in `dir` and runs the reference request once, unkilled.
    pub fn start(dir: &Path) -> Result<Self, StartError> {
        let t = Instant::now();
        let model = gpu_broker::worker::model_path();
        if !model.is_file() {
            return Err(StartError::MissingModel(model));
        }
        // The binaries under test, from where the soak's shim and CLI come.
        let bin_dir = crate::prereq::bin_dir();
        for name in ["belayer-gpu-broker", "belayer-worker"] {
            let bin = bin_dir.join(name);
            if !bin.is_file() {
                return Err(StartError::MissingBin(bin));
            }
        }
        let _ = std::fs::remove_dir_all(dir);
        let max_seq = PROMPT + MAX_NEW as usize + 16;
        let workers =
            Workers::start(dir, &bin_dir, true, 1, max_seq).map_err(|why| StartError::Start {
                dir: dir.to_path_buf(),
                why,
            })?;
        let client = GenClient::new(&workers.serve_path(), REQUEST_LIMIT);
        let expected = client
            .generate(&request(0))
            .map_err(StartError::Reference)?
            .reply
            .tokens;
        Ok(Self {
            workers: Mutex::new(Some(workers)),
            dir: dir.to_path_buf(),
            expected,
            next_id: AtomicU64::new(1),
            started_in: t.elapsed(),
        })
    }

    /// Sends a request, SIGKILLs the primary once the request has [`KILL_AFTER`] tokens, and
    /// checks the takeover; then a fresh shadow is up. Waits for an injection in flight.
    pub fn inject(&self) -> Injection {
        let mut guard = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let Some(w) = guard.as_mut() else {
            return Injection::Violated("the rollout worker group is stopped".into());
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let client = GenClient::new(&w.serve_path(), REQUEST_LIMIT);
        let broker = self.dir.join("broker.sock");
        std::thread::scope(|s| {
            let sent = s.spawn(|| client.generate(&request(id)));
            let before = match wait_generated(&broker, id, KILL_AFTER) {
                Ok(b) => b,
                Err(e) => {
                    return Injection::Violated(format!(
                        "request {id} did not reach {KILL_AFTER} tokens: {e}"
                    ));
                }
            };
            let failover = w.kill_primary(gpu_broker::worker::events::now());
            let reply = sent.join();
            let f = match failover {
                Ok(f) => f,
                Err(e) => return Injection::Violated(format!("the takeover failed: {e}")),
            };
            let got = match reply {
                Ok(Ok(g)) => g.reply.tokens,
                Ok(Err(e)) => return Injection::Violated(format!("request {id}: {e}")),
                Err(_) => return Injection::Violated(format!("request {id}: client panicked")),
            };
            let in_flight = !before.finished && f.rebuild_requests > 0;
            let takeover = Duration::from_secs_f64(f.ready_s.max(0.0));
            if let Err(e) = judge(in_flight, takeover, &got, &self.expected) {
                return Injection::Violated(e);
            }
            if !in_flight {
                return Injection::Missed(format!(
                    "request {id} had finished ({} tokens) before the kill landed",
                    got.len()
                ));
            }
            let takeover_ms = takeover.as_millis() as u64;
            Injection::Survived {
                detail: format!(
                    "primary killed at token {} of request {id}: shadow granted after {:.0} ms, \
                     generating again after {takeover_ms} ms (rebuilt {} tokens in {:.0} ms); \
                     {} tokens as unkilled; a new shadow is up",
                    before.generated,
                    f.takeover_s * 1000.0,
                    f.rebuild_tokens,
                    f.rebuild_s * 1000.0,
                    got.len()
                ),
                takeover_ms,
            }
        })
    }

    fn take(&self) -> Option<Workers> {
        self.workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Stops every process of the group; returns those left running after (leaks).
    pub fn stop(&self) -> Vec<String> {
        drop(self.take());
        let needle = self.dir.display().to_string();
        let mut left = Vec::new();
        crate::bench::wait_until(Duration::from_secs(10), || {
            left = crate::leaks::pids_mentioning(&needle);
            left.is_empty()
        });
        let _ = std::fs::remove_dir_all(&self.dir);
        left.into_iter()
            .map(|pid| format!("rollout worker process {pid} (of {needle}) left running"))
            .collect()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        drop(self.take());
    }
}

fn request(id: u64) -> GenRequest {
    GenRequest {
        id,
        prompt: prompt(),
        max_new: MAX_NEW,
        seed: 0,
        temperature: 0.0,
        top_k: 0,
    }
}

/// A request's progress in the broker's token log.
struct Progress {
    generated: usize,
    finished: bool,
}

/// Polls the broker's log until request `id` has `n` tokens (or finished).
fn wait_generated(broker: &Path, id: u64, n: usize) -> Result<Progress, String> {
    let obs = Client::connect(broker, Role::Observer, 0).map_err(|e| format!("observer: {e}"))?;
    let end = Instant::now() + REQUEST_LIMIT;
    loop {
        let finished = obs
            .log_ids()
            .map_err(|e| format!("log: {e}"))?
            .into_iter()
            .find(|(i, _)| *i == id)
            .map(|(_, f)| f);
        if let Some(finished) = finished {
            let generated = obs
                .log_get(id)
                .map_err(|e| format!("log: {e}"))?
                .generated
                .len();
            if finished || generated >= n {
                return Ok(Progress {
                    generated,
                    finished,
                });
            }
        }
        if Instant::now() > end {
            return Err(format!("not in the log within {REQUEST_LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_tokens_in_time_hold() {
        assert_eq!(
            judge(true, Duration::from_secs(2), &[1, 2], &[1, 2]),
            Ok(())
        );
    }

    #[test]
    fn differing_tokens_name_the_first_difference() {
        let e = judge(true, Duration::from_secs(1), &[1, 2, 9, 4], &[1, 2, 3, 4]).unwrap_err();
        assert!(e.contains("at token 2 of 4"), "{e}");
        let short = judge(true, Duration::from_secs(1), &[1, 2], &[1, 2, 3]).unwrap_err();
        assert!(
            short.contains("at token 2 of 3") && short.contains("got 2"),
            "{short}"
        );
    }

    #[test]
    fn a_slow_takeover_is_a_violation_only_when_in_flight() {
        let slow = TAKEOVER_LIMIT + Duration::from_secs(1);
        assert!(judge(true, slow, &[1], &[1]).unwrap_err().contains("over"));
        assert_eq!(judge(false, slow, &[1], &[1]), Ok(()));
    }

    #[test]
    fn the_prompt_is_fixed_and_fits() {
        assert_eq!(prompt(), prompt());
        assert_eq!(prompt().len(), PROMPT);
        assert!(KILL_AFTER < MAX_NEW as usize);
    }
}
