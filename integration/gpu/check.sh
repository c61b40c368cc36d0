#!/usr/bin/env bash
# GPU check for the gpu-broker CUDA VMM backend (meant to live at integration/gpu/check.sh).
# On an NVIDIA machine: builds gpu-broker with --features cuda and runs the CUDA tests:
# export → import → map in one process; then for 1, 2, 4, 8, 10 GiB a writer process fills
# broker-owned device memory and is SIGKILLed, the broker keeps the data and passes its health
# checks, and a new process imports + maps + verifies it (import+map time printed per size).
# Budget: under 8 minutes. Env: BELAYER_CUDA_GIB (comma list of sizes), CARGO_TARGET_DIR.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel 2>/dev/null || (cd "$here/.." && pwd))
cd "$root"

die() { printf 'gpu-check: %s\n' "$*" >&2; exit 1; }
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this is not an NVIDIA machine"
nvidia-smi -L || die "nvidia-smi sees no GPU"
command -v cargo >/dev/null || die "cargo is not on PATH"

start=$(date +%s)
timeout 300 cargo build --release -p gpu-broker --features cuda --bins --tests -q \
  || die "build with --features cuda failed or took over 5 minutes"
echo "gpu-check: built in $(( $(date +%s) - start ))s"
timeout $(( 470 - ($(date +%s) - start) )) \
  cargo test --release -p gpu-broker --features cuda --test cuda -- --include-ignored --nocapture --test-threads=1 \
  || die "CUDA backend tests failed"
echo "gpu-check: passed in $(( $(date +%s) - start ))s"
