//! The broker-resident token log: every admitted request's prompt, parameters, generated tokens
//! and sampler state, appended only by the current epoch's lease holder.
//!
//! Unfinished requests are kept until they finish: a shadow worker rebuilds them. Finished ones
//! are kept so a worker can answer a client's resend from the log, but only the newest of them
//! within [`Retention`]: the broker lives as long as its GPU, and a log of every request it
//! ever served would grow without bound. An evicted request is unknown again, and a resend of
//! it is admitted and generated anew.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::wire::{
    CommitEntry, HEADER_LEN, MAX_FRAME, MAX_LIST, MAX_TOKENS, RequestLog, SamplingParams,
};

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
    /// Admission refused: [`MAX_INFLIGHT`] requests are unfinished already.
    #[error(
        "request {0} refused: {MAX_INFLIGHT} requests are in flight, the most one log listing \
         can carry beside the finished ones kept"
    )]
    Full(u64),
    /// Admission refused: the prompt plus `max_new_tokens` could not be sent back as one log
    /// entry.
    #[error(
        "request {id} refused: a prompt of {prompt} tokens with max_new_tokens {max_new} exceeds \
         the log entry bound ({MAX_TOKENS} tokens each, {MAX_LOG_TOKENS} together)"
    )]
    TooLong {
        /// Request id.
        id: u64,
        /// Prompt tokens.
        prompt: usize,
        /// Requested budget.
        max_new: u32,
    },
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
pub const MAX_KEPT_FINISHED: usize = MAX_LIST / 2;

/// The most unfinished requests a log holds: with [`MAX_KEPT_FINISHED`] finished ones, a
/// `LogIds` reply stays within [`MAX_LIST`].
pub const MAX_INFLIGHT: usize = MAX_LIST - MAX_KEPT_FINISHED;

/// Bytes of a `LogEntry` frame besides its tokens: header, id, parameters, two token counts,
/// sampler state and the finished flag.
const LOG_ENTRY_FIXED: usize = HEADER_LEN + 8 + 20 + 4 + 4 + 8 + 1;

/// The most prompt plus generated tokens one request may hold: its `LogEntry` reply must fit
/// [`MAX_FRAME`] (and each of the two token lists [`MAX_TOKENS`]).
pub const MAX_LOG_TOKENS: usize = (MAX_FRAME - LOG_ENTRY_FIXED) / 4;

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
    /// Finished request ids with the tokens each added to `finished_tokens`, oldest finish
    /// first.
    finished: VecDeque<(u64, usize)>,
    /// Tokens of the finished requests held.
    finished_tokens: usize,
}

fn tokens(r: &RequestLog) -> usize {
    r.prompt.len() + r.generated.len()
}

impl TokenLog {
    /// An empty log keeping finished requests within `retention` (at most
    /// [`MAX_KEPT_FINISHED`] requests, whatever `retention` asks).
    pub fn new(retention: Retention) -> Self {
        Self {
            retention: Retention {
                requests: retention.requests.min(MAX_KEPT_FINISHED),
                ..retention
            },
            ..Self::default()
        }
    }

    /// Admits a request (idempotent for an identical re-admission). A new request is refused
    /// while [`MAX_INFLIGHT`] are unfinished, or when its prompt and budget would not fit one
    /// log entry.
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
        let max_new = params.max_new_tokens;
        let budget = max_new as usize;
        if prompt.len() > MAX_TOKENS
            || budget > MAX_TOKENS
            || prompt.len() + budget > MAX_LOG_TOKENS
        {
            return Err(LogError::TooLong {
                id,
                prompt: prompt.len(),
                max_new,
            });
        }
        if self.inflight() >= MAX_INFLIGHT {
            return Err(LogError::Full(id));
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

    /// Appends a batch of entries: all are checked before any is applied. Entries are checked in
    /// order, each against the state the ones before it leave, so one request may appear more
    /// than once (at consecutive positions).
    pub fn commit(&mut self, entries: &[CommitEntry]) -> Result<(), LogError> {
        // Generated count and finished flag of each request as the batch so far leaves it.
        let mut after: HashMap<u64, (usize, bool)> = HashMap::new();
        for e in entries {
            let r = self
                .reqs
                .get(&e.request_id)
                .ok_or(LogError::Unknown(e.request_id))?;
            let (have, finished) = after
                .get(&e.request_id)
                .copied()
                .unwrap_or((r.generated.len(), r.finished));
            if e.pos as usize != have {
                return Err(LogError::Position {
                    id: e.request_id,
                    pos: e.pos,
                    have,
                });
            }
            // Admission bounded max_new_tokens, so the entry stays sendable.
            let now = have + e.tokens.len();
            if finished || now > r.params.max_new_tokens as usize {
                return Err(LogError::Closed(e.request_id));
            }
            after.insert(e.request_id, (now, e.finished));
        }
        for e in entries {
            if let Some(r) = self.reqs.get_mut(&e.request_id) {
                r.generated.extend_from_slice(&e.tokens);
                r.sampler_state = e.sampler_state;
                r.finished = e.finished;
                if r.finished {
                    // Checked above: nothing is appended to a finished request, so this runs
                    // once per request and its token count no longer changes.
                    let n = tokens(r);
                    self.finished.push_back((r.request_id, n));
                    self.finished_tokens += n;
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
            let Some((id, n)) = self.finished.pop_front() else {
                break;
            };
            self.reqs.remove(&id);
            self.finished_tokens -= n;
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

    #[test]
    fn a_batch_naming_one_request_twice_is_checked_in_order() {
        let mut l = TokenLog::new(Retention {
            requests: 0,
            tokens: 100,
        });
        l.admit(1, p(), 0, vec![1, 2]).unwrap();
        // The second entry must follow the first: same position twice is refused ...
        assert_eq!(
            l.commit(&[entry(1, 0, &[7], true), entry(1, 0, &[8], false)]),
            Err(LogError::Position {
                id: 1,
                pos: 0,
                have: 1
            })
        );
        // ... and so is an append after the batch's own finish ...
        assert_eq!(
            l.commit(&[entry(1, 0, &[7], true), entry(1, 1, &[8], false)]),
            Err(LogError::Closed(1))
        );
        // ... and the budget counts the whole batch.
        assert_eq!(
            l.commit(&[entry(1, 0, &[7, 8], false), entry(1, 2, &[9, 9], false)]),
            Err(LogError::Closed(1))
        );
        assert!(l.get(1).unwrap().generated.is_empty());
        // Consecutive positions in one batch are fine; the finish is counted once and evicted
        // (keep 0) without leaving tokens behind.
        l.commit(&[entry(1, 0, &[7], false), entry(1, 1, &[8], true)])
            .unwrap();
        assert!(l.is_empty());
        assert!(l.finished.is_empty());
        assert_eq!(l.finished_tokens, 0);
    }

    #[test]
    fn admission_is_bounded_so_the_id_listing_stays_encodable() {
        use crate::wire::{Msg, decode, encode, frame_fits};
        // A retention beyond the listing's half is cut to it.
        let mut l = TokenLog::new(Retention {
            requests: usize::MAX,
            tokens: usize::MAX,
        });
        let n = MAX_LIST as u64 + 10;
        for id in 0..n {
            l.admit(id, p(), 0, vec![1]).unwrap();
            l.commit(&[entry(id, 0, &[7], true)]).unwrap();
        }
        assert_eq!(l.len(), MAX_KEPT_FINISHED);
        for id in n..n + MAX_INFLIGHT as u64 {
            l.admit(id, p(), 0, vec![1]).unwrap();
        }
        let over = n + MAX_INFLIGHT as u64;
        assert_eq!(l.admit(over, p(), 0, vec![1]), Err(LogError::Full(over)));
        // A re-admission of a known request is still answered.
        l.admit(n, p(), 0, vec![1]).unwrap();
        let m = Msg::LogIds { ids: l.ids() };
        let f = encode(&m);
        assert!(frame_fits(&f));
        assert_eq!(decode(&f).unwrap(), m);
        // A finish makes room again.
        l.commit(&[entry(n, 0, &[7], true)]).unwrap();
        l.admit(over, p(), 0, vec![1]).unwrap();
    }

    #[test]
    fn admission_refuses_requests_whose_log_entry_cannot_be_sent() {
        use crate::wire::{Msg, decode, encode, frame_fits};
        let big = |max_new: usize| SamplingParams {
            max_new_tokens: max_new as u32,
            ..p()
        };
        let mut l = TokenLog::default();
        let prompt = vec![3; MAX_LOG_TOKENS - MAX_TOKENS];
        assert!(matches!(
            l.admit(1, big(MAX_TOKENS + 1), 0, prompt.clone()),
            Err(LogError::TooLong { id: 1, .. })
        ));
        assert!(matches!(
            l.admit(
                1,
                big(MAX_TOKENS),
                0,
                vec![3; MAX_LOG_TOKENS - MAX_TOKENS + 1]
            ),
            Err(LogError::TooLong { id: 1, .. })
        ));
        assert!(matches!(
            l.admit(1, big(1), 0, vec![3; MAX_TOKENS + 1]),
            Err(LogError::TooLong { id: 1, .. })
        ));
        assert!(l.is_empty());
        // The largest admissible request, generated to its budget, still travels as one entry.
        l.admit(1, big(MAX_TOKENS), 0, prompt).unwrap();
        for pos in (0..MAX_TOKENS).step_by(1024) {
            let fin = pos + 1024 == MAX_TOKENS;
            l.commit(&[entry(1, pos as u32, &[5; 1024], fin)]).unwrap();
        }
        let m = Msg::LogEntry(l.get(1).unwrap().clone());
        let f = encode(&m);
        assert!(frame_fits(&f));
        assert_eq!(decode(&f).unwrap(), m);
        // One more token would not have fit.
        let mut r = l.get(1).unwrap().clone();
        r.prompt.push(0);
        assert!(!frame_fits(&encode(&Msg::LogEntry(r))));
    }
}
