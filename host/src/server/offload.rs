//! Request work that takes CPU time (reading a JSON body, tokenizing a prompt, rendering a chat
//! template, building probability tables) runs off the async runtime's two worker threads, so
//! that no request holds up /health, the other requests' streams or new connections.

use std::sync::Arc;

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::Semaphore;

use super::error::ApiError;

/// The blocking threads requests' CPU work runs on, at most `--threads-http` at once (more
/// wait for a turn).
pub struct CpuPool {
    permits: Arc<Semaphore>,
}

impl CpuPool {
    /// A pool running at most `threads` jobs at once.
    pub fn new(threads: usize) -> Self {
        CpuPool {
            permits: Arc::new(Semaphore::new(threads.max(1))),
        }
    }

    /// Runs `work` on a blocking thread and waits for its result; a panic in it is this
    /// request's 500, nobody else's.
    pub async fn run<T, F>(&self, work: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| ApiError::internal("the request thread pool is closed"))?;
        let joined = tokio::task::spawn_blocking(move || {
            let _turn = permit;
            work()
        })
        .await;
        match joined {
            Ok(result) => result,
            Err(e) if e.is_panic() => {
                let what = bloomery_runtime::panic_message(e.into_panic().as_ref());
                tracing::error!("a request's work panicked: {what}");
                Err(ApiError::internal(format!("internal error: {what}")))
            }
            Err(_) => Err(ApiError::internal("a request's work was cancelled")),
        }
    }
}

/// Runs `work`, which may take long (a large probability table), from async code without
/// holding up the runtime's other tasks: on the multi-threaded runtime this worker hands its
/// tasks to another thread for the duration; elsewhere (tests on one thread) it just runs.
pub fn heavy<T>(work: impl FnOnce() -> T) -> T {
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}
