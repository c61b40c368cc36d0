//! The scripted side of an episode: a task text per trajectory, the action of each (trajectory,
//! turn) with the output and file it must produce, the expected final state, and a stand-in
//! tokenizer. A 135M model's text is not a shell command, so actions are scripted; the rollout
//! worker supplies the real generation time and token traffic.

/// Every action starts by checking the environment is where the agent believes it is: the
/// counter holds the previous turn. A rewound environment fails this with [`BEHIND`].
pub const BEHIND: i32 = 86;

/// One turn's action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    /// `sh -c` script run in the sandbox.
    pub script: String,
    /// What it prints.
    pub stdout: String,
    /// Content of `/work/t{turn}.txt` afterwards.
    pub file: String,
    /// `edit`, `python` or `log`.
    pub kind: &'static str,
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

const WORDS: &[&str] = &[
    "parse",
    "config",
    "file",
    "test",
    "fix",
    "the",
    "failing",
    "build",
    "module",
    "python",
    "write",
    "check",
    "output",
    "log",
    "error",
    "value",
    "update",
    "counter",
    "function",
    "read",
    "directory",
    "script",
    "run",
    "result",
    "compare",
    "expected",
    "edit",
    "line",
    "report",
    "step",
];

fn word(seed: u64) -> &'static str {
    WORDS[(mix(seed) % WORDS.len() as u64) as usize]
}

/// The setup exec (journal action 1).
pub const SETUP: &str = "mkdir -p /work && echo 0 > /work/counter && : > /work/log.txt";

/// The task text of trajectory `traj` (about 70 words).
pub fn task(seed: u64, traj: usize) -> String {
    let base = mix(seed ^ (traj as u64) << 32);
    let words: Vec<&str> = (0..64).map(|i| word(base.wrapping_add(i))).collect();
    format!(
        "You are an agent in a Linux sandbox, trajectory {traj}. Task: {}. Answer with one shell command per turn.",
        words.join(" ")
    )
}

/// The action of `turn` (1-based) of trajectory `traj`.
pub fn action(seed: u64, traj: usize, turn: usize) -> Action {
    let h = mix(seed ^ ((traj as u64) << 20) ^ turn as u64);
    let w = word(h);
    let guard = format!(
        "set -e; cd /work; c=$(cat counter); [ \"$c\" = \"{prev}\" ] || {{ echo \"counter is $c, this is turn {turn}\" >&2; exit {BEHIND}; }}; ",
        prev = turn - 1
    );
    let (kind, body, file) = match (traj + turn) % 3 {
        0 => (
            "edit",
            format!(
                "printf 'draft {w} {turn}\\n' > t{turn}.txt; sed -i 's/^draft/final/' t{turn}.txt; cat t{turn}.txt; "
            ),
            format!("final {w} {turn}\n"),
        ),
        1 => {
            let (m, k) = (97 + h % 800, 20_000 + h % 30_000);
            let n: u64 = (0..k).map(|i| i * i % m).sum();
            (
                "python",
                format!(
                    "python3 -c 'n = sum(i * i % {m} for i in range({k})); open(\"t{turn}.txt\", \"w\").write(\"sum %d\\n\" % n); print(\"sum %d\" % n)'; "
                ),
                format!("sum {n}\n"),
            )
        }
        _ => (
            "log",
            format!("printf 'note {w} {turn}\\n' | tee t{turn}.txt; "),
            format!("note {w} {turn}\n"),
        ),
    };
    Action {
        script: format!("{guard}{body}echo 'turn {turn} {kind}' >> log.txt; echo {turn} > counter"),
        stdout: file.clone(),
        file,
        kind,
    }
}

/// The script that prints the final state, and what it must print after `turns` turns.
pub fn final_state(seed: u64, traj: usize, turns: usize) -> (String, String) {
    let files: Vec<String> = (1..=turns).map(|t| format!("t{t}.txt")).collect();
    let script = format!("cd /work && cat counter log.txt {}", files.join(" "));
    let mut want = format!("{turns}\n");
    let acts: Vec<Action> = (1..=turns).map(|t| action(seed, traj, t)).collect();
    for (t, a) in acts.iter().enumerate() {
        want.push_str(&format!("turn {} {}\n", t + 1, a.kind));
    }
    for a in &acts {
        want.push_str(&a.file);
    }
    (script, want)
}

/// Stand-in tokenizer: one token per whitespace-separated word, an id from its hash past the
/// vocabulary's special tokens. (The broker and worker see real token traffic; the text is not
/// decoded.)
pub fn tokens(text: &str) -> Vec<u32> {
    text.split_whitespace()
        .map(|w| {
            let h = w.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            });
            300 + (h % 40_000) as u32
        })
        .collect()
}

/// The observation appended to the context after a turn: the action's kind and output, at most
/// `limit` tokens.
pub fn observation(turn: usize, a: &Action, limit: usize) -> Vec<u32> {
    let mut t = tokens(&format!("[turn {turn} {} exit 0] {}", a.kind, a.stdout));
    t.truncate(limit);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_are_deterministic_and_varied() {
        assert_eq!(action(1, 2, 3), action(1, 2, 3));
        let kinds: std::collections::BTreeSet<_> = (1..=3).map(|t| action(1, 0, t).kind).collect();
        assert_eq!(kinds.len(), 3);
        let a = action(1, 0, 2);
        assert!(a.script.contains("[ \"$c\" = \"1\" ]"), "{}", a.script);
        assert!(a.script.ends_with("echo 2 > counter"));
    }

    #[test]
    fn final_state_lists_every_turn() {
        let (script, want) = final_state(1, 0, 3);
        assert!(script.ends_with("t1.txt t2.txt t3.txt"));
        assert!(want.starts_with("3\nturn 1 "));
        assert_eq!(want.lines().count(), 1 + 3 + 3);
    }

    #[test]
    fn task_is_a_few_dozen_tokens() {
        let n = tokens(&task(1, 0)).len();
        assert!((60..120).contains(&n), "{n}");
        assert!(tokens("a b").iter().all(|&t| t >= 300));
    }
}
