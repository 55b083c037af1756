//! The CUDA engine's modules import each other without loops: each top-level module of
//! `engine/cuda` (a file or a folder) may use those below it, never one that uses it back. And
//! production code never imports the `testing` module. Read from the sources, so it needs no GPU.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The text of a source file without its `#[cfg(test)]` modules (tests may use anything).
fn production_part(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod ").map_or(text, |at| &text[..at])
}

/// The top-level module of engine/cuda a file belongs to (`gemm` for gemm/sm90.rs).
fn module_of(cuda: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(cuda).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

/// The first path segment after a `prefix::` at the start of `r`: `gemm` for `gemm::unit(...`, and
/// each item's for a group, `{attention, fallback, gemm::tune}`.
fn first_segments(r: &str) -> Vec<String> {
    let ident = |s: &str| -> String { s.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    match r.strip_prefix('{') {
        Some(group) => {
            let (mut depth, mut end) = (1, group.len());
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            // Items at the group's top level only.
            let mut items = Vec::new();
            let (mut d, mut start) = (0, 0);
            for (i, c) in group[..end].char_indices() {
                match c {
                    '{' => d += 1,
                    '}' => d -= 1,
                    ',' if d == 0 => {
                        items.push(ident(&group[start..i]));
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            items.push(ident(&group[start..end]));
            items
        }
        None => vec![ident(r)],
    }
}

#[test]
fn engine_cuda_modules_import_without_loops() {
    let cuda = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine/cuda");
    let mut files = Vec::new();
    rust_files(&cuda, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&cuda, f)).filter(|m| m != "mod").collect();
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let from = module_of(&cuda, f);
        if from == "mod" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        let text = production_part(&text);
        // `crate::engine::cuda::X` anywhere; `super::X` in a top-level file (in a folder's files,
        // `super::` is the folder's own module, so only `super::super::X` leaves it).
        let top_level = f.parent() == Some(cuda.as_path());
        let mut refs: Vec<&str> = text.split("crate::engine::cuda::").skip(1).collect();
        let prefix = if top_level { "super::" } else { "super::super::" };
        refs.extend(text.split(prefix).skip(1));
        for r in refs {
            for name in first_segments(r) {
                if modules.contains(&name) && name != from {
                    uses.entry(from.clone()).or_default().insert(name);
                }
            }
        }
        if from != "mod" {
            assert!(!text.contains("crate::testing"), "{}: production code imports the testing module", f.display());
        }
    }
    // Depth-first search for a cycle.
    fn visit(m: &str, uses: &BTreeMap<String, BTreeSet<String>>, stack: &mut Vec<String>, done: &mut BTreeSet<String>) {
        if done.contains(m) {
            return;
        }
        if let Some(at) = stack.iter().position(|s| s == m) {
            panic!("import loop: {} -> {m}", stack[at..].join(" -> "));
        }
        stack.push(m.to_string());
        for n in uses.get(m).into_iter().flatten() {
            visit(n, uses, stack, done);
        }
        stack.pop();
        done.insert(m.to_string());
    }
    let mut done = BTreeSet::new();
    for m in &modules {
        visit(m, &uses, &mut Vec::new(), &mut done);
    }
    // The kernel layer is at the bottom: it uses nothing of engine/cuda but the TMA descriptor.
    let kernel_uses: Vec<&String> = uses.get("kernel").into_iter().flatten().filter(|m| *m != "tma").collect();
    assert!(kernel_uses.is_empty(), "kernel/ uses {kernel_uses:?}");
    assert!(uses.get("planner").is_some_and(|u| u.contains("kernel")), "{uses:?}");
}
