//! Stale holds (docs/client-protocol.md, "stale holds"): holds the server
//! keeps after this process let them go. A release answered by a master
//! that a failover then deposed, or refused (`NOREPLICAS`, `READONLY`), or
//! whose reply was lost, leaves its hold on the server; so may an acquire
//! whose every reply was lost. The same owner's next acquire reenters such a
//! hold (same token, one more hold, the lease renewed), and each release
//! leaves it behind: in the failover test one thread held the lock for the
//! rest of the run that way and starved every other. So the process counts
//! its unreleased holds of each (key, owner) and remembers the token of each
//! one's last release that may have left a hold (any token after an acquire
//! that got no answer); the grant that comes back with it gives the rest
//! back. A release of the process's last hold that leaves holds gives them
//! back too: a failover's churn (a grant on the deposed master, with another
//! token) can replace the memory of the hold that the promoted one kept.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use redis::{from_redis_value, RedisError, Value};

use crate::mutex::lock;
use crate::owner::is_notowner;

/// How many (key, owner) releases are remembered: the newest 1,024 at least.
const REMEMBERED: usize = 1024;

/// A remembered release: the token of the grant it let go, or `None` for
/// an acquire whose outcome is unknown (any grant may have reentered it).
type Token = Option<u64>;

#[derive(Default)]
struct Stale {
    /// The process's unreleased holds of each (key, owner).
    held: HashMap<(String, String), u32>,
    /// Remembered releases in two generations, so that forgetting the
    /// oldest costs nothing per release: when `newer` is full it becomes
    /// `older`, and what was older is forgotten.
    newer: HashMap<(String, String), Token>,
    older: HashMap<(String, String), Token>,
}

fn stale() -> &'static Mutex<Stale> {
    static STALE: OnceLock<Mutex<Stale>> = OnceLock::new();
    STALE.get_or_init(Default::default)
}

fn pair(key: &str, owner: &str) -> (String, String) {
    (key.to_string(), owner.to_string())
}

/// One more unreleased hold of (`key`, `owner`): a guard was made.
pub(crate) fn hold(key: &str, owner: &str) {
    *lock(stale()).held.entry(pair(key, owner)).or_default() += 1;
}

/// One hold of (`key`, `owner`) fewer, after its release was answered (or
/// failed): until then a check of the same owner counts it as the
/// process's, not as stale.
pub(crate) fn unhold(key: &str, owner: &str) {
    let mut stale = lock(stale());
    let pair = pair(key, owner);
    if let Some(n) = stale.held.get_mut(&pair) {
        *n -= 1;
        if *n == 0 {
            stale.held.remove(&pair);
        }
    }
}

/// The process's unreleased holds of (`key`, `owner`).
pub(crate) fn held(key: &str, owner: &str) -> u32 {
    lock(stale()).held.get(&pair(key, owner)).copied().unwrap_or(0)
}

/// A release of (`key`, `owner`)'s grant `token` that may have left its
/// hold on the server; `None`: an acquire whose outcome is unknown.
pub(crate) fn remember(key: &str, owner: &str, token: Token) {
    let mut stale = lock(stale());
    let pair = pair(key, owner);
    stale.older.remove(&pair);
    stale.newer.insert(pair, token);
    if stale.newer.len() >= REMEMBERED {
        stale.older = std::mem::take(&mut stale.newer);
    }
}

/// After a release of (`key`, `owner`)'s grant `token` answered the holds
/// left, or failed: remembered when it may have left the hold on the server
/// (none left, where a failover may lose the answer; a refusal or a lost
/// reply). `NOTOWNER` says the owner holds nothing.
pub(crate) fn released(key: &str, owner: &str, token: u64, left: Result<u64, &RedisError>) {
    if matches!(left, Ok(0)) || matches!(left, Err(e) if !is_notowner(e)) {
        remember(key, owner, Some(token));
    }
}

/// Whether a grant of `token` to (`key`, `owner`) may have reentered a
/// stale hold: its token, or an unknown acquire, was remembered. Forgotten
/// either way: a grant with another token means the owner held nothing.
pub(crate) fn take(key: &str, owner: &str, token: u64) -> bool {
    let mut stale = lock(stale());
    if stale.newer.is_empty() && stale.older.is_empty() {
        return false;
    }
    let pair = pair(key, owner);
    let found = stale.newer.remove(&pair).or_else(|| stale.older.remove(&pair));
    matches!(found, Some(None)) || found == Some(Some(token))
}

/// The holds of `owner`'s grant `token` in a `FLOCK.INFO` reply (a flat
/// array of fields in RESP2, a map in RESP3): 0 when it holds nothing, or
/// another grant.
pub(crate) fn holds_of(info: &Value, owner: &str, token: u64) -> u32 {
    let holders = field(info, "holders").and_then(|h| match h {
        Value::Array(holders) => Some(holders),
        _ => None,
    });
    let mine = holders.into_iter().flatten().find(|h| {
        field(h, "owner").and_then(|o| from_redis_value::<String>(o).ok()).as_deref() == Some(owner)
            && field(h, "token").and_then(|t| from_redis_value::<u64>(t).ok()) == Some(token)
    });
    mine.and_then(|h| field(h, "holds")).and_then(|n| from_redis_value(n).ok()).unwrap_or(0)
}

fn field<'a>(fields: &'a Value, name: &str) -> Option<&'a Value> {
    let is = |k: &Value| from_redis_value::<String>(k).is_ok_and(|k| k == name);
    match fields {
        Value::Array(flat) => flat.chunks(2).find(|kv| kv.len() == 2 && is(&kv[0])).map(|kv| &kv[1]),
        Value::Map(pairs) => pairs.iter().find(|(k, _)| is(k)).map(|(_, v)| v),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_token_is_taken_once_and_only_by_its_own_grant() {
        remember("k1", "o", Some(7));
        assert!(!take("k1", "o", 8), "another token: the owner held nothing");
        assert!(!take("k1", "o", 7), "forgotten by the first grant");
        remember("k1", "o", Some(7));
        assert!(take("k1", "o", 7));
        remember("k1", "o", None);
        assert!(take("k1", "o", 9), "an unknown acquire: any grant");
    }

    #[test]
    fn the_newest_releases_are_remembered_past_the_limit() {
        for i in 0..3 * REMEMBERED as u64 {
            remember("k2", &i.to_string(), Some(i));
        }
        let last = 3 * REMEMBERED as u64 - 1;
        assert!(take("k2", &last.to_string(), last));
        let stale = lock(stale());
        assert!(stale.newer.len() + stale.older.len() <= 2 * REMEMBERED);
    }

    #[test]
    fn holds_are_counted_until_the_last_is_released() {
        hold("k3", "o");
        hold("k3", "o");
        unhold("k3", "o");
        assert_eq!(held("k3", "o"), 1);
        unhold("k3", "o");
        assert_eq!(held("k3", "o"), 0);
        assert!(!lock(stale()).held.contains_key(&pair("k3", "o")));
    }
}
