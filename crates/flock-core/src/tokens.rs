//! Fencing tokens.

use crate::limits::MAX_TOKEN;

/// Fencing tokens: strictly increasing for every grant this process makes.
///
/// A token is `max(last + 1, now_ms << 20)`, so tokens also keep rising
/// across restarts, failovers and slot migrations where `last` is lost, as
/// long as clocks do not step back by more than the time between grants.
#[derive(Debug, Default)]
pub struct TokenSource {
    last: u64,
}

impl TokenSource {
    /// Saturates at `MAX_TOKEN`: loaded tokens are at most that, and only a
    /// crafted one could bring `last` there (the clock part stays below half).
    pub fn next(&mut self, now_ms: u64) -> u64 {
        let clock = now_ms.saturating_mul(1 << 20).min(MAX_TOKEN / 2);
        self.last = self.last.saturating_add(1).max(clock).min(MAX_TOKEN);
        self.last
    }

    pub fn last(&self) -> u64 {
        self.last
    }

    /// Tokens seen elsewhere (loaded, replicated) are never handed out again.
    pub fn observe(&mut self, token: u64) {
        self.last = self.last.max(token);
    }
}
