//! The seeded failure schedule, the same for the run with Belayer and the one without.

use serde::Serialize;

/// SIGKILL a sandbox's init during trajectory `traj`'s turn `turn`: `delay_ms` after its
/// generation starts (the kill lands in the generation, the action, or the next turn: mostly
/// after the previous action's automatic checkpoint), or, with `after_action`, the moment the
/// turn's action has succeeded (before its automatic checkpoint can be written, so a restore
/// rewinds the environment and the agent re-runs the action).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SandboxKill {
    pub traj: usize,
    pub turn: usize,
    pub delay_ms: u64,
    pub after_action: bool,
}

/// SIGKILL the rollout worker `delay_ms` after `after_generations` generations have completed
/// (requests are in flight then).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerKill {
    pub after_generations: usize,
    pub delay_ms: u64,
}

/// The whole schedule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Schedule {
    pub sandbox: Vec<SandboxKill>,
    pub worker: Vec<WorkerKill>,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Distinct sandboxes, each killed once during a turn before its last, alternately in the
/// generation and right after the action; worker kills spread over the run.
pub fn schedule(
    seed: u64,
    sandboxes: usize,
    turns: usize,
    sandbox_kills: usize,
    worker_kills: usize,
) -> Schedule {
    let mut r = Rng(seed ^ 0xFA17_5EED);
    let mut trajs: Vec<usize> = (0..sandboxes).collect();
    for i in (1..trajs.len()).rev() {
        trajs.swap(i, r.below(i as u64 + 1) as usize);
    }
    let mut sandbox: Vec<SandboxKill> = trajs
        .into_iter()
        .take(sandbox_kills)
        .enumerate()
        .map(|(i, traj)| SandboxKill {
            traj,
            turn: 1 + r.below(turns as u64 - 1) as usize,
            delay_ms: r.below(2500),
            after_action: i % 2 == 1,
        })
        .collect();
    sandbox.sort_by_key(|k| (k.turn, k.traj));
    let total = sandboxes * turns;
    let worker = (0..worker_kills)
        .map(|j| WorkerKill {
            after_generations: (total * (j + 1) / (worker_kills + 1)).max(1),
            delay_ms: 200 + r.below(1000),
        })
        .collect();
    Schedule { sandbox, worker }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_distinct_and_in_range() {
        let s = schedule(3, 8, 6, 3, 2);
        assert_eq!(s, schedule(3, 8, 6, 3, 2));
        assert_ne!(s, schedule(4, 8, 6, 3, 2));
        let mut t: Vec<usize> = s.sandbox.iter().map(|k| k.traj).collect();
        t.sort();
        t.dedup();
        assert_eq!(t.len(), 3);
        assert_eq!(s.sandbox.iter().filter(|k| k.after_action).count(), 1);
        assert!(
            s.sandbox
                .iter()
                .all(|k| (1..6).contains(&k.turn) && k.traj < 8)
        );
        assert_eq!(
            s.worker
                .iter()
                .map(|k| k.after_generations)
                .collect::<Vec<_>>(),
            [16, 32]
        );
    }
}
