//! The broker-resident token log: every admitted request's prompt, parameters, generated tokens
//! and sampler state, appended only by the current epoch's lease holder.
//!
//! Unfinished requests are kept until they finish: a shadow worker rebuilds them. Finished ones
//! are kept so a worker can answer a client's resend from the log, but only the newest of them
//! within [`Retention`]: the broker lives as long as its GPU, and a log of every request it
//! ever served would grow without bound. An evicted request is unknown again, and a resend of
//! it is admitted and generated anew.

use std::collections::{BTreeMap, VecDeque};

use crate::wire::{CommitEntry, RequestLog, SamplingParams};

/// Why an append was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LogError {
    /// Unknown request id.
    #[error("request {0} was never admitted")]
    Unknown(u64),
    /// Same id admitted again with different content.
    #[error("request {0} was already admitted with another prompt or parameters")]
    Conflict(u64),
    /// Append at the wrong position.
    #[error("request {id}: commit at position {pos}, but the log holds {have} generated tokens")]
    Position {
        /// Request id.
        id: u64,
        /// Position in the commit.
        pos: u32,
        /// Tokens already logged.
        have: usize,
    },
    /// Append to a finished request or beyond its budget.
    #[error("request {0} is finished or would exceed max_new_tokens")]
    Closed(u64),
}

/// How many finished requests the log keeps; the oldest finished go first once either bound is
/// passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Finished requests kept.
    pub requests: usize,
    /// Prompt plus generated tokens of the finished requests kept.
    pub tokens: usize,
}

/// The most finished requests a log may keep: half of what one `LogIds` reply can list, the
/// other half left for requests in flight.
pub const MAX_KEPT_FINISHED: usize = crate::wire::MAX_LIST / 2;

impl Default for Retention {
    /// [`MAX_KEPT_FINISHED`] requests or 64 Mi tokens (256 MiB of token ids), whichever is
    /// reached first.
    fn default() -> Self {
        Self {
            requests: MAX_KEPT_FINISHED,
            tokens: 64 << 20,
        }
    }
}

/// All requests' logs.
#[derive(Debug, Default)]
pub struct TokenLog {
    reqs: BTreeMap<u64, RequestLog>,
    retention: Retention,
    /// Finished request ids, oldest finish first.
    finished: VecDeque<u64>,
    /// Tokens of the finished requests held.
    finished_tokens: usize,
}

fn tokens(r: &RequestLog) -> usize {
    r.prompt.len() + r.generated.len()
}

impl TokenLog {
    /// An empty log keeping finished requests within `retention`.
    pub fn new(retention: Retention) -> Self {
        Self {
            retention,
            ..Self::default()
        }
    }

    /// Admits a request (idempotent for an identical re-admission).
    pub fn admit(
        &mut self,
        id: u64,
        params: SamplingParams,
        sampler_state: u64,
        prompt: Vec<u32>,
    ) -> Result<(), LogError> {
        if let Some(r) = self.reqs.get(&id) {
            return if r.prompt == prompt && r.params == params {
                Ok(())
            } else {
                Err(LogError::Conflict(id))
            };
        }
        self.reqs.insert(
            id,
            RequestLog {
                request_id: id,
                params,
                prompt,
                generated: Vec::new(),
                sampler_state,
                finished: false,
            },
        );
        Ok(())
    }

    /// Appends a batch of entries: all are checked before any is applied.
    pub fn commit(&mut self, entries: &[CommitEntry]) -> Result<(), LogError> {
        for e in entries {
            let r = self
                .reqs
                .get(&e.request_id)
                .ok_or(LogError::Unknown(e.request_id))?;
            if e.pos as usize != r.generated.len() {
                return Err(LogError::Position {
                    id: e.request_id,
                    pos: e.pos,
                    have: r.generated.len(),
                });
            }
            if r.finished || r.generated.len() + e.tokens.len() > r.params.max_new_tokens as usize {
                return Err(LogError::Closed(e.request_id));
            }
        }
        for e in entries {
            if let Some(r) = self.reqs.get_mut(&e.request_id) {
                r.generated.extend_from_slice(&e.tokens);
                r.sampler_state = e.sampler_state;
                r.finished = e.finished;
                if r.finished {
                    self.finished.push_back(r.request_id);
                    self.finished_tokens += tokens(r);
                }
            }
        }
        self.evict();
        Ok(())
    }

    /// Drops the oldest finished requests until the rest fit the retention bounds.
    fn evict(&mut self) {
        // Tokens are counted only for queued ids: over either bound, the queue is not empty.
        while self.finished.len() > self.retention.requests
            || self.finished_tokens > self.retention.tokens
        {
            let Some(id) = self.finished.pop_front() else {
                break;
            };
            if let Some(r) = self.reqs.remove(&id) {
                self.finished_tokens -= tokens(&r);
            }
        }
    }

    /// One request's log.
    pub fn get(&self, id: u64) -> Option<&RequestLog> {
        self.reqs.get(&id)
    }

    /// All ids with their finished flags.
    pub fn ids(&self) -> Vec<(u64, bool)> {
        self.reqs
            .values()
            .map(|r| (r.request_id, r.finished))
            .collect()
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.reqs.len()
    }

    /// Whether the log is empty.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Number of unfinished requests.
    pub fn inflight(&self) -> usize {
        self.reqs.values().filter(|r| !r.finished).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            seed: 1,
            max_new_tokens: 3,
        }
    }

    fn entry(id: u64, pos: u32, t: &[u32], fin: bool) -> CommitEntry {
        CommitEntry {
            request_id: id,
            pos,
            tokens: t.to_vec(),
            sampler_state: 5,
            finished: fin,
        }
    }

    #[test]
    fn keeps_only_the_newest_finished_requests() {
        let mut l = TokenLog::new(Retention {
            requests: 2,
            tokens: 100,
        });
        for id in 1..=4 {
            l.admit(id, p(), 0, vec![1, 2]).unwrap();
        }
        for id in 1..=3 {
            l.commit(&[entry(id, 0, &[7], true)]).unwrap();
        }
        // Three finished, two kept: the first to finish went; the unfinished one stays.
        assert_eq!(l.ids(), vec![(2, true), (3, true), (4, false)]);
        assert_eq!(l.inflight(), 1);
        // An evicted id is unknown again: admitted afresh.
        l.admit(1, p(), 0, vec![9]).unwrap();
        assert_eq!(l.get(1).unwrap().prompt, vec![9]);

        // The token bound: 3 tokens each, at most 7 tokens of finished requests.
        let mut l = TokenLog::new(Retention {
            requests: 10,
            tokens: 7,
        });
        for id in 1..=3 {
            l.admit(id, p(), 0, vec![1, 2]).unwrap();
            l.commit(&[entry(id, 0, &[7], true)]).unwrap();
        }
        assert_eq!(l.ids(), vec![(2, true), (3, true)]);
        // A finished request larger than the whole bound is not kept either.
        l.admit(4, p(), 0, vec![0; 9]).unwrap();
        l.commit(&[entry(4, 0, &[7], true)]).unwrap();
        assert!(l.ids().is_empty());
    }

    #[test]
    fn appends_in_order_and_refuses_gaps_and_overruns() {
        let mut l = TokenLog::default();
        l.admit(1, p(), 0, vec![1, 2]).unwrap();
        l.admit(1, p(), 0, vec![1, 2]).unwrap();
        assert_eq!(l.admit(1, p(), 0, vec![3]), Err(LogError::Conflict(1)));
        l.commit(&[entry(1, 0, &[7], false)]).unwrap();
        assert!(matches!(
            l.commit(&[entry(1, 0, &[7], false)]),
            Err(LogError::Position { .. })
        ));
        assert_eq!(
            l.commit(&[entry(1, 1, &[7, 8, 9], false)]),
            Err(LogError::Closed(1))
        );
        // All-or-nothing: the second entry is bad, the first must not land.
        assert!(
            l.commit(&[entry(1, 1, &[8], false), entry(2, 0, &[1], false)])
                .is_err()
        );
        assert_eq!(l.get(1).unwrap().generated, vec![7]);
        l.commit(&[entry(1, 1, &[8, 9], true)]).unwrap();
        assert_eq!(l.inflight(), 0);
        assert_eq!(
            l.commit(&[entry(1, 3, &[], false)]),
            Err(LogError::Closed(1))
        );
    }
}
