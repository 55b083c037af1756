//! Two processes sharing one kernel cache folder (issue 29, item 6), on the CPU: entries are
//! written to a temporary name and renamed into place, so a reader sees a whole entry or none;
//! a damaged entry (truncated, a flipped byte, garbage) is detected by its length and checksum,
//! discarded and rebuilt, never loaded, even while the other process is rewriting it.
//!
//! The parent test starts two copies of this test binary running `child_fills_the_cache`
//! (ignored when run alone) on the same folder at the same moment. Each fills the cache with
//! the same keys, several megabytes each (payloads that depend on the key, so a reader can tell
//! a torn or mixed entry), and, when NVRTC is here, with real kernels of the check cases, and
//! reports what it saw on one line.

use ferrodnn::engine::cuda::{self, cache::decode_entry, CompileOptions, KernelCache, KernelKey, Target};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const KEYS: u64 = 24;
const CHILD_ENV: &str = "FERRODNN_CACHE_CHILD_DIR";
const GO_ENV: &str = "FERRODNN_CACHE_CHILD_GO";

/// Key k's payload: 1 to 4 MB of bytes that depend on k and their position.
fn payload(k: u64) -> Vec<u8> {
    let len = (1 << 20) + (k as usize * 131_071) % (3 << 20);
    let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ k.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// The real kernels the children compile when NVRTC is here (a handful: compiling is slow).
fn real_kernels() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for case in ferrodnn::testing::cases::all() {
        if !(case.name.contains("layernorm") || case.name.contains("softmax")) {
            continue;
        }
        if let Ok(list) = cuda::kernel_sources(&case.graph, &Target::sm90a()) {
            out.extend(list);
        }
        if out.len() >= 4 {
            break;
        }
    }
    out.truncate(4);
    out
}

fn nvrtc_here() -> bool {
    cuda::nvrtc_available() && cuda::cuda_include_dir().found.is_some()
}

/// The child: waits for the go file, then asks the cache for every key (and the real kernels),
/// checks each payload, and prints `CHILD compiles=.. disk_hits=.. corrupt=.. wrong=..`.
#[test]
#[ignore = "the child side of two_processes_share_one_cache_folder, started by it"]
fn child_fills_the_cache() {
    let dir = PathBuf::from(std::env::var_os(CHILD_ENV).expect("run by two_processes_share_one_cache_folder, which sets FERRODNN_CACHE_CHILD_DIR"));
    let go = PathBuf::from(std::env::var_os(GO_ENV).expect("the go file"));
    let start = Instant::now();
    while !go.exists() && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let cache = KernelCache::with_dir(Some(dir.clone()), "test toolchain");
    let mut wrong = 0;
    // Both children walk the keys in the same order, so they race on every entry.
    for k in 0..KEYS {
        let got = cache.get_or_compile(&format!("kernel {k}"), "sm_90a", || Ok(payload(k))).unwrap();
        if *got != payload(k) {
            wrong += 1;
        }
    }
    let mut real = 0;
    if nvrtc_here() {
        let info = cuda::nvrtc().unwrap();
        let nvrtc_cache = KernelCache::with_dir(Some(dir.join("nvrtc")), &format!("nvrtc {}", info.version_string()));
        for (entry, src) in real_kernels() {
            let cubin = cuda::compile_cached(&nvrtc_cache, &src, &entry, &CompileOptions::new("sm_90a")).unwrap();
            assert_eq!(&cubin[..4], b"\x7fELF", "{entry}: not a cubin");
            real += 1;
        }
    }
    let s = cache.stats();
    println!("CHILD compiles={} disk_hits={} corrupt={} wrong={wrong} real={real}", s.compiles, s.disk_hits, s.corrupt_entries);
}

/// What a child reported: (compiles, disk hits, corrupt entries, wrong payloads, real kernels).
fn parse_child(out: &str) -> (u64, u64, u64, u64, u64) {
    // (The test harness prints "test child_fills_the_cache ... " before it on the same line.)
    let line = out.lines().find_map(|l| l.find("CHILD ").map(|at| &l[at..])).unwrap_or_else(|| panic!("no CHILD line in the child's output:\n{out}"));
    let field = |name: &str| -> u64 {
        let at = line.find(&format!("{name}=")).unwrap_or_else(|| panic!("no {name} in {line}"));
        line[at + name.len() + 1..].split_whitespace().next().unwrap().parse().unwrap()
    };
    (field("compiles"), field("disk_hits"), field("corrupt"), field("wrong"), field("real"))
}

/// Start two children on `dir` at once; returns their reports.
fn run_children(dir: &Path, tag: &str) -> Vec<(u64, u64, u64, u64, u64)> {
    let go = dir.with_extension(format!("{tag}.go"));
    let _ = std::fs::remove_file(&go);
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "child_fills_the_cache", "--ignored", "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, dir)
                .env(GO_ENV, &go)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start a child")
        })
        .collect();
    // Both are started (and waiting) before either may touch the cache.
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&go, b"go").unwrap();
    let reports = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(out.status.success(), "a child failed ({}):\n{text}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
            parse_child(&text)
        })
        .collect();
    let _ = std::fs::remove_file(&go);
    reports
}

/// Every file in the folder is a whole, valid entry for the key its name gives; no temporary
/// file is left behind. Returns how many entries there are.
fn check_folder(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.is_dir() {
            n += check_folder(&path);
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!name.ends_with(".tmp"), "a temporary file was left behind: {name}");
        let hex = name.strip_suffix(".cubin").unwrap_or_else(|| panic!("an unexpected file in the cache: {name}"));
        let key = KernelKey(u128::from_str_radix(hex, 16).unwrap());
        let bytes = std::fs::read(&path).unwrap();
        decode_entry(&bytes, key).unwrap_or_else(|e| panic!("{name}: {e}"));
        n += 1;
    }
    n
}

#[test]
fn two_processes_share_one_cache_folder() {
    let dir = std::env::temp_dir().join(format!("ferrodnn-cache-2proc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let real = if nvrtc_here() { real_kernels().len() as u64 } else { 0 };

    // 1. An empty folder, both processes at once.
    let first = run_children(&dir, "fill");
    for &(compiles, hits, corrupt, wrong, r) in &first {
        assert_eq!(wrong, 0, "a process got a payload that is not its key's");
        assert_eq!(corrupt, 0, "a process saw a torn entry (writes are not atomic)");
        assert_eq!(compiles + hits, KEYS);
        assert_eq!(r, real);
    }
    assert_eq!(check_folder(&dir) as u64, KEYS + real);

    // 2. Both again: everything comes from the disk.
    for (compiles, hits, corrupt, wrong, _) in run_children(&dir, "hit") {
        assert_eq!((compiles, hits, corrupt, wrong), (0, KEYS, 0, 0));
    }

    // 3. Damage three entries (truncated, a flipped byte, garbage of the same length) and run
    // both at once: the damaged ones are rebuilt, never loaded.
    let cache = KernelCache::with_dir(Some(dir.clone()), "test toolchain");
    let path = |k: u64| cache.entry_path(cache.key(&format!("kernel {k}"), "sm_90a")).unwrap();
    let full = std::fs::read(path(3)).unwrap();
    std::fs::write(path(3), &full[..full.len() / 2]).unwrap();
    let mut flipped = std::fs::read(path(7)).unwrap();
    let at = flipped.len() - 1000;
    flipped[at] ^= 0x10;
    std::fs::write(path(7), &flipped).unwrap();
    let len = std::fs::metadata(path(11)).unwrap().len() as usize;
    std::fs::write(path(11), vec![0x5au8; len]).unwrap();
    let third = run_children(&dir, "damaged");
    let corrupt: u64 = third.iter().map(|r| r.2).sum();
    let compiles: u64 = third.iter().map(|r| r.0).sum();
    for &(c, hits, _, wrong, _) in &third {
        assert_eq!(wrong, 0, "a damaged entry was loaded");
        assert_eq!(c + hits, KEYS);
    }
    // Each damaged entry was seen (and deleted) by one process at least, and rebuilt.
    assert!((3..=6).contains(&corrupt), "{corrupt} damaged entries detected, 3 to 6 expected: {third:?}");
    assert!((3..=6).contains(&compiles), "{compiles} rebuilds, 3 to 6 expected: {third:?}");
    assert_eq!(check_folder(&dir) as u64, KEYS + real);
    let _ = std::fs::remove_dir_all(&dir);
}
