//! What `belayer-bench rollout` reports: Markdown tables, results.json and an SVG plot.

use serde_json::{Value, json};

use super::{Mode, Run};
use crate::bench::plot::{self, Bar};
use crate::bench::stats::median;

fn med(xs: impl Iterator<Item = f64>) -> Option<f64> {
    median(&xs.collect::<Vec<_>>())
}

fn s(x: Option<f64>) -> String {
    x.map_or("—".into(), |v| format!("{v:.2}"))
}

/// Actions run again after a failure: re-run after a Belayer recovery rewound the environment,
/// or run again by a replay from the start.
pub fn actions_rerun(r: &Run) -> usize {
    r.trajectories
        .iter()
        .map(|t| {
            t.recoveries.iter().map(|k| k.turns_redone).sum::<usize>()
                + t.replays.iter().map(|p| p.actions_rerun).sum::<usize>()
        })
        .sum()
}

/// The tables, in Markdown.
pub fn table(runs: &[Run]) -> String {
    let base = runs
        .iter()
        .find(|r| r.mode == Mode::Baseline)
        .map(|r| r.wall_s);
    let mut t = String::from(
        "| run | trajectories completed (final state verified) | lost | wall s (setup + episodes) | vs baseline | worker kills | replays from the start | actions re-run | gen requests | prompt tokens | generated tokens | median bubble s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in runs {
        let over = base.map_or("—".into(), |b| {
            format!("{:+.1} %", (r.wall_s / b - 1.0) * 100.0)
        });
        let tr = &r.trajectories;
        t.push_str(&format!(
            "| {} | {}/{} | {} | {:.1} ({:.1} + {:.1}) | {over} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.label,
            r.completed(),
            tr.len(),
            r.lost(),
            r.wall_s,
            r.setup_s,
            r.episodes_s,
            r.worker_failovers.len(),
            tr.iter().map(|t| t.replays.len()).sum::<usize>(),
            actions_rerun(r),
            tr.iter().map(|t| t.bubble_s.len()).sum::<usize>(),
            tr.iter().map(|t| t.prompt_tokens).sum::<usize>(),
            tr.iter().map(|t| t.generated_tokens).sum::<usize>(),
            s(med(tr.iter().flat_map(|t| t.bubble_s.iter().copied()))),
        ));
    }
    t.push_str("\n| sandbox kill (run, trajectory) | at s | turn | kill → recovered (shim) s | kill → next action works s | journal position | actions re-run | outcome |\n|---|---:|---:|---:|---:|---|---:|---|\n");
    for r in runs {
        for tr in &r.trajectories {
            for k in &tr.recoveries {
                let outcome = match &tr.lost {
                    None => "trajectory completed".to_string(),
                    Some(e) => format!("lost: {}", e.chars().take(80).collect::<String>()),
                };
                t.push_str(&format!(
                    "| {} #{} | {:.1} | {} | {} | {} | {} | {} | {} |\n",
                    r.mode.tag(),
                    tr.traj,
                    k.at_s,
                    k.turn,
                    s(k.recovered_s),
                    s(k.next_action_s),
                    if k.reflects.is_empty() {
                        "—"
                    } else {
                        &k.reflects
                    },
                    k.turns_redone,
                    outcome.replace('|', "/"),
                ));
            }
        }
    }
    t.push_str("\n| worker kill (run) | at s | kill → lease s | kill → serving s | KV rebuild s (requests, tokens) | kill → generating again s | cold load |\n|---|---:|---:|---:|---|---:|---|\n");
    for r in runs {
        for f in &r.worker_failovers {
            t.push_str(&format!(
                "| {} | {:.1} | {:.3} | {:.3} | {:.2} ({}, {}) | {:.2} | {} |\n",
                r.mode.tag(),
                f.at_s,
                f.takeover_s,
                f.serving_s,
                f.rebuild_s,
                f.rebuild_requests,
                f.rebuild_tokens,
                f.ready_s,
                if f.cold_load { "yes" } else { "no" },
            ));
        }
        if r.worker_kills_skipped > 0 {
            t.push_str(&format!(
                "| {} | {} kill(s) not fired: every trajectory had ended | | | | | |\n",
                r.mode.tag(),
                r.worker_kills_skipped
            ));
        }
    }
    t
}

/// The one-object summary (last stdout line, and `summary` in results.json).
pub fn summary(runs: &[Run]) -> Value {
    let get = |m: Mode| runs.iter().find(|r| r.mode == m);
    let base = get(Mode::Baseline).map(|r| r.wall_s);
    let mut o = serde_json::Map::new();
    for r in runs {
        let rec: Vec<f64> = r
            .trajectories
            .iter()
            .flat_map(|t| t.recoveries.iter().filter_map(|k| k.recovered_s))
            .collect();
        let next: Vec<f64> = r
            .trajectories
            .iter()
            .flat_map(|t| t.recoveries.iter().filter_map(|k| k.next_action_s))
            .collect();
        o.insert(
            format!("{:?}", r.mode).to_lowercase(),
            json!({
                "completed": r.completed(), "lost": r.lost(), "trajectories": r.trajectories.len(),
                "wall_s": r.wall_s, "overhead_vs_baseline": base.map(|b| r.wall_s / b - 1.0),
                "replays": r.trajectories.iter().map(|t| t.replays.len()).sum::<usize>(),
                "actions_rerun": actions_rerun(r),
                "sandbox_kills_seen": r.trajectories.iter().map(|t| t.recoveries.len()).sum::<usize>(),
                "sandbox_recovered_s_median": median(&rec), "sandbox_next_action_s_median": median(&next),
                "worker_takeover_s": r.worker_failovers.iter().map(|f| f.takeover_s).collect::<Vec<_>>(),
                "worker_ready_s": r.worker_failovers.iter().map(|f| f.ready_s).collect::<Vec<_>>(),
            }),
        );
    }
    if let (Some(b), Some(r)) = (get(Mode::Belayer), get(Mode::Replay)) {
        o.insert(
            "belayer_vs_replay".into(),
            json!({
                "completed": {"belayer": b.completed(), "replay": r.completed()},
                "wall_s": {"belayer": b.wall_s, "replay": r.wall_s},
                "replay_wall_over_belayer_wall": r.wall_s / b.wall_s,
                "actions_rerun": {"belayer": actions_rerun(b), "replay": actions_rerun(r)},
            }),
        );
    }
    Value::Object(o)
}

/// The failure-free run's trajectories as a scheduler trace (`belayer-bench sched --trace`):
/// each turn's real generation time (the gap) and action time; footprints are not recorded.
pub fn trace(runs: &[Run]) -> Vec<crate::bench::sched::trace::Episode> {
    use crate::bench::sched::trace::{Episode, Turn};
    let Some(base) = runs.iter().find(|r| r.mode == Mode::Baseline) else {
        return Vec::new();
    };
    base.trajectories
        .iter()
        .map(|t| {
            let id = format!("rollout-{}", t.traj);
            let mut expected_ms = 2000;
            let turns = t
                .bubble_s
                .iter()
                .zip(&t.action_s)
                .map(|(&llm_s, &action_s)| {
                    let hint_ms = Some(expected_ms);
                    expected_ms = (llm_s * 1000.0) as u64;
                    Turn {
                        episode: id.clone(),
                        start_s: None,
                        llm_s,
                        action_s,
                        dirty_bytes: 0,
                        resident_bytes: None,
                        fs_bytes: 0,
                        hint_ms,
                    }
                })
                .collect();
            Episode {
                id,
                start_s: 0.0,
                turns,
            }
        })
        .collect()
}

/// Horizontal bars: each run's wall time, then recovery times (seconds).
pub fn plot(runs: &[Run], title: &str) -> String {
    let mut rows: Vec<(String, f64, &str)> = runs
        .iter()
        .map(|r| {
            (
                format!(
                    "wall: {} ({}/{} done)",
                    r.label,
                    r.completed(),
                    r.trajectories.len()
                ),
                r.wall_s,
                if r.mode == Mode::Belayer {
                    "#2e9e5b"
                } else {
                    "#888888"
                },
            )
        })
        .collect();
    for r in runs {
        for tr in &r.trajectories {
            for k in &tr.recoveries {
                if let Some(v) = k.next_action_s.or(k.recovered_s) {
                    rows.push((
                        format!(
                            "sandbox #{} kill → working again ({})",
                            tr.traj,
                            r.mode.tag()
                        ),
                        v,
                        "#3b6fb6",
                    ));
                }
            }
        }
        for (i, f) in r.worker_failovers.iter().enumerate() {
            let what = if r.mode == Mode::Belayer {
                "takeover + KV rebuild"
            } else {
                "cold restart"
            };
            rows.push((
                format!(
                    "worker kill {} → generating ({what}, {})",
                    i + 1,
                    r.mode.tag()
                ),
                f.ready_s,
                if r.mode == Mode::Belayer {
                    "#8e5bb5"
                } else {
                    "#b5563b"
                },
            ));
        }
    }
    let bars: Vec<Bar> = rows
        .into_iter()
        .map(|(label, value, colour)| Bar {
            label,
            value,
            samples: Vec::new(),
            colour,
        })
        .collect();
    plot::bars(title, "s", &bars)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::rollout::agent::{Recovery, Trajectory};
    use crate::bench::rollout::workers::Failover;

    fn run(mode: Mode, wall: f64, lost: bool) -> Run {
        Run {
            mode,
            label: mode.label(),
            runtime: "",
            setup_s: 1.0,
            episodes_s: wall - 1.0,
            wall_s: wall,
            trajectories: vec![Trajectory {
                verified: !lost,
                lost: lost.then(|| "action | failed".into()),
                bubble_s: vec![1.0, 2.0],
                recoveries: vec![Recovery {
                    recovered_s: Some(0.5),
                    next_action_s: Some(1.5),
                    ..Recovery::default()
                }],
                ..Trajectory::default()
            }],
            worker_failovers: vec![Failover {
                ready_s: 3.0,
                ..Failover::default()
            }],
            worker_kills_skipped: 0,
        }
    }

    #[test]
    fn tables_summary_and_plot() {
        let runs = [
            run(Mode::Baseline, 10.0, false),
            run(Mode::Belayer, 11.0, false),
            run(Mode::Plain, 9.0, true),
        ];
        let t = table(&runs);
        assert!(t.contains("+10.0 %") && t.contains("-10.0 %"), "{t}");
        assert!(t.contains("lost: action / failed"), "{t}");
        let s = summary(&runs);
        assert_eq!(s["plain"]["lost"], 1);
        assert_eq!(s["belayer"]["sandbox_next_action_s_median"], 1.5);
        let svg = plot(&runs, "a < b");
        assert!(
            svg.starts_with("<svg")
                && svg.contains("a &lt; b")
                && svg.trim_end().ends_with("</svg>")
        );
        assert_eq!(svg.matches("<rect").count(), 1 + 3 + 3 + 3);
    }
}
