//! The reference model: GGUF reading, dequantization into broker memory, Llama forward pass.

pub mod attention;
pub mod dequant;
pub mod gguf;
pub mod kv;
pub mod layout;
pub mod llama;
pub mod sampler;
