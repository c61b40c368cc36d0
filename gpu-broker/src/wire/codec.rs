//! Little-endian encoding of [`Msg`] with explicit bounds on every variable-length field.

use super::{
    CommitEntry, DecodeError, ErrorCode, HEADER_LEN, KvBlock, MAGIC, MAX_FRAME, MAX_META,
    MAX_TOKENS, Msg, RegionInfo, RegionKind, RequestLog, Role, SamplingParams, Status, VERSION,
};

/// The most items one list in a message holds (pages, commit entries, `LogIds` ids).
pub const MAX_LIST: usize = 4096;
const MAX_TEXT: usize = 4096;
/// The most KV block records one message holds (28 bytes each: under [`MAX_FRAME`]).
pub const MAX_KV_BLOCKS: usize = 2048;

struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    fn bytes(&mut self, b: &[u8]) {
        self.len(b.len());
        self.0.extend_from_slice(b);
    }
    fn tokens(&mut self, t: &[u32]) {
        self.len(t.len());
        for &x in t {
            self.u32(x);
        }
    }
    fn kv_blocks(&mut self, blocks: &[KvBlock]) {
        self.len(blocks.len());
        for b in blocks {
            self.u32(b.block);
            self.0.extend_from_slice(&b.prefix);
            self.u64(b.checksum);
        }
    }
    fn runs(&mut self, runs: &[(u32, u32)]) {
        self.len(runs.len());
        for &(a, b) in runs {
            self.u32(a);
            self.u32(b);
        }
    }
    fn params(&mut self, p: &SamplingParams) {
        self.u32(p.temperature.to_bits());
        self.u32(p.top_k);
        self.u64(p.seed);
        self.u32(p.max_new_tokens);
    }
}

struct Dec<'a> {
    b: &'a [u8],
}

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError::Truncated(what));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }
    fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Range(what)),
        }
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        let s = self.take(2, what)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let s = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn len(&mut self, max: usize, what: &'static str) -> Result<usize, DecodeError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(DecodeError::Range(what));
        }
        Ok(n)
    }
    fn bytes(&mut self, max: usize, what: &'static str) -> Result<Vec<u8>, DecodeError> {
        let n = self.len(max, what)?;
        Ok(self.take(n, what)?.to_vec())
    }
    fn text(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let b = self.bytes(MAX_TEXT, what)?;
        String::from_utf8(b).map_err(|_| DecodeError::Range(what))
    }
    fn tokens(&mut self, what: &'static str) -> Result<Vec<u32>, DecodeError> {
        let n = self.len(MAX_TOKENS, what)?;
        let raw = self.take(n * 4, what)?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    fn kv_blocks(&mut self) -> Result<Vec<KvBlock>, DecodeError> {
        let n = self.len(MAX_KV_BLOCKS, "kv blocks")?;
        let mut v = Vec::with_capacity(n.min(256));
        for _ in 0..n {
            let block = self.u32("kv block")?;
            let mut prefix = [0u8; 16];
            prefix.copy_from_slice(self.take(16, "kv block prefix")?);
            v.push(KvBlock {
                block,
                prefix,
                checksum: self.u64("kv block checksum")?,
            });
        }
        Ok(v)
    }
    fn runs(&mut self) -> Result<Vec<(u32, u32)>, DecodeError> {
        let n = self.len(MAX_LIST, "pages")?;
        let mut pages = Vec::with_capacity(n.min(256));
        for _ in 0..n {
            pages.push((self.u32("page run")?, self.u32("page run")?));
        }
        Ok(pages)
    }
    fn params(&mut self) -> Result<SamplingParams, DecodeError> {
        let temperature = f32::from_bits(self.u32("temperature")?);
        if !temperature.is_finite() || temperature < 0.0 {
            return Err(DecodeError::Range("temperature"));
        }
        Ok(SamplingParams {
            temperature,
            top_k: self.u32("top_k")?,
            seed: self.u64("seed")?,
            max_new_tokens: self.u32("max_new_tokens")?,
        })
    }
}

fn role_code(r: Role) -> u8 {
    match r {
        Role::Primary => 0,
        Role::Shadow => 1,
        Role::Observer => 2,
        Role::Operator => 3,
    }
}

fn kind_code(k: RegionKind) -> u8 {
    match k {
        RegionKind::Weights => 0,
        RegionKind::Kv => 1,
    }
}

fn error_code(c: ErrorCode) -> u16 {
    match c {
        ErrorCode::StaleEpoch => 1,
        ErrorCode::NotPrimary => 2,
        ErrorCode::BrokerRestarted => 3,
        ErrorCode::BadRequest => 4,
        ErrorCode::NoCapacity => 5,
        ErrorCode::Backend => 6,
        ErrorCode::Forbidden => 7,
    }
}

fn msg_kind(m: &Msg) -> u16 {
    match m {
        Msg::Hello { .. } => 1,
        Msg::HelloOk { .. } => 2,
        Msg::ManifestReq => 3,
        Msg::Manifest { .. } => 4,
        Msg::Acquire { .. } => 5,
        Msg::Grant { .. } => 6,
        Msg::AllocWeights { .. } => 7,
        Msg::Publish { .. } => 8,
        Msg::Heartbeat { .. } => 9,
        Msg::Admit { .. } => 10,
        Msg::Commit { .. } => 11,
        Msg::LogList => 12,
        Msg::LogIds { .. } => 13,
        Msg::LogGet { .. } => 14,
        Msg::LogEntry(_) => 15,
        Msg::Release { .. } => 16,
        Msg::Fence => 17,
        Msg::Ok { .. } => 18,
        Msg::StatusReq => 19,
        Msg::StatusReply(_) => 20,
        Msg::Error { .. } => 21,
        Msg::KvNote { .. } => 22,
        Msg::KvAdoptReq { .. } => 23,
        Msg::KvAdoptable { .. } => 24,
        Msg::KvAdoptDone { .. } => 25,
    }
}

/// Encodes a message into one frame. Panics never; a message whose frame would exceed
/// [`MAX_FRAME`] is reported by [`frame_fits`] and refused by the sender.
pub fn encode(m: &Msg) -> Vec<u8> {
    let mut e = Enc(Vec::with_capacity(64));
    e.0.extend_from_slice(&MAGIC);
    e.u16(VERSION);
    e.u16(msg_kind(m));
    e.u32(0);
    body(&mut e, m);
    let len = (e.0.len() - HEADER_LEN) as u32;
    e.0[8..12].copy_from_slice(&len.to_le_bytes());
    e.0
}

/// Whether an encoded frame respects the size bound.
pub fn frame_fits(frame: &[u8]) -> bool {
    frame.len() <= MAX_FRAME
}

fn body(e: &mut Enc, m: &Msg) {
    match m {
        Msg::Hello {
            role,
            known_instance,
        } => {
            e.u8(role_code(*role));
            e.u64(*known_instance);
        }
        Msg::HelloOk {
            instance,
            worker_id,
            epoch,
            pid,
        } => {
            e.u64(*instance);
            e.u32(*worker_id);
            e.u64(*epoch);
            e.u32(*pid);
        }
        Msg::ManifestReq | Msg::LogList | Msg::Fence | Msg::StatusReq => {}
        Msg::Manifest { regions } => {
            e.len(regions.len());
            for r in regions {
                e.u8(kind_code(r.kind));
                e.u64(r.bytes);
                e.u64(r.version);
                e.u64(r.checksum);
                e.bool(r.published);
                e.u64(r.page_bytes);
                e.bytes(&r.meta);
            }
        }
        Msg::Acquire { page_bytes, pages } => {
            e.u64(*page_bytes);
            e.u32(*pages);
        }
        Msg::Grant {
            epoch,
            lease_ms,
            pages,
            weights_ok,
            takeover,
        } => {
            e.u64(*epoch);
            e.u32(*lease_ms);
            e.runs(pages);
            e.bool(*weights_ok);
            e.bool(*takeover);
        }
        Msg::AllocWeights {
            epoch,
            version,
            bytes,
        } => {
            e.u64(*epoch);
            e.u64(*version);
            e.u64(*bytes);
        }
        Msg::Publish {
            epoch,
            version,
            checksum,
            meta,
        } => {
            e.u64(*epoch);
            e.u64(*version);
            e.u64(*checksum);
            e.bytes(meta);
        }
        Msg::Heartbeat { epoch }
        | Msg::Release { epoch }
        | Msg::Ok { epoch }
        | Msg::KvAdoptDone { epoch } => e.u64(*epoch),
        Msg::KvNote { epoch, blocks } => {
            e.u64(*epoch);
            e.kv_blocks(blocks);
        }
        Msg::KvAdoptReq { epoch, from } => {
            e.u64(*epoch);
            e.u32(*from);
        }
        Msg::KvAdoptable {
            page_bytes,
            pages,
            blocks,
            more,
        } => {
            e.u64(*page_bytes);
            e.runs(pages);
            e.kv_blocks(blocks);
            e.bool(*more);
        }
        Msg::Admit {
            epoch,
            request_id,
            params,
            sampler_state,
            prompt,
        } => {
            e.u64(*epoch);
            e.u64(*request_id);
            e.params(params);
            e.u64(*sampler_state);
            e.tokens(prompt);
        }
        Msg::Commit { epoch, entries } => {
            e.u64(*epoch);
            e.len(entries.len());
            for c in entries {
                e.u64(c.request_id);
                e.u32(c.pos);
                e.tokens(&c.tokens);
                e.u64(c.sampler_state);
                e.bool(c.finished);
            }
        }
        Msg::LogIds { ids } => {
            e.len(ids.len());
            for &(id, fin) in ids {
                e.u64(id);
                e.bool(fin);
            }
        }
        Msg::LogGet { request_id } => e.u64(*request_id),
        Msg::LogEntry(l) => {
            e.u64(l.request_id);
            e.params(&l.params);
            e.tokens(&l.prompt);
            e.tokens(&l.generated);
            e.u64(l.sampler_state);
            e.bool(l.finished);
        }
        Msg::StatusReply(s) => {
            e.u64(s.instance);
            e.u64(s.epoch);
            e.u32(s.primary_pid);
            e.u32(s.shadows_waiting);
            e.bool(s.weights_ready);
            e.u32(s.takeovers);
            e.u32(s.weights_refused);
            e.u32(s.requests);
            e.u32(s.inflight);
            e.u64(s.last_health_us);
            e.u32(s.kv_free_pages);
        }
        Msg::Error { code, message } => {
            e.u16(error_code(*code));
            // Cut at a character boundary: the receiver refuses text that is not UTF-8.
            let mut end = message.len().min(MAX_TEXT);
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            e.bytes(&message.as_bytes()[..end]);
        }
    }
}

/// Decodes one frame. The header (magic, version, size bound) is checked before the body.
pub fn decode(frame: &[u8]) -> Result<Msg, DecodeError> {
    if frame.len() > MAX_FRAME {
        return Err(DecodeError::TooLarge(frame.len()));
    }
    if frame.len() < HEADER_LEN {
        return Err(DecodeError::Short(frame.len()));
    }
    let magic = [frame[0], frame[1], frame[2], frame[3]];
    if magic != MAGIC {
        return Err(DecodeError::Magic(magic));
    }
    let version = u16::from_le_bytes([frame[4], frame[5]]);
    if version != VERSION {
        return Err(DecodeError::Version { found: version });
    }
    let kind = u16::from_le_bytes([frame[6], frame[7]]);
    let declared = u32::from_le_bytes([frame[8], frame[9], frame[10], frame[11]]) as usize;
    let actual = frame.len() - HEADER_LEN;
    if declared != actual {
        return Err(DecodeError::Length { declared, actual });
    }
    let mut d = Dec {
        b: &frame[HEADER_LEN..],
    };
    let m = decode_body(&mut d, kind)?;
    if !d.b.is_empty() {
        return Err(DecodeError::Trailing(d.b.len()));
    }
    Ok(m)
}

fn decode_body(d: &mut Dec<'_>, kind: u16) -> Result<Msg, DecodeError> {
    Ok(match kind {
        1 => Msg::Hello {
            role: match d.u8("role")? {
                0 => Role::Primary,
                1 => Role::Shadow,
                2 => Role::Observer,
                3 => Role::Operator,
                _ => return Err(DecodeError::Range("role")),
            },
            known_instance: d.u64("known_instance")?,
        },
        2 => Msg::HelloOk {
            instance: d.u64("instance")?,
            worker_id: d.u32("worker_id")?,
            epoch: d.u64("epoch")?,
            pid: d.u32("pid")?,
        },
        3 => Msg::ManifestReq,
        4 => {
            let n = d.len(8, "regions")?;
            let mut regions = Vec::with_capacity(n);
            for _ in 0..n {
                regions.push(RegionInfo {
                    kind: match d.u8("region kind")? {
                        0 => RegionKind::Weights,
                        1 => RegionKind::Kv,
                        _ => return Err(DecodeError::Range("region kind")),
                    },
                    bytes: d.u64("bytes")?,
                    version: d.u64("version")?,
                    checksum: d.u64("checksum")?,
                    published: d.bool("published")?,
                    page_bytes: d.u64("page_bytes")?,
                    meta: d.bytes(MAX_META, "meta")?,
                });
            }
            Msg::Manifest { regions }
        }
        5 => Msg::Acquire {
            page_bytes: d.u64("page_bytes")?,
            pages: d.u32("pages")?,
        },
        6 => {
            let epoch = d.u64("epoch")?;
            let lease_ms = d.u32("lease_ms")?;
            Msg::Grant {
                epoch,
                lease_ms,
                pages: d.runs()?,
                weights_ok: d.bool("weights_ok")?,
                takeover: d.bool("takeover")?,
            }
        }
        7 => Msg::AllocWeights {
            epoch: d.u64("epoch")?,
            version: d.u64("version")?,
            bytes: d.u64("bytes")?,
        },
        8 => Msg::Publish {
            epoch: d.u64("epoch")?,
            version: d.u64("version")?,
            checksum: d.u64("checksum")?,
            meta: d.bytes(MAX_META, "meta")?,
        },
        9 => Msg::Heartbeat {
            epoch: d.u64("epoch")?,
        },
        10 => Msg::Admit {
            epoch: d.u64("epoch")?,
            request_id: d.u64("request_id")?,
            params: d.params()?,
            sampler_state: d.u64("sampler_state")?,
            prompt: d.tokens("prompt")?,
        },
        11 => {
            let epoch = d.u64("epoch")?;
            let n = d.len(MAX_LIST, "entries")?;
            let mut entries = Vec::with_capacity(n.min(256));
            for _ in 0..n {
                entries.push(CommitEntry {
                    request_id: d.u64("request_id")?,
                    pos: d.u32("pos")?,
                    tokens: d.tokens("tokens")?,
                    sampler_state: d.u64("sampler_state")?,
                    finished: d.bool("finished")?,
                });
            }
            Msg::Commit { epoch, entries }
        }
        12 => Msg::LogList,
        13 => {
            let n = d.len(MAX_LIST, "ids")?;
            let mut ids = Vec::with_capacity(n.min(256));
            for _ in 0..n {
                ids.push((d.u64("id")?, d.bool("finished")?));
            }
            Msg::LogIds { ids }
        }
        14 => Msg::LogGet {
            request_id: d.u64("request_id")?,
        },
        15 => Msg::LogEntry(RequestLog {
            request_id: d.u64("request_id")?,
            params: d.params()?,
            prompt: d.tokens("prompt")?,
            generated: d.tokens("generated")?,
            sampler_state: d.u64("sampler_state")?,
            finished: d.bool("finished")?,
        }),
        16 => Msg::Release {
            epoch: d.u64("epoch")?,
        },
        17 => Msg::Fence,
        18 => Msg::Ok {
            epoch: d.u64("epoch")?,
        },
        19 => Msg::StatusReq,
        20 => Msg::StatusReply(Status {
            instance: d.u64("instance")?,
            epoch: d.u64("epoch")?,
            primary_pid: d.u32("primary_pid")?,
            shadows_waiting: d.u32("shadows_waiting")?,
            weights_ready: d.bool("weights_ready")?,
            takeovers: d.u32("takeovers")?,
            weights_refused: d.u32("weights_refused")?,
            requests: d.u32("requests")?,
            inflight: d.u32("inflight")?,
            last_health_us: d.u64("last_health_us")?,
            kv_free_pages: d.u32("kv_free_pages")?,
        }),
        21 => Msg::Error {
            code: match d.u16("error code")? {
                1 => ErrorCode::StaleEpoch,
                2 => ErrorCode::NotPrimary,
                3 => ErrorCode::BrokerRestarted,
                4 => ErrorCode::BadRequest,
                5 => ErrorCode::NoCapacity,
                6 => ErrorCode::Backend,
                7 => ErrorCode::Forbidden,
                _ => return Err(DecodeError::Range("error code")),
            },
            message: d.text("message")?,
        },
        22 => Msg::KvNote {
            epoch: d.u64("epoch")?,
            blocks: d.kv_blocks()?,
        },
        23 => Msg::KvAdoptReq {
            epoch: d.u64("epoch")?,
            from: d.u32("from")?,
        },
        24 => Msg::KvAdoptable {
            page_bytes: d.u64("page_bytes")?,
            pages: d.runs()?,
            blocks: d.kv_blocks()?,
            more: d.bool("more")?,
        },
        25 => Msg::KvAdoptDone {
            epoch: d.u64("epoch")?,
        },
        k => return Err(DecodeError::Kind(k)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Msg> {
        let params = SamplingParams {
            temperature: 0.7,
            top_k: 40,
            seed: 9,
            max_new_tokens: 32,
        };
        vec![
            Msg::Hello {
                role: Role::Shadow,
                known_instance: 7,
            },
            Msg::Hello {
                role: Role::Operator,
                known_instance: 0,
            },
            Msg::Error {
                code: ErrorCode::Forbidden,
                message: "uid 65534 may not use this broker".into(),
            },
            Msg::Grant {
                epoch: 3,
                lease_ms: 500,
                pages: vec![(0, 4), (9, 2)],
                weights_ok: true,
                takeover: false,
            },
            Msg::Manifest {
                regions: vec![RegionInfo {
                    kind: RegionKind::Weights,
                    bytes: 10,
                    version: 2,
                    checksum: 5,
                    published: true,
                    page_bytes: 0,
                    meta: b"{}".to_vec(),
                }],
            },
            Msg::Admit {
                epoch: 1,
                request_id: 4,
                params,
                sampler_state: 11,
                prompt: vec![1, 2, 3],
            },
            Msg::Commit {
                epoch: 2,
                entries: vec![CommitEntry {
                    request_id: 4,
                    pos: 0,
                    tokens: vec![5],
                    sampler_state: 12,
                    finished: true,
                }],
            },
            Msg::LogEntry(RequestLog {
                request_id: 4,
                params,
                prompt: vec![1],
                generated: vec![2, 3],
                sampler_state: 1,
                finished: false,
            }),
            Msg::StatusReply(Status {
                instance: 1,
                epoch: 2,
                ..Status::default()
            }),
            Msg::Error {
                code: ErrorCode::StaleEpoch,
                message: "old".into(),
            },
            Msg::Fence,
            Msg::KvNote {
                epoch: 4,
                blocks: vec![KvBlock {
                    block: 9,
                    prefix: [7; 16],
                    checksum: u64::MAX - 1,
                }],
            },
            Msg::KvAdoptReq { epoch: 4, from: 3 },
            Msg::KvAdoptable {
                page_bytes: 2 << 20,
                pages: vec![(128, 128)],
                blocks: vec![
                    KvBlock {
                        block: 1,
                        prefix: [1; 16],
                        checksum: 2,
                    },
                    KvBlock {
                        block: 5,
                        prefix: [3; 16],
                        checksum: 4,
                    },
                ],
                more: true,
            },
            Msg::KvAdoptDone { epoch: 4 },
        ]
    }

    #[test]
    fn the_most_kv_blocks_a_message_holds_fit_a_frame() {
        let b = KvBlock {
            block: u32::MAX,
            prefix: [0xff; 16],
            checksum: u64::MAX,
        };
        let m = Msg::KvAdoptable {
            page_bytes: u64::MAX,
            pages: vec![(0, 1); 8],
            blocks: vec![b; MAX_KV_BLOCKS],
            more: true,
        };
        assert!(frame_fits(&encode(&m)));
        let mut over = encode(&Msg::KvNote {
            epoch: 1,
            blocks: vec![b],
        });
        over[HEADER_LEN + 8..HEADER_LEN + 12]
            .copy_from_slice(&(MAX_KV_BLOCKS as u32 + 1).to_le_bytes());
        assert_eq!(decode(&over), Err(DecodeError::Range("kv blocks")));
    }

    #[test]
    fn round_trip() {
        for m in samples() {
            let f = encode(&m);
            assert!(frame_fits(&f));
            assert_eq!(decode(&f).unwrap(), m);
        }
    }

    #[test]
    fn rejects_bad_frames() {
        let f = encode(&Msg::Heartbeat { epoch: 1 });
        assert!(matches!(decode(&f[..5]), Err(DecodeError::Short(5))));
        let mut g = f.clone();
        g[0] = b'X';
        assert!(matches!(decode(&g), Err(DecodeError::Magic(_))));
        let mut g = f.clone();
        g[4] = 9;
        assert!(matches!(decode(&g), Err(DecodeError::Version { found: 9 })));
        let mut g = f.clone();
        g.push(0);
        assert!(matches!(decode(&g), Err(DecodeError::Length { .. })));
        let mut g = f.clone();
        g[6] = 99;
        assert!(matches!(decode(&g), Err(DecodeError::Kind(99))));
        assert!(matches!(
            decode(&vec![0u8; MAX_FRAME + 1]),
            Err(DecodeError::TooLarge(_))
        ));
        // A token count far beyond the frame.
        let mut g = encode(&Msg::Commit {
            epoch: 1,
            entries: vec![CommitEntry {
                request_id: 1,
                pos: 0,
                tokens: vec![],
                sampler_state: 0,
                finished: false,
            }],
        });
        let at = HEADER_LEN + 8 + 4 + 8 + 4;
        g[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert!(decode(&g).is_err());
    }

    #[test]
    fn a_long_error_message_is_cut_at_a_character_boundary() {
        // 3 bytes each: byte 4096 falls inside a character.
        let m = Msg::Error {
            code: ErrorCode::Backend,
            message: "€".repeat(2000),
        };
        match decode(&encode(&m)).unwrap() {
            Msg::Error { message, .. } => assert_eq!(message, "€".repeat(MAX_TEXT / 3)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_prefix_of_every_frame_is_refused() {
        for m in samples() {
            let f = encode(&m);
            for cut in 0..f.len() {
                assert!(decode(&f[..cut]).is_err());
            }
        }
    }
}
