//! Cancelling waits from another thread: [`CancelToken`], and the error a
//! cancelled wait returns.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use redis::RedisError;

use crate::mutex::lock;
use crate::session::Outcome;

/// The error a cancelled wait returns: code `CANCELLED`.
pub(crate) fn cancelled() -> RedisError {
    redis::make_extension_error("CANCELLED".into(), Some("the wait was cancelled".into()))
}

/// Cancels waits from another thread: give it to a lock with
/// [`Lock::cancel_with`](crate::Lock::cancel_with); [`CancelToken::cancel`] ends every session wait
/// of that lock (`FLOCK.CANCEL`), now and later, which then returns an error
/// with code `CANCELLED` (a grant that won the race is released first).
#[derive(Clone, Default)]
pub struct CancelToken {
    inner: Arc<CancelInner>,
}

#[derive(Default)]
struct CancelInner {
    cancelled: AtomicBool,
    next: AtomicU64,
    waiters: Mutex<Vec<(u64, Sender<Outcome>)>>,
}

impl CancelToken {
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// Cancels the waits of the locks given this token.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        for (_, waiter) in lock(&self.inner.waiters).iter() {
            let _ = waiter.send(Outcome::CancelRequested);
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    pub(crate) fn attach(&self, waiter: Sender<Outcome>) -> u64 {
        let id = self.inner.next.fetch_add(1, Ordering::SeqCst);
        let mut waiters = lock(&self.inner.waiters);
        if self.is_cancelled() {
            let _ = waiter.send(Outcome::CancelRequested);
        }
        waiters.push((id, waiter));
        id
    }

    pub(crate) fn detach(&self, id: u64) {
        lock(&self.inner.waiters).retain(|(i, _)| *i != id);
    }
}

impl std::fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelToken").field("cancelled", &self.is_cancelled()).finish()
    }
}
