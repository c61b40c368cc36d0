//! Shared wire vectors: the frames in `vllm-plugin/tests/vectors/*.bin` are what this codec
//! encodes for the messages below, and what the vLLM plugin's Python codec must encode and
//! decode too (`vllm-plugin/tests/test_wire_vectors.py` holds the same messages as Python
//! values). `bad-*.bin` are frames both decoders must refuse. `BELAYER_WRITE_VECTORS=1 cargo test
//! -p gpu-broker --test wire_vectors` rewrites the files after a deliberate protocol change.

use std::path::PathBuf;

use gpu_broker::wire::{
    CommitEntry, ErrorCode, KvBlock, Msg, RegionInfo, RegionKind, RequestLog, Role, SamplingParams,
    Status, decode, encode,
};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("vllm-plugin/tests/vectors")
}

fn params() -> SamplingParams {
    SamplingParams {
        temperature: 0.7,
        top_k: 40,
        seed: 0x0123_4567_89ab_cdef,
        max_new_tokens: 256,
    }
}

fn vectors() -> Vec<(&'static str, Msg)> {
    vec![
        (
            "hello-shadow",
            Msg::Hello {
                role: Role::Shadow,
                known_instance: 0x1122_3344_5566_7788,
            },
        ),
        (
            "hello-operator",
            Msg::Hello {
                role: Role::Operator,
                known_instance: 0,
            },
        ),
        (
            "hello-ok",
            Msg::HelloOk {
                instance: u64::MAX,
                worker_id: 7,
                epoch: 3,
                pid: 4242,
            },
        ),
        ("manifest-req", Msg::ManifestReq),
        (
            "manifest",
            Msg::Manifest {
                regions: vec![
                    RegionInfo {
                        kind: RegionKind::Weights,
                        bytes: 270_000_128,
                        version: 0xfeed,
                        checksum: 0xdead_beef_cafe_f00d,
                        published: true,
                        page_bytes: 0,
                        meta: b"Z\x00layout".to_vec(),
                    },
                    RegionInfo {
                        kind: RegionKind::Kv,
                        bytes: 1 << 30,
                        version: 0,
                        checksum: 0,
                        published: false,
                        page_bytes: 2 << 20,
                        meta: Vec::new(),
                    },
                ],
            },
        ),
        (
            "acquire",
            Msg::Acquire {
                page_bytes: 2 << 20,
                pages: 256,
            },
        ),
        (
            "grant",
            Msg::Grant {
                epoch: 2,
                lease_ms: 3000,
                pages: vec![(0, 256), (300, 4)],
                weights_ok: false,
                takeover: true,
            },
        ),
        (
            "alloc-weights",
            Msg::AllocWeights {
                epoch: 1,
                version: 9,
                bytes: 4096,
            },
        ),
        (
            "publish",
            Msg::Publish {
                epoch: 1,
                version: 9,
                checksum: 0x0102_0304_0506_0708,
                meta: vec![0, 1, 2, 255],
            },
        ),
        ("heartbeat", Msg::Heartbeat { epoch: 5 }),
        (
            "admit",
            Msg::Admit {
                epoch: 1,
                request_id: 0xabcdef,
                params: params(),
                sampler_state: 0,
                prompt: vec![1, 9690, 198, 49151],
            },
        ),
        (
            "commit",
            Msg::Commit {
                epoch: 4,
                entries: vec![
                    CommitEntry {
                        request_id: 1,
                        pos: 0,
                        tokens: vec![7042, 30],
                        sampler_state: 0,
                        finished: false,
                    },
                    CommitEntry {
                        request_id: 2,
                        pos: 17,
                        tokens: Vec::new(),
                        sampler_state: 99,
                        finished: true,
                    },
                ],
            },
        ),
        ("log-list", Msg::LogList),
        (
            "log-ids",
            Msg::LogIds {
                ids: vec![(1, false), (u64::MAX, true)],
            },
        ),
        ("log-get", Msg::LogGet { request_id: 77 }),
        (
            "log-entry",
            Msg::LogEntry(RequestLog {
                request_id: 77,
                params: SamplingParams {
                    temperature: 0.0,
                    top_k: 0,
                    seed: 0,
                    max_new_tokens: 64,
                },
                prompt: vec![1, 2, 3],
                generated: vec![4, 5],
                sampler_state: 12,
                finished: false,
            }),
        ),
        ("release", Msg::Release { epoch: 8 }),
        ("fence", Msg::Fence),
        ("ok", Msg::Ok { epoch: 9 }),
        ("status-req", Msg::StatusReq),
        (
            "kv-note",
            Msg::KvNote {
                epoch: 6,
                blocks: vec![
                    KvBlock {
                        block: 1,
                        prefix: *b"0123456789abcdef",
                        checksum: 0x0102_0304_0506_0708,
                    },
                    KvBlock {
                        block: u32::MAX,
                        prefix: [0xff; 16],
                        checksum: u64::MAX,
                    },
                ],
            },
        ),
        (
            "kv-adopt-req",
            Msg::KvAdoptReq {
                epoch: 6,
                from: 300,
            },
        ),
        (
            "kv-adoptable",
            Msg::KvAdoptable {
                page_bytes: 2 << 20,
                pages: vec![(0, 128)],
                blocks: vec![KvBlock {
                    block: 300,
                    prefix: [0; 16],
                    checksum: 42,
                }],
                more: true,
            },
        ),
        ("kv-adopt-done", Msg::KvAdoptDone { epoch: 6 }),
        (
            "status-reply",
            Msg::StatusReply(Status {
                instance: 1,
                epoch: 2,
                primary_pid: 3,
                shadows_waiting: 4,
                weights_ready: true,
                takeovers: 5,
                weights_refused: 6,
                requests: 7,
                inflight: 8,
                last_health_us: 9,
                kv_free_pages: 10,
            }),
        ),
        (
            "error",
            Msg::Error {
                code: ErrorCode::BrokerRestarted,
                message: "broker restarted: instance ä → ü".into(),
            },
        ),
    ]
}

/// Frames both decoders refuse, derived from good ones.
fn bad_vectors() -> Vec<(&'static str, Vec<u8>)> {
    let hello = encode(&vectors()[0].1);
    let admit = encode(&vectors()[10].1);
    let grant = encode(&vectors()[6].1);
    let mut magic = hello.clone();
    magic[0] = b'X';
    let mut version = hello.clone();
    version[4] = 2;
    let mut trailing = hello.clone();
    trailing.push(0);
    trailing[8] += 1;
    let mut truncated = hello.clone();
    truncated.pop();
    truncated[8] -= 1;
    let mut kind = hello.clone();
    kind[6] = 99;
    let mut role = hello.clone();
    role[12] = 4;
    let mut flag = grant.clone();
    let n = flag.len();
    flag[n - 1] = 2;
    // Admit: header 12, epoch 8, id 8, temperature 4 at offset 28.
    let mut temperature = admit.clone();
    temperature[28..32].copy_from_slice(&(-1.0f32).to_bits().to_le_bytes());
    // Prompt length field after params (20) and sampler state (8): offset 56.
    let mut tokens = admit;
    tokens[56..60].copy_from_slice(&(12 * 1024 + 1u32).to_le_bytes());
    // KvNote: header 12, epoch 8, then the block count: one over the bound.
    let mut kv_blocks = encode(&Msg::KvNote {
        epoch: 1,
        blocks: Vec::new(),
    });
    kv_blocks[20..24].copy_from_slice(&(2048 + 1u32).to_le_bytes());
    vec![
        ("bad-kv-block-count", kv_blocks),
        ("bad-magic", magic),
        ("bad-version", version),
        ("bad-trailing", trailing),
        ("bad-truncated", truncated),
        ("bad-kind", kind),
        ("bad-role", role),
        ("bad-bool", flag),
        ("bad-temperature", temperature),
        ("bad-token-count", tokens),
        ("bad-short", b"BLGB\x01\x00".to_vec()),
    ]
}

#[test]
fn shared_vectors_match_this_codec() {
    let write = std::env::var_os("BELAYER_WRITE_VECTORS").is_some();
    if write {
        std::fs::create_dir_all(dir()).unwrap();
    }
    for (name, msg) in vectors() {
        let path = dir().join(format!("{name}.bin"));
        let frame = encode(&msg);
        if write {
            std::fs::write(&path, &frame).unwrap();
        }
        let file = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (BELAYER_WRITE_VECTORS=1 writes it)",
                path.display()
            )
        });
        assert_eq!(
            file, frame,
            "{name}: the file differs from this codec's encoding"
        );
        assert_eq!(
            decode(&file).unwrap(),
            msg,
            "{name}: decodes to another message"
        );
    }
    for (name, frame) in bad_vectors() {
        let path = dir().join(format!("{name}.bin"));
        if write {
            std::fs::write(&path, &frame).unwrap();
        }
        let file = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(file, frame, "{name}");
        assert!(decode(&file).is_err(), "{name}: decoded, must be refused");
    }
}
