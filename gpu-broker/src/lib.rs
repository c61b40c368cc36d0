//! gpu-broker: see README.md.
