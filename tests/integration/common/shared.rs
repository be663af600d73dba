//! Fixtures that the tests of one module share, such as its Cluster: a
//! `static` of the module, started by the first test that asks for it and
//! used by one test at a time. Starting one per test cost seconds each;
//! taking turns keeps one test's failover or slot move out of another's
//! middle, while the tests of other modules run beside them. A static is
//! never dropped, so the fixtures are stopped when the test process exits.

use std::ops::Deref;
use std::sync::{Mutex, MutexGuard, Once, PoisonError};

/// What a shared fixture needs: how to start it, and how to make it ready
/// for the next test, as if it were new, whatever the test before did.
pub trait Fixture: Send + Sized + 'static {
    fn start() -> Self;
    fn reset(&self);
}

pub struct Shared<T> {
    fixture: Mutex<Option<T>>,
}

/// One test's use of a shared fixture; the next test's turn begins when it drops.
pub struct Turn<T: 'static>(MutexGuard<'static, Option<T>>);

impl<T: Fixture> Shared<T> {
    pub const fn new() -> Shared<T> {
        Shared { fixture: Mutex::new(None) }
    }

    /// Waits for this test's turn, then starts the fixture or resets it.
    /// A test that failed during its turn leaves the fixture to the next
    /// one (the lock is poisoned, not lost), whose reset puts it right.
    pub fn turn(&'static self) -> Turn<T> {
        let mut fixture = self.fixture.lock().unwrap_or_else(PoisonError::into_inner);
        match fixture.as_ref() {
            Some(f) => f.reset(),
            None => {
                *fixture = Some(T::start());
                stop_at_exit(self);
            }
        }
        Turn(fixture)
    }
}

impl<T> Deref for Turn<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("a started fixture")
    }
}

trait Stop: Sync {
    fn stop(&self);
}

impl<T: Fixture> Stop for Shared<T> {
    /// Drops the fixture (its Drop kills its processes). A fixture still
    /// in use at exit belongs to a test that never ended; it is left alone
    /// rather than waited for.
    fn stop(&self) {
        let fixture = match self.fixture.try_lock() {
            Ok(mut f) => f.take(),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().take(),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        drop(fixture);
    }
}

static STARTED: Mutex<Vec<&'static dyn Stop>> = Mutex::new(Vec::new());

fn stop_at_exit<T: Fixture>(shared: &'static Shared<T>) {
    static HOOK: Once = Once::new();
    STARTED.lock().unwrap_or_else(PoisonError::into_inner).push(shared);
    HOOK.call_once(|| {
        // SAFETY: atexit is the C library's; it stores a pointer to a
        // function that takes nothing, touches only statics that live to the
        // end of the process, and cannot unwind into C (stop_all catches
        // panics). libtest ends the process with exit(), which runs it.
        let registered = unsafe { atexit(stop_all) };
        assert_eq!(registered, 0, "atexit failed: shared fixtures would outlive the tests");
    });
}

extern "C" {
    fn atexit(callback: extern "C" fn()) -> std::os::raw::c_int;
}

extern "C" fn stop_all() {
    let _ = std::panic::catch_unwind(|| {
        let started = std::mem::take(&mut *STARTED.lock().unwrap_or_else(PoisonError::into_inner));
        started.iter().for_each(|s| s.stop());
    });
}
