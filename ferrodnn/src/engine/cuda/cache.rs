//! The kernel cache: compiled cubins kept in memory and on disk, keyed by a stable 128-bit hash
//! of the kernel source, the target (architecture and options) and the toolchain (NVRTC version).
//!
//! Disk layer: one file per kernel under the cache folder, `$FERRODNN_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/ferrodnn/kernels`, else `~/.cache/ferrodnn/kernels`; `FERRODNN_KERNEL_CACHE=0`
//! turns it off. A file is a 48-byte header then the cubin:
//!
//! | bytes | field |
//! |-------|-------|
//! | 0..8 | magic `FDNNKRN\0` |
//! | 8..12 | format version (u32 LE) |
//! | 12..16 | reserved, 0 |
//! | 16..32 | key (u128 LE) |
//! | 32..40 | payload length (u64 LE) |
//! | 40..48 | payload checksum: FNV-1a 64 (u64 LE) |
//!
//! A file that fails any check (short, wrong magic, version, key, length or checksum) is deleted
//! and the kernel recompiled; it is never loaded. Files are written to a temporary name in the same
//! folder and renamed into place, so readers see a whole entry or none. A disk that cannot be
//! read or written only costs speed: the memory layer still works.

use crate::error::{Error, Result};
use crate::graph::Fnv64;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

const MAGIC: &[u8; 8] = b"FDNNKRN\0";
const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = 48;
/// Entries larger than this are not kernels; refuse to read them.
const MAX_ENTRY_BYTES: u64 = 1 << 30;

/// FNV-1a, 128-bit: stable across processes, platforms and Rust versions.
#[derive(Clone, Copy, Debug)]
pub struct Fnv128(u128);
impl Fnv128 {
    pub fn new() -> Fnv128 {
        Fnv128(0x6c62272e07bb014262b821756295c58d)
    }
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u128;
            self.0 = self.0.wrapping_mul(0x0000000001000000000000000000013B);
        }
    }
    /// A length-prefixed field, so that ("ab", "c") and ("a", "bc") hash apart.
    pub fn field(&mut self, bytes: &[u8]) {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }
    pub fn finish(&self) -> u128 {
        self.0
    }
}
impl Default for Fnv128 {
    fn default() -> Self {
        Fnv128::new()
    }
}

/// The key of one compiled kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelKey(pub u128);

impl KernelKey {
    /// `target` is the architecture (plus any code-changing options); `toolchain` names the
    /// compiler and its version ("nvrtc 13.0").
    pub fn new(source: &str, target: &str, toolchain: &str) -> KernelKey {
        let mut h = Fnv128::new();
        h.field(b"ferrodnn kernel v1");
        h.field(source.as_bytes());
        h.field(target.as_bytes());
        h.field(toolchain.as_bytes());
        KernelKey(h.finish())
    }
    pub fn hex(&self) -> String {
        format!("{:032x}", self.0)
    }
}

/// What the cache has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub memory_hits: u64,
    pub disk_hits: u64,
    pub compiles: u64,
    /// Disk entries that failed a check and were deleted.
    pub corrupt_entries: u64,
    pub disk_write_failures: u64,
}

#[derive(Default)]
struct Counters {
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    compiles: AtomicU64,
    corrupt_entries: AtomicU64,
    disk_write_failures: AtomicU64,
}

/// Compiled kernels, in memory and (optionally) on disk.
pub struct KernelCache {
    memory: Mutex<HashMap<KernelKey, Arc<Vec<u8>>>>,
    dir: Option<PathBuf>,
    toolchain: String,
    counters: Counters,
}

impl std::fmt::Debug for KernelCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelCache").field("dir", &self.dir).field("toolchain", &self.toolchain).field("stats", &self.stats()).finish()
    }
}

impl KernelCache {
    /// The cache folder from the environment (see the module docs), or None when the disk layer
    /// is turned off or no home folder is known.
    pub fn default_dir() -> Option<PathBuf> {
        KernelCache::dir_from(|var| std::env::var_os(var))
    }

    /// [`default_dir`](Self::default_dir) with the environment given as a lookup function.
    pub fn dir_from(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
        let get = |var: &str| env(var).filter(|v| !v.is_empty());
        if let Some(v) = get("FERRODNN_KERNEL_CACHE") {
            if matches!(v.to_string_lossy().trim().to_ascii_lowercase().as_str(), "0" | "off" | "false" | "no") {
                return None;
            }
        }
        if let Some(d) = get("FERRODNN_CACHE_DIR") {
            return Some(PathBuf::from(d));
        }
        if let Some(d) = get("XDG_CACHE_HOME") {
            return Some(PathBuf::from(d).join("ferrodnn").join("kernels"));
        }
        get("HOME").map(|h| PathBuf::from(h).join(".cache").join("ferrodnn").join("kernels"))
    }

    /// A cache in the default folder, for the NVRTC this process loads ("nvrtc unavailable" when
    /// none: nothing can be compiled then, but cubins compiled elsewhere are not mixed in).
    pub fn new() -> KernelCache {
        let toolchain = match super::nvrtc::nvrtc() {
            Ok(info) => format!("nvrtc {}", info.version_string()),
            Err(_) => "nvrtc unavailable".to_string(),
        };
        KernelCache::with_dir(KernelCache::default_dir(), &toolchain)
    }

    /// A cache with an explicit disk folder (None: memory only) and toolchain name.
    pub fn with_dir(dir: Option<PathBuf>, toolchain: &str) -> KernelCache {
        KernelCache { memory: Mutex::new(HashMap::new()), dir, toolchain: toolchain.to_string(), counters: Counters::default() }
    }

    /// The process-wide cache the CUDA engines share.
    pub fn global() -> &'static KernelCache {
        static GLOBAL: OnceLock<KernelCache> = OnceLock::new();
        GLOBAL.get_or_init(KernelCache::new)
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }
    pub fn toolchain(&self) -> &str {
        &self.toolchain
    }

    /// The key `get_or_compile` uses for this source and architecture.
    pub fn key(&self, source: &str, arch: &str) -> KernelKey {
        KernelKey::new(source, arch, &self.toolchain)
    }

    /// Where the disk entry for `key` lives (whether or not it exists).
    pub fn entry_path(&self, key: KernelKey) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{}.cubin", key.hex())))
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            memory_hits: c.memory_hits.load(Ordering::Relaxed),
            disk_hits: c.disk_hits.load(Ordering::Relaxed),
            compiles: c.compiles.load(Ordering::Relaxed),
            corrupt_entries: c.corrupt_entries.load(Ordering::Relaxed),
            disk_write_failures: c.disk_write_failures.load(Ordering::Relaxed),
        }
    }

    /// Forget the in-memory layer (the disk layer stays).
    pub fn clear_memory(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<KernelKey, Arc<Vec<u8>>>> {
        // A panic while holding the lock cannot leave the map half-updated (insert/clear are
        // atomic with respect to it), so a poisoned lock is still good to use.
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cubin for `source` on `arch`: from memory, else from disk, else from `compile` (whose
    /// result is stored in both layers).
    pub fn get_or_compile(&self, source: &str, arch: &str, compile: impl FnOnce() -> Result<Vec<u8>>) -> Result<Arc<Vec<u8>>> {
        self.get_or_compile_key(self.key(source, arch), compile)
    }

    /// As [`get_or_compile`](Self::get_or_compile), with a key the caller made.
    pub fn get_or_compile_key(&self, key: KernelKey, compile: impl FnOnce() -> Result<Vec<u8>>) -> Result<Arc<Vec<u8>>> {
        if let Some(hit) = self.lock().get(&key) {
            self.counters.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(hit.clone());
        }
        // The lock is not held while reading the disk or compiling, so kernels compile in
        // parallel; two threads may then compile the same kernel once each, and the first stored wins.
        if let Some(payload) = self.read_entry(key) {
            self.counters.disk_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(self.store_memory(key, payload));
        }
        let payload = compile()?;
        self.counters.compiles.fetch_add(1, Ordering::Relaxed);
        if self.write_entry(key, &payload).is_err() {
            self.counters.disk_write_failures.fetch_add(1, Ordering::Relaxed);
        }
        Ok(self.store_memory(key, payload))
    }

    fn store_memory(&self, key: KernelKey, payload: Vec<u8>) -> Arc<Vec<u8>> {
        self.lock().entry(key).or_insert_with(|| Arc::new(payload)).clone()
    }

    /// The payload of a valid disk entry; a present but invalid entry is deleted.
    fn read_entry(&self, key: KernelKey) -> Option<Vec<u8>> {
        let path = self.entry_path(key)?;
        let too_big = std::fs::metadata(&path).map(|m| m.len() > MAX_ENTRY_BYTES).unwrap_or(false);
        let bytes = if too_big { None } else { std::fs::read(&path).ok() };
        match bytes {
            None if !path.exists() => None,
            Some(bytes) if decode_entry(&bytes, key).is_ok() => Some(bytes[HEADER_LEN..].to_vec()),
            _ => {
                self.counters.corrupt_entries.fetch_add(1, Ordering::Relaxed);
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    fn write_entry(&self, key: KernelKey, payload: &[u8]) -> std::io::Result<()> {
        let (Some(path), Some(dir)) = (self.entry_path(key), self.dir.as_ref()) else { return Ok(()) };
        std::fs::create_dir_all(dir)?;
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let tmp = dir.join(format!(".{}.{}.{}.tmp", key.hex(), std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
        let result = std::fs::write(&tmp, encode_entry(key, payload)).and_then(|()| std::fs::rename(&tmp, &path));
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

impl Default for KernelCache {
    fn default() -> Self {
        KernelCache::new()
    }
}

fn checksum(payload: &[u8]) -> u64 {
    let mut h = Fnv64::new();
    h.write(payload);
    h.finish()
}

/// Header + payload, as stored on disk.
pub fn encode_entry(key: KernelKey, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&key.0.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Check a stored entry against the key it should hold; Ok(payload) or why it is rejected.
pub fn decode_entry(bytes: &[u8], key: KernelKey) -> Result<&[u8]> {
    let bad = |why: &str| Err(Error::Device(format!("kernel cache entry {}: {why}", key.hex())));
    if bytes.len() < HEADER_LEN {
        return bad("shorter than its header (truncated)");
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    if &bytes[0..8] != MAGIC {
        return bad("wrong magic (not a ferrodnn kernel cache file)");
    }
    if u32_at(8) != FORMAT_VERSION {
        return bad("written by another cache format version");
    }
    if u128::from_le_bytes(bytes[16..32].try_into().unwrap()) != key.0 {
        return bad("holds another key");
    }
    let payload = &bytes[HEADER_LEN..];
    if u64_at(32) != payload.len() as u64 {
        return bad("payload length differs from the header (truncated or extended)");
    }
    if u64_at(40) != checksum(payload) {
        return bad("payload checksum mismatch (corrupt)");
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ferrodnn-cache-unit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn fnv128_known_values() {
        // Published FNV-1a 128 test vectors.
        assert_eq!(Fnv128::new().finish(), 0x6c62272e07bb014262b821756295c58d);
        let mut h = Fnv128::new();
        h.write(b"a");
        assert_eq!(h.finish(), 0xd228cb696f1a8caf78912b704e4a8964);
    }

    #[test]
    fn entry_round_trip_and_rejections() {
        let key = KernelKey::new("src", "sm_80", "nvrtc 13.0");
        let e = encode_entry(key, b"\x7fELF payload");
        assert_eq!(decode_entry(&e, key).unwrap(), b"\x7fELF payload");
        assert!(decode_entry(&e, KernelKey(key.0 ^ 1)).is_err());
        assert!(decode_entry(&e[..e.len() - 1], key).is_err());
        assert!(decode_entry(&e[..10], key).is_err());
        for i in 0..e.len() {
            if (12..16).contains(&i) {
                continue; // reserved bytes are not checked
            }
            let mut f = e.clone();
            f[i] ^= 0x01;
            assert!(decode_entry(&f, key).is_err(), "a flipped bit at byte {i} went unnoticed");
        }
    }

    #[test]
    fn field_framing_separates_inputs() {
        assert_ne!(KernelKey::new("ab", "c", "t"), KernelKey::new("a", "bc", "t"));
    }

    #[test]
    fn disk_write_failure_is_not_fatal() {
        let d = temp_dir("ro");
        std::fs::write(&d, b"a file where the folder should be").unwrap();
        let cache = KernelCache::with_dir(Some(d.clone()), "t");
        let got = cache.get_or_compile("k", "sm_80", || Ok(vec![1, 2, 3])).unwrap();
        assert_eq!(*got, vec![1, 2, 3]);
        assert_eq!(cache.stats().disk_write_failures, 1);
        let _ = std::fs::remove_file(&d);
    }
}
