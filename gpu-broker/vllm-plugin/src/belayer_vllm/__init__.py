"""Belayer's vLLM plugin: the model weights, the KV cache buffer and the token log live in
belayer-gpu-broker, so a pre-started shadow vLLM takes over when the primary dies."""
