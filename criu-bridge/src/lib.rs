//! criu-bridge: see README.md.
