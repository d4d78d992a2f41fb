//! CPU-heavy request work (JSON parsing, template rendering, tokenising and detokenising
//! large inputs) runs here, off the async worker threads, so that `/health` and token
//! streams stay responsive however large the inputs are; at most one job per core runs
//! at a time, the rest wait their turn without occupying a thread.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::error::ApiError;

/// A bounded gate onto tokio's blocking thread pool.
#[derive(Clone)]
pub struct Blocking {
    permits: Arc<Semaphore>,
}

impl Blocking {
    /// A gate admitting as many jobs at once as the machine has cores.
    pub fn new() -> Self {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_permits(n)
    }

    /// A gate admitting `n` (at least 1) jobs at once.
    pub fn with_permits(n: usize) -> Self {
        Blocking {
            permits: Arc::new(Semaphore::new(n.max(1))),
        }
    }

    /// Runs `f` on a blocking thread once a permit is free; a panic in `f` is a 500.
    pub async fn run<T, F>(&self, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| ApiError::internal("the request worker pool is closed"))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f()
        })
        .await
        .map_err(|e| ApiError::internal(format!("request preparation failed: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    #[tokio::test(flavor = "current_thread")]
    async fn jobs_leave_the_async_thread_free_and_are_bounded() {
        let gate = Blocking::with_permits(2);
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let jobs: Vec<_> = (0..6)
            .map(|_| {
                let (gate, running, peak) = (gate.clone(), running.clone(), peak.clone());
                tokio::spawn(async move {
                    gate.run(move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(50));
                        running.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
                })
            })
            .collect();
        // The only async thread is free while the jobs block: a timer fires on time.
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            t0.elapsed() < Duration::from_millis(40),
            "{:?}",
            t0.elapsed()
        );
        for j in jobs {
            j.await.expect("task").expect("job");
        }
        assert_eq!(peak.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_panicking_job_is_a_500() {
        let e = Blocking::with_permits(1)
            .run(|| -> u8 { panic!("boom") })
            .await
            .unwrap_err();
        assert_eq!(e.status.as_u16(), 500);
    }
}
