//! A persistent thread pool: `n - 1` spawned workers plus the calling thread, one barrier
//! per [`ThreadPool::run`], no allocation per call.
//!
//! Workers poll an epoch counter for a few milliseconds after each run (a decode step issues
//! hundreds of short parallel regions back to back, and waking a parked thread costs about
//! 100 µs), then park on a condition variable so an idle pool costs no CPU.

use std::any::Any;
use std::cell::UnsafeCell;
use std::ops::Range;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a waiting thread busy-spins before it starts yielding: covers the gap between
/// back-to-back runs of one forward pass (a decode step issues ~150 regions a few µs apart).
const SPIN_HOT: Duration = Duration::from_micros(100);
/// How long it keeps polling (yielding the core between polls) before it parks. Waking a
/// parked thread costs ~100 µs, more than many whole regions, so the pool stays awake
/// across the serial gaps inside a forward pass and between decoded tokens; yielding lets
/// an oversubscribed machine run other work on the core meanwhile.
const SPIN_TOTAL: Duration = Duration::from_millis(4);

/// Polls until `done()` holds or [`SPIN_TOTAL`] elapsed; returns whether it holds.
fn spin_until(done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if done() {
                return true;
            }
            std::hint::spin_loop();
        }
        let waited = start.elapsed();
        if waited >= SPIN_TOTAL {
            return done();
        }
        if waited >= SPIN_HOT {
            std::thread::yield_now();
        }
    }
}

/// The job type workers run: a type-erased borrowed closure.
type Job = *const (dyn Fn(usize, usize) + Sync);

/// State shared between the caller and the workers.
struct Shared {
    /// Incremented once per run; workers run the job when it changes.
    epoch: AtomicU64,
    /// The current job; written only while every worker is idle (see `run`).
    job: UnsafeCell<Option<Job>>,
    /// Shares (`ith >= 1`) of the current run not finished yet.
    remaining: AtomicUsize,
    /// Per share `ith >= 1`: the last epoch whose share `ith` was claimed, by its worker or
    /// by the caller (`fetch_max` makes exactly one of them win, and a stale claim lose).
    claimed: Vec<AtomicU64>,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    /// Whether the caller is parked (or about to park) on `done`.
    caller_waiting: AtomicBool,
    /// Set when a worker's closure panicked during the current run.
    panicked: AtomicBool,
    /// The first panic payload of the current run's shares other than the caller's,
    /// re-raised by the caller so the original message reaches whoever catches it.
    payload: Mutex<Option<Box<dyn Any + Send>>>,
    /// Workers that have entered their loop; `new` waits for all of them.
    started: AtomicUsize,
    /// Tells workers to exit.
    shutdown: AtomicBool,
    /// Guards the two condition variables.
    lock: Mutex<()>,
    /// Wakes parked workers for a new epoch or shutdown.
    wake: Condvar,
    /// Wakes the parked caller when the last worker finishes.
    done: Condvar,
}

// SAFETY: `job` is written by the single running caller only while no worker reads it
// (before the epoch is published, after `remaining` reached zero); every other field is a
// synchronization primitive. The closure behind `job` is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw job pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// A fixed set of threads that execute a closure together.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
    /// Set while a run is in flight; a nested or concurrent run executes serially instead.
    busy: AtomicBool,
}

impl ThreadPool {
    /// Creates a pool of `n_threads` threads (at least 1): the caller plus `n_threads - 1`
    /// spawned workers that live until the pool is dropped.
    pub fn new(n_threads: usize) -> Self {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            remaining: AtomicUsize::new(0),
            claimed: (0..n_threads).map(|_| AtomicU64::new(0)).collect(),
            sleepers: AtomicUsize::new(0),
            caller_waiting: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            payload: Mutex::new(None),
            started: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            done: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|ith| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("minfer-worker-{ith}"))
                    .spawn(move || worker_loop(&shared, ith, n_threads))
                    .expect("spawning a thread pool worker")
            })
            .collect();
        // Thread start-up allocates (the runtime's per-thread state). Waiting here keeps it
        // inside `new`, so a worker the OS schedules late never allocates in the middle of
        // a decode step, and the first run finds every worker polling.
        let mut guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
        while shared.started.load(SeqCst) < n_threads - 1 {
            guard = shared.done.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        drop(guard);
        ThreadPool {
            shared,
            workers,
            n_threads,
            busy: AtomicBool::new(false),
        }
    }

    /// Number of threads that execute each run (the caller included).
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Calls `f(ith, nth)` once for every `ith` in `0..nth` (`nth == n_threads()`), in
    /// parallel, and returns when all calls have finished. A panic in any call is re-raised
    /// here after every thread has finished. Nested or concurrent calls run serially on the
    /// calling thread. Which thread runs a given `ith` is unspecified: when the caller
    /// finishes its own share before a worker has started (a worker descheduled on a busy
    /// machine), the caller runs that share itself instead of waiting for the worker.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let nth = self.n_threads;
        if nth == 1 || self.busy.swap(true, SeqCst) {
            (0..nth).for_each(|ith| f(ith, nth));
            return;
        }
        let s = &*self.shared;
        // SAFETY: the erased lifetime never outlives this call: we return (or unwind) only
        // after `remaining` reached zero, i.e. after every worker stopped using the job.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), Job>(f) };
        // SAFETY: no worker reads `job` now: the previous run ended with `remaining == 0`
        // and workers read it only after observing the epoch bump below.
        unsafe { *s.job.get() = Some(job) };
        s.panicked.store(false, SeqCst);
        s.remaining.store(nth - 1, SeqCst);
        let epoch = s.epoch.fetch_add(1, SeqCst) + 1;
        if s.sleepers.load(SeqCst) > 0 {
            // Taking the lock orders this notify after any worker's last epoch check.
            drop(s.lock.lock().unwrap_or_else(|e| e.into_inner()));
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0, nth)));
        for ith in 1..nth {
            if s.claimed[ith].fetch_max(epoch, SeqCst) < epoch {
                if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(ith, nth))) {
                    record_panic(s, p);
                }
                s.remaining.fetch_sub(1, SeqCst);
            }
        }
        wait_for_workers(s);
        // SAFETY: every worker is idle again (remaining == 0).
        unsafe { *s.job.get() = None };
        self.busy.store(false, SeqCst);
        let theirs = if s.panicked.load(SeqCst) {
            s.payload.lock().unwrap_or_else(|e| e.into_inner()).take()
        } else {
            None
        };
        if let Err(payload) = mine {
            resume_unwind(payload);
        }
        if s.panicked.load(SeqCst) {
            match theirs {
                Some(payload) => resume_unwind(payload),
                None => panic!("a thread pool worker panicked"),
            }
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, SeqCst);
        s.epoch.fetch_add(1, SeqCst);
        drop(s.lock.lock().unwrap_or_else(|e| e.into_inner()));
        s.wake.notify_all();
        for w in self.workers.drain(..) {
            // A worker only panics outside the job if the runtime is broken; nothing to do.
            let _ = w.join();
        }
    }
}

/// Marks the current run as panicked, keeping the first payload for the caller.
fn record_panic(s: &Shared, payload: Box<dyn Any + Send>) {
    let mut slot = s.payload.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_none() {
        *slot = Some(payload);
    }
    s.panicked.store(true, SeqCst);
}

/// Spins, then parks, until every worker of the current run has finished.
fn wait_for_workers(s: &Shared) {
    if spin_until(|| s.remaining.load(SeqCst) == 0) {
        return;
    }
    let mut guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
    s.caller_waiting.store(true, SeqCst);
    while s.remaining.load(SeqCst) != 0 {
        guard = s.done.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
    s.caller_waiting.store(false, SeqCst);
}

/// The body of each spawned worker.
fn worker_loop(s: &Shared, ith: usize, nth: usize) {
    {
        let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
        s.started.fetch_add(1, SeqCst);
        s.done.notify_all();
    }
    let mut seen = 0u64;
    loop {
        let mut spun = false;
        let epoch = loop {
            let e = s.epoch.load(SeqCst);
            if e != seen {
                break e;
            }
            if !spun {
                spun = true;
                spin_until(|| s.epoch.load(SeqCst) != seen);
                continue;
            }
            let mut guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, SeqCst);
            while s.epoch.load(SeqCst) == seen {
                guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, SeqCst);
        };
        seen = epoch;
        if s.shutdown.load(SeqCst) {
            return;
        }
        if s.claimed[ith].fetch_max(epoch, SeqCst) >= epoch {
            // The caller ran this share already (or a newer run's, if this epoch is stale).
            continue;
        }
        // SAFETY: the caller wrote the job before bumping the epoch we just observed and
        // keeps it alive until we decrement `remaining` below (our claim succeeded, so the
        // run of `epoch` is still waiting for this share).
        let job = unsafe { *s.job.get() };
        if let Some(job) = job {
            // SAFETY: see above; the pointee is a live `Sync` closure for this run.
            let f = unsafe { &*job };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(ith, nth))) {
                record_panic(s, p);
            }
        }
        if s.remaining.fetch_sub(1, SeqCst) == 1 && s.caller_waiting.load(SeqCst) {
            drop(s.lock.lock().unwrap_or_else(|e| e.into_inner()));
            s.done.notify_all();
        }
    }
}

/// The `ith` of `nth` near-equal contiguous pieces of `0..len` (earlier pieces take the
/// remainder, so sizes differ by at most one).
pub fn chunk_range(len: usize, ith: usize, nth: usize) -> Range<usize> {
    let nth = nth.max(1);
    let ith = ith.min(nth);
    let (base, extra) = (len / nth, len % nth);
    let start = ith * base + ith.min(extra);
    let end = (start + base + usize::from(ith < extra)).min(len);
    start.min(len)..end
}

/// Physical core count (best effort: distinct (package, core) pairs in `/proc/cpuinfo`,
/// else the available parallelism, else 1). The default thread count: SMT siblings share
/// the SIMD units, so extra threads only add contention.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    match std::fs::read_to_string("/proc/cpuinfo") {
        Ok(text) => count_physical_cores(&text).unwrap_or(logical).min(logical),
        Err(_) => logical,
    }
}

/// Distinct (`physical id`, `core id`) pairs in cpuinfo text; `None` when absent.
fn count_physical_cores(cpuinfo: &str) -> Option<usize> {
    let mut pairs = std::collections::BTreeSet::new();
    let mut package = None;
    for line in cpuinfo.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "processor" => package = None,
            "physical id" => package = Some(value.to_string()),
            "core id" => {
                pairs.insert((package.clone().unwrap_or_default(), value.to_string()));
            }
            _ => {}
        }
    }
    (!pairs.is_empty()).then_some(pairs.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_thread_runs_once_per_call() {
        for n in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.n_threads(), n);
            for _ in 0..200 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(&|ith, nth| {
                    assert_eq!(nth, n);
                    hits[ith].fetch_add(1, SeqCst);
                });
                assert!(hits.iter().all(|h| h.load(SeqCst) == 1));
            }
        }
    }

    #[test]
    fn run_waits_for_slow_workers_after_they_parked() {
        let pool = ThreadPool::new(3);
        // Let the workers go idle long enough to park on the condition variable.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let sum = AtomicUsize::new(0);
        pool.run(&|ith, _| {
            std::thread::sleep(std::time::Duration::from_millis(10 * ith as u64));
            sum.fetch_add(ith + 1, SeqCst);
        });
        assert_eq!(sum.load(SeqCst), 6);
    }

    /// Shares of late workers are taken over by the caller; every share still runs exactly
    /// once per call, whichever thread wins it, including right after workers parked.
    #[test]
    fn every_share_runs_once_when_workers_are_late() {
        let pool = ThreadPool::new(3);
        for round in 0..300 {
            if round % 100 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|ith, _| {
                if ith == round % 3 {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
                hits[ith].fetch_add(1, SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1), "round {round}");
        }
    }

    #[test]
    fn nested_run_executes_serially() {
        let pool = ThreadPool::new(2);
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            pool.run(&|_, _| {
                count.fetch_add(1, SeqCst);
            });
        });
        assert_eq!(count.load(SeqCst), 4);
    }

    #[test]
    fn worker_panic_reaches_the_caller_and_the_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|ith, _| {
                if ith == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            count.fetch_add(1, SeqCst);
        });
        assert_eq!(count.load(SeqCst), 2);
    }

    /// A worker's panic reaches the caller with its own message, every time, and a
    /// run after it is complete: no share is lost and no thread is left waiting.
    #[test]
    fn worker_panics_keep_their_message_and_leave_the_pool_whole() {
        let pool = ThreadPool::new(3);
        for round in 0..50 {
            if round % 10 == 0 {
                // Let the workers park, so the panicking share may run on a woken worker.
                std::thread::sleep(std::time::Duration::from_millis(6));
            }
            let r = catch_unwind(AssertUnwindSafe(|| {
                pool.run(&|ith, _| {
                    if ith == 1 + round % 2 {
                        panic!("share {ith} failed");
                    }
                })
            }));
            let payload = r.expect_err("the panic propagates");
            let text = payload
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_default();
            assert_eq!(text, format!("share {} failed", 1 + round % 2));
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|ith, _| {
                hits[ith].fetch_add(1, SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1), "round {round}");
        }
    }

    #[test]
    fn chunk_range_covers_everything_once() {
        for len in [0, 1, 7, 64, 4864] {
            for nth in 1..6 {
                let mut next = 0;
                for ith in 0..nth {
                    let r = chunk_range(len, ith, nth);
                    assert_eq!(r.start, next);
                    assert!(r.len() <= len / nth + 1);
                    next = r.end;
                }
                assert_eq!(next, len);
            }
        }
        assert_eq!(chunk_range(10, 5, 2), 10..10);
    }

    #[test]
    fn physical_cores_parses_cpuinfo() {
        let text = "processor\t: 0\nphysical id\t: 0\ncore id\t: 0\n\n\
                    processor\t: 1\nphysical id\t: 0\ncore id\t: 0\n\n\
                    processor\t: 2\nphysical id\t: 0\ncore id\t: 1\n";
        assert_eq!(count_physical_cores(text), Some(2));
        assert_eq!(count_physical_cores("processor : 0\n"), None);
        assert!(physical_cores() >= 1);
    }
}
