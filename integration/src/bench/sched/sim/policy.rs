//! The checkpoint policies the simulator compares.

/// A checkpoint policy under comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    /// The scheduler crate's policy; with or without the agent loop's hints.
    Belayer {
        /// Whether `llm-start`/`llm-end` hints are sent.
        hints: bool,
    },
    /// A checkpoint after every `k`-th action.
    Every {
        /// Period in actions.
        k: u32,
        /// Synchronous (the agent waits) or in the gap (skipped when no permit is free).
        sync: bool,
    },
    /// No checkpoints.
    Never,
}

impl Policy {
    /// Its name in tables and plots.
    pub fn name(&self) -> String {
        match *self {
            Policy::Belayer { hints: false } => "belayer".into(),
            Policy::Belayer { hints: true } => "belayer+hints".into(),
            Policy::Every { k: 1, sync: true } => "every-turn".into(),
            Policy::Every { k: 1, sync: false } => "every-turn-async".into(),
            Policy::Every { k, sync: true } => format!("every-{k}"),
            Policy::Every { k, sync: false } => format!("every-{k}-async"),
            Policy::Never => "never".into(),
        }
    }
}
