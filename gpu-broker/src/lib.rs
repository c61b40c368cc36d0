//! gpu-broker: a broker that owns model weights, a paged KV arena and a token log so that rollout
//! workers can die and a pre-started shadow takes over. See README.md for the protocol.

pub mod backend;
pub mod broker;
pub mod checksum;
pub mod client;
pub mod mapping;
pub mod model;
pub mod pidfd;
pub mod seqpacket;
pub mod vllm;
pub mod wire;
pub mod worker;
