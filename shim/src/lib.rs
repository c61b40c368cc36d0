//! The Belayer containerd shim v2.
