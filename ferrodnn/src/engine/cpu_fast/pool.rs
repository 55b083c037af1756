//! The fast CPU engine's thread pools, and which cores their threads run on.
//!
//! A pool with one thread per core the process may run on (the default pool, and a handle's own
//! pool of that size) pins its thread `i` to the `i`-th of those cores. Without pins, Linux's
//! wake-up placement was seen to put both workers of a 2-thread pool on one core for whole runs
//! of calls while the other core sat idle (bench/NOTES.md, session 35: each worker's last core the
//! same, each waiting on that core's run queue about as long as the other ran): a layer then ran
//! at one thread's speed. Pinned, the two can never share a core; a worker whose core is taken by
//! another program gets that core's share only, and the other workers take over its unstarted
//! work. `FERRODNN_CPU_PIN=0` in the environment turns the pins off. A pool smaller or larger
//! than the set of cores is never pinned (several such pools in one machine would pile onto the
//! same first cores).

use std::sync::{Arc, OnceLock};

/// Whether pools that span the process's cores pin their threads (unless `FERRODNN_CPU_PIN=0`).
fn pins_wanted() -> bool {
    std::env::var("FERRODNN_CPU_PIN").map_or(true, |v| v.trim() != "0")
}

/// A pool of `threads` threads named `ferrodnn-cpu-i`, pinned when it has one thread per core
/// the process may run on (and more than one).
pub(super) fn build(threads: usize) -> std::result::Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    let builder = rayon::ThreadPoolBuilder::new().num_threads(threads).thread_name(|i| format!("ferrodnn-cpu-{i}"));
    match affinity::allowed().filter(|cpus| threads > 1 && cpus.len() == threads && pins_wanted()) {
        Some(cpus) => builder
            .start_handler(move |i| {
                // A pin that does not take leaves the thread where the kernel puts it.
                let _ = affinity::pin(cpus[i]);
            })
            .build(),
        None => builder.build(),
    }
}

/// The pool of plans whose handle was not given one: `RAYON_NUM_THREADS` threads where that is
/// set (as rayon's global pool would have), else one per core the process may use; started on
/// first use, shared by every such handle of the process. `None` when it cannot be started (the
/// plans then run on rayon's global pool).
pub(super) fn shared() -> Option<Arc<rayon::ThreadPool>> {
    static POOL: OnceLock<Option<Arc<rayon::ThreadPool>>> = OnceLock::new();
    POOL.get_or_init(|| {
        let from_env = std::env::var("RAYON_NUM_THREADS").ok().and_then(|v| v.trim().parse::<usize>().ok()).filter(|&n| n > 0);
        let threads = from_env.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        build(threads).ok().map(Arc::new)
    })
    .clone()
}

/// The calling thread's CPU affinity (Linux).
#[cfg(target_os = "linux")]
mod affinity {
    /// `cpu_set_t`: a bit per CPU, 1024 CPUs.
    type CpuSet = [u64; 16];

    extern "C" {
        fn sched_getaffinity(pid: i32, size: usize, mask: *mut CpuSet) -> i32;
        fn sched_setaffinity(pid: i32, size: usize, mask: *const CpuSet) -> i32;
    }

    /// The CPUs the calling thread may run on, in order; `None` if the kernel does not say.
    pub fn allowed() -> Option<Vec<usize>> {
        let mut set: CpuSet = [0; 16];
        // SAFETY: pid 0 is the calling thread; the C library writes at most `size` bytes, the
        // size of `set`.
        let r = unsafe { sched_getaffinity(0, std::mem::size_of::<CpuSet>(), &mut set) };
        (r == 0).then(|| (0..1024).filter(|&c| set[c / 64] >> (c % 64) & 1 == 1).collect())
    }

    /// Pins the calling thread to `cpu`; whether the kernel took it.
    pub fn pin(cpu: usize) -> bool {
        if cpu >= 1024 {
            return false;
        }
        let mut set: CpuSet = [0; 16];
        set[cpu / 64] |= 1 << (cpu % 64);
        // SAFETY: pid 0 is the calling thread; `set` is a whole cpu_set_t of the size given.
        unsafe { sched_setaffinity(0, std::mem::size_of::<CpuSet>(), &set) == 0 }
    }
}

/// Elsewhere: no pins.
#[cfg(not(target_os = "linux"))]
mod affinity {
    pub fn allowed() -> Option<Vec<usize>> {
        None
    }

    pub fn pin(_cpu: usize) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    /// A pool spanning the process's cores runs each thread on its own core (where the machine
    /// has more than one and pins are wanted); a smaller pool is not pinned.
    #[test]
    fn a_pool_of_one_thread_per_core_pins_each_thread_to_its_own_core() {
        let Some(cpus) = super::affinity::allowed() else { return };
        if cpus.len() < 2 || !super::pins_wanted() {
            return;
        }
        let pool = super::build(cpus.len()).expect("pool");
        let seen = pool.broadcast(|_| super::affinity::allowed().unwrap_or_default());
        let want: Vec<Vec<usize>> = cpus.iter().map(|&c| vec![c]).collect();
        assert_eq!(seen, want, "each thread's allowed cores");
        let small = super::build(cpus.len() - 1).expect("pool");
        let seen = small.broadcast(|_| super::affinity::allowed().unwrap_or_default());
        assert!(seen.iter().all(|s| *s == cpus), "a smaller pool's threads keep every core: {seen:?}");
    }
}
