//! The shim's layers (see `src/lib.rs`): every `crate::…` path in a module names a module of its
//! own layer or one below, and the modules' graph has no cycle. Reads the sources only, no root:
//!
//! ```text
//! cargo test -p belayer-shim --test layers
//! ```
//!
//! A module added to `src/` must be given its layer in [`LAYERS`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of the shim's library (a file `src/x.rs` or a directory `src/x/`) and
/// its layer: a module may use those of its layer and below.
const LAYERS: &[(&str, u8)] = &[
    // 1. primitives
    ("archive", 1),
    ("busy", 1),
    ("cgroup", 1),
    ("criu_conf", 1),
    ("error", 1),
    ("export", 1),
    ("journal", 1),
    ("netns", 1),
    ("process", 1),
    ("reaper", 1),
    ("rootfs", 1),
    ("runc", 1),
    ("spec", 1),
    ("stdio", 1),
    // 2. the container
    ("container", 2),
    // 3. the engine
    ("engine", 3),
    // 4. adapters
    ("control", 4),
    ("service", 4),
    ("task", 4),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None`: the binary's `main.rs`, `lib.rs`).
fn module_of(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src()).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.strip_suffix(".rs") {
        Some("lib" | "main") => None,
        Some(m) => Some(m.to_string()),
        None => Some(first),
    }
}

/// The top-level modules that `text`'s code (comments left out) names through `crate::`.
fn uses(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `crate::{a::x, b}`: each item's first segment.
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        out.insert(name);
                    }
                }
                continue;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// The graph: each top-level module → the modules it names.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in all {
        let Some(m) = module_of(&f) else { continue };
        let used = uses(&std::fs::read_to_string(&f).unwrap());
        let entry = g.entry(m.clone()).or_default();
        entry.extend(used.into_iter().filter(|u| *u != m));
    }
    g
}

fn layer(m: &str) -> u8 {
    LAYERS
        .iter()
        .find(|(n, _)| *n == m)
        .map(|(_, l)| *l)
        .unwrap_or_else(|| panic!("module {m} has no layer in tests/layers.rs LAYERS"))
}

#[test]
fn every_module_has_a_layer() {
    for m in graph().keys() {
        layer(m);
    }
}

#[test]
fn no_module_uses_a_layer_above_its_own() {
    let mut upward = Vec::new();
    for (m, used) in graph() {
        for u in used {
            if layer(&u) > layer(&m) {
                upward.push(format!(
                    "{m} (layer {}) uses {u} (layer {})",
                    layer(&m),
                    layer(&u)
                ));
            }
        }
    }
    assert!(upward.is_empty(), "upward edges:\n{}", upward.join("\n"));
}

#[test]
fn the_module_graph_has_no_cycle() {
    let g = graph();
    // Depth-first, with the path so far: a module met again on it closes a cycle.
    fn visit(
        m: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut cycle = path[i..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for u in g.get(m).into_iter().flatten() {
            if let Some(c) = visit(u, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for m in g.keys() {
        if let Some(cycle) = visit(m, &g, &mut Vec::new(), &mut done) {
            panic!("module cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_parser_sees_grouped_and_inline_paths_and_skips_comments() {
    let text = "use crate::{engine::Engine, error};\nlet x = crate::runc::runc_root(ns);\n/// [`crate::task`]\nfoo(); // crate::control\n";
    let got: Vec<String> = uses(text).into_iter().collect();
    assert_eq!(got, ["engine", "error", "runc"]);
}
