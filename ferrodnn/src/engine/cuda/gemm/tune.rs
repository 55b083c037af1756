//! Autotuning of the Hopper GEMM kernel's configuration: in a plan built with the `autotune`
//! knob (`PlanPolicy::autotune`), each GEMM problem the heuristic ([`super::sm90::choose`])
//! would run with one tile configuration is instead timed once on the device in each of a few
//! candidate configurations ([`super::sm90::tuning_configs`]: the heuristic's first, then other
//! tile widths and tile orders), and the fastest is kept in a cache, in memory and on disk,
//! keyed by the problem (shapes, strides, types, precision flags) and the device.
//!
//! Disk layer: one small JSON file per problem, `tune/<hash>.json` under the kernel cache's
//! folder (see `cache.rs`), written to a temporary name and renamed into place. A file that does
//! not parse, or whose key differs, is ignored (and replaced by the next tuning).

use super::sm90::Config;
use super::GemmProblem;
use crate::engine::cuda::cache::KernelCache;
use crate::engine::cuda::kernel::Target;
use crate::graph::Fnv64;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// What a tuning keeps: the parts of [`Config`] the candidates differ in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tuned {
    pub bn: usize,
    pub stages: usize,
    pub group_m: usize,
}

impl Tuned {
    pub fn of(cfg: &Config) -> Tuned {
        Tuned { bn: cfg.bn, stages: cfg.stages, group_m: cfg.group_m }
    }
    /// `base` with this tuning's choices.
    pub fn apply(&self, base: Config) -> Config {
        Config { bn: self.bn, stages: self.stages, group_m: self.group_m, ..base }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    key: String,
    tuned: Tuned,
}

/// The problem's tuning key: the device (architecture and SM count) and everything about the
/// problem that the kernel's speed depends on, but not which tensors it reads.
pub fn key(p: &GemmProblem, target: &Target) -> String {
    let op = |o: &super::Operand| format!("{}:{}x{}:{},{},{}", o.dtype, o.rows, o.cols, o.row_stride, o.col_stride, o.batch_stride);
    // (Groups named only where there are several: the keys of other problems stay as they were.)
    let groups = if p.groups > 1 { format!("/g{}", p.groups) } else { String::new() };
    format!(
        "{}/{}/b{}m{}n{}k{}/a{}/b{}/c{}/tf32{}/fp8fast{}{groups}",
        target.arch,
        target.sm_count,
        p.batch,
        p.m,
        p.n,
        p.k,
        op(&p.a),
        op(&p.b),
        op(&p.c),
        p.allow_tf32 as u8,
        p.fast_fp8 as u8
    )
}

/// Tuned configurations by key, in memory and on disk.
pub struct TuneCache {
    memory: Mutex<HashMap<String, Tuned>>,
    dir: Option<PathBuf>,
}

impl TuneCache {
    /// The process's cache, on disk beside the kernel cache.
    pub fn global() -> &'static TuneCache {
        static CACHE: OnceLock<TuneCache> = OnceLock::new();
        CACHE.get_or_init(|| TuneCache::with_dir(KernelCache::global().dir().map(|d| d.join("tune"))))
    }

    /// A cache whose disk layer is `dir` (none: memory only).
    pub fn with_dir(dir: Option<PathBuf>) -> TuneCache {
        TuneCache { memory: Mutex::new(HashMap::new()), dir }
    }

    fn path(&self, key: &str) -> Option<PathBuf> {
        let mut h = Fnv64::new();
        h.write(key.as_bytes());
        self.dir.as_ref().map(|d| d.join(format!("{:016x}.json", h.finish())))
    }

    /// The tuning of `key`, from memory or disk.
    pub fn get(&self, key: &str) -> Option<Tuned> {
        if let Some(t) = self.memory.lock().ok().and_then(|m| m.get(key).copied()) {
            return Some(t);
        }
        let text = std::fs::read_to_string(self.path(key)?).ok()?;
        let e: Entry = serde_json::from_str(&text).ok()?;
        if e.key != key {
            return None;
        }
        if let Ok(mut m) = self.memory.lock() {
            m.insert(key.to_string(), e.tuned);
        }
        Some(e.tuned)
    }

    /// Keeps `tuned` for `key` (a disk that cannot be written only loses it at exit).
    pub fn put(&self, key: &str, tuned: Tuned) {
        if let Ok(mut m) = self.memory.lock() {
            m.insert(key.to_string(), tuned);
        }
        let (Some(path), Some(dir)) = (self.path(key), self.dir.as_ref()) else { return };
        let Ok(text) = serde_json::to_string(&Entry { key: key.to_string(), tuned }) else { return };
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
        let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
        if std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path)).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tunings_persist_by_key() {
        let dir = std::env::temp_dir().join(format!("ferrodnn-tune-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let t = Tuned { bn: 128, stages: 4, group_m: 8 };
        {
            let c = TuneCache::with_dir(Some(dir.clone()));
            assert_eq!(c.get("k1"), None);
            c.put("k1", t);
            assert_eq!(c.get("k1"), Some(t));
        }
        // A new cache (a new process) reads it from disk; another key is not there.
        let c = TuneCache::with_dir(Some(dir.clone()));
        assert_eq!(c.get("k1"), Some(t));
        assert_eq!(c.get("k2"), None);
        // A file with another key (a hash collision) or that does not parse is not taken.
        let p = c.path("k2").unwrap();
        std::fs::write(&p, r#"{"key":"other","tuned":{"bn":256,"stages":3,"group_m":4}}"#).unwrap();
        assert_eq!(TuneCache::with_dir(Some(dir.clone())).get("k2"), None);
        std::fs::write(&p, "not json").unwrap();
        assert_eq!(TuneCache::with_dir(Some(dir.clone())).get("k2"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
