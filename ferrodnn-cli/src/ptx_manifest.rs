//! `ferrodnn ptx-manifest`: the PTX of every kernel the check cases and the benchmark suites
//! compile, for sm_80 and sm_90a, as one line per kernel (`graph arch index entry hash`), with the
//! PTX itself kept by hash in a folder. Two manifests written before and after a change to the
//! kernel generators show which kernels' code changed: equal PTX compiles to equal machine code.
//! Needs NVRTC, no GPU.

use ferrodnn::engine::cuda::cache::Fnv128;
use ferrodnn::engine::cuda::{compile_ptx, kernel_sources, CompileOptions, Target};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// Writes the manifest to `out` and each distinct PTX to `ptx_dir/<hash>.ptx` when given.
pub fn ptx_manifest(out: &Path, ptx_dir: Option<&Path>, filter: Option<&str>) -> Result<(), String> {
    let mut graphs: Vec<(String, ferrodnn::Graph)> = ferrodnn::testing::cases::all().into_iter().map(|c| (c.name, c.graph)).collect();
    for suite in ["memory-bound", "gemm", "attention"] {
        graphs.extend(crate::bench::suite(suite)?.into_iter().map(|w| (format!("bench:{}", w.id), w.graph)));
    }
    graphs.retain(|(name, _)| filter.is_none_or(|f| name.contains(f)));
    // Every (graph, arch) kernel list, and the distinct (source, arch) pairs to compile.
    let mut lines: Vec<(String, String, usize, String, (String, String))> = Vec::new();
    let mut sources: BTreeMap<(String, String), String> = BTreeMap::new();
    for (name, graph) in &graphs {
        for target in [Target::sm80(), Target::sm90a()] {
            match kernel_sources(graph, &target) {
                Ok(list) => {
                    for (i, (entry, src)) in list.into_iter().enumerate() {
                        let key = (src, target.arch.clone());
                        sources.entry(key.clone()).or_insert_with(|| entry.clone());
                        lines.push((name.clone(), target.arch.clone(), i, entry, key));
                    }
                }
                Err(e) => lines.push((name.clone(), target.arch.clone(), 0, format!("unsupported: {e}").replace(['\n', ' '], "_"), (String::new(), String::new()))),
            }
        }
    }
    if let Some(dir) = ptx_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    eprintln!("{} graphs, {} kernels, {} distinct (source, arch) pairs", graphs.len(), lines.len(), sources.len());
    let done = std::sync::atomic::AtomicUsize::new(0);
    let hashes: BTreeMap<(String, String), String> = sources
        .par_iter()
        .map(|((src, arch), entry)| {
            let hash = match compile_ptx(src, entry, &CompileOptions::new(arch.as_str())) {
                Ok(ptx) => {
                    let mut h = Fnv128::new();
                    h.write(ptx.as_bytes());
                    let hex = format!("{:032x}", h.finish());
                    if let Some(dir) = ptx_dir {
                        let _ = std::fs::write(dir.join(format!("{hex}.ptx")), &ptx);
                    }
                    hex
                }
                Err(e) => format!("error:{}", e.to_string().lines().next().unwrap_or("").replace(' ', "_")),
            };
            let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if n % 200 == 0 {
                eprintln!("{n} compiled");
            }
            ((src.clone(), arch.clone()), hash)
        })
        .collect();
    let mut text = String::new();
    for (name, arch, i, entry, key) in &lines {
        let hash = hashes.get(key).map_or("-", |h| h.as_str());
        text += &format!("{name} {arch} {i} {entry} {hash}\n");
    }
    std::fs::write(out, text).map_err(|e| format!("{}: {e}", out.display()))?;
    let errors = hashes.values().filter(|h| h.starts_with("error:")).count();
    eprintln!("wrote {} ({} kernels, {errors} failed to compile)", out.display(), lines.len());
    Ok(())
}
