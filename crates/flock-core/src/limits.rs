//! The limits every layer checks against: what a command may ask for, and
//! so what a loaded or replicated record may hold.

/// The longest owner, in bytes.
pub const MAX_OWNER_LEN: usize = 256;
/// The longest lease or WAIT timeout, in milliseconds.
pub const MAX_MS: u64 = 1 << 40;
/// Replies carry tokens as signed 64-bit integers.
pub const MAX_TOKEN: u64 = i64::MAX as u64;
/// The longest request ID, in bytes.
pub const MAX_ID_LEN: usize = 64;
/// The most keys one `ACQUIREALL` or `RELEASEALL` names: each is a queue
/// entry and a step of the command, so the command stays short.
pub const MAX_ALL_KEYS: usize = 256;

/// The longest lock-delay (`LOCKDELAY`, `flock.lock-delay-ms`): a minute, as
/// Chubby bounds its own. The delay keeps every waiter out; a holder that
/// still writes after a minute needs a fence (FLOCK.FENCED), not a wait.
pub const MAX_LOCK_DELAY_MS: u32 = 60_000;
