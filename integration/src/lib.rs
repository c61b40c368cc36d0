//! End-to-end test harness: a private containerd, local images, and the scenario suites.
