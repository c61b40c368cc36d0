//! Action boundaries from a container's cgroup, for automatic checkpoints of sandboxes whose
//! actions never pass through `exec` (`io.belayer.actions=activity`): OpenHands' agent-server and
//! SWE-ReX's server run every tool in their own processes. Every [`SAMPLE_EVERY`] the shim reads
//! the container's cumulative CPU time and block I/O and feeds them to the scheduler's
//! [`ActivityDetector`]; its boundaries reach the scheduler as exec starts and exits would, so
//! the gap model learns the model's generation gaps with no exec, hint or framework change.
//!
//! A checkpoint or restore runs CRIU's code in the container's tasks (the parasite, a restore's
//! page fill), and a restored container has new counters: while one holds the container, or once
//! its init changed, the detector is rebased on the next quiet sample instead of reading that
//! work as the agent's.

use std::sync::Arc;
use std::time::Duration;

use log::debug;
use scheduler::{ActivityConfig, ActivityDetector, ActivitySample, Boundary};

use super::Engine;

/// How often a watched container's cgroup is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

impl Engine {
    /// Samples container `id`'s cgroup until the container is gone, feeding the scheduler the
    /// action boundaries its activity shows.
    pub(super) fn watch_activity(self: &Arc<Self>, id: &str) {
        let (inner, id) = (self.clone(), id.to_string());
        tokio::spawn(async move {
            let mut detector = ActivityDetector::new(ActivityConfig::default());
            let mut init = 0;
            let mut rebase = false;
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let (Ok(c), Ok(busy)) = (inner.get(&id), inner.busy(&id)) else {
                    debug!("container {id}: no longer watched for activity");
                    return;
                };
                // A checkpoint or restore under way (a restore holds the container's lock).
                let pid = match c.try_lock() {
                    Ok(c) if !busy.is_held() => c.init.pid,
                    _ => {
                        rebase = true;
                        continue;
                    }
                };
                let Some((cpu, io_bytes)) =
                    (pid != 0).then(|| crate::cgroup::activity(pid)).flatten()
                else {
                    continue;
                };
                let sample = ActivitySample {
                    t: inner.now(),
                    cpu,
                    io_bytes,
                };
                // The first sample is the container's start, an action; a new init is a
                // restored container, whose counters start anew.
                if init != 0 && (rebase || pid != init) {
                    detector.rebase(sample);
                    (rebase, init) = (false, pid);
                    continue;
                }
                init = pid;
                match detector.observe(sample) {
                    Some(Boundary::ActionStart(at)) => inner.sched().on_exec_start(&id, at),
                    Some(Boundary::ActionEnd(at)) => {
                        inner.sched().on_exec_exit(&id, at);
                        inner.consider(&id);
                    }
                    None => {}
                }
            }
        });
    }
}
