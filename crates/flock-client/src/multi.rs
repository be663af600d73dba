//! Several locks of one owner at once (`FLOCK.ACQUIREALL` /
//! `FLOCK.RELEASEALL`): all or none, one server call each way. A wait
//! blocks the connection given to acquire (the server has no session form
//! for it) and holds its place in every key's queue.

use std::time::Duration;

use redis::{Client, Cmd, ConnectionLike, ErrorKind, FromRedisValue, RedisError, RedisResult};

use crate::guard::fenced_cmd;
use crate::link::Link;
use crate::owner::{is_notowner, thread_owner};
use crate::stale;
use crate::times::{millis, wait_ms};

/// The locks under `keys`, taken together; each grant lasts `lease`.
#[derive(Clone, Debug)]
pub struct MultiLock {
    keys: Vec<String>,
    lease: Duration,
    owner: Option<String>,
    shared: bool,
    client: Option<Client>,
}

impl MultiLock {
    /// In a Cluster the keys must share a slot (hash tags: `{acct:42}:a`,
    /// `{acct:42}:b`), or the server answers `CROSSSLOT`.
    pub fn new<K: Into<String>>(keys: impl IntoIterator<Item = K>, lease: Duration) -> MultiLock {
        MultiLock { keys: keys.into_iter().map(Into::into).collect(), lease, owner: None, shared: false, client: None }
    }

    /// Acquires as `owner` instead of `<process id>:<thread id>`, the
    /// default owner of every lock of this crate: a thread's single locks
    /// and multi-locks are one owner, so it reenters a key it holds and
    /// the server follows it from lock to lock (deadlock detection).
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// The read side of every key (`SHARED`).
    pub fn shared(mut self) -> Self {
        self.shared = true;
        self
    }

    /// A command whose reply was lost is resent (same request ID) over a
    /// new connection from `client` when the one given to acquire broke.
    pub fn with_client(mut self, client: &Client) -> Self {
        self.client = Some(client.clone());
        self
    }

    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The owner name the calling thread acquires as.
    pub fn owner(&self) -> String {
        self.owner.clone().unwrap_or_else(thread_owner)
    }

    /// `FLOCK.ACQUIREALL`: every key, or `None` when one is busy (a try,
    /// `wait` `None` or zero) or the wait timed out (`Some(d)`: queued at
    /// every key and blocked up to `d`; [`crate::FOREVER`] has no limit).
    /// A key this owner holds already is reentered. An error of code
    /// `DEADLOCK` when the wait would close a cycle (nothing is queued).
    pub fn acquire<C: ConnectionLike>(&self, conn: C, wait: Option<Duration>) -> RedisResult<Option<MultiGuard<C>>> {
        let owner = self.owner();
        let mut cmd = redis::cmd("FLOCK.ACQUIREALL");
        cmd.arg(self.keys.len()).arg(&self.keys).arg(&owner).arg(millis(self.lease));
        if let Some(ms) = wait_ms(wait) {
            cmd.arg("WAIT").arg(ms);
        }
        if self.shared {
            cmd.arg("SHARED");
        }
        let mut link = Link { conn, client: self.client.clone(), spare: None };
        // Counted from before the send, as a single lock's (see `stale`).
        self.keys.iter().for_each(|key| stale::hold(key, &owner));
        let tokens: RedisResult<Option<Vec<u64>>> = link.query(&cmd);
        if !matches!(tokens, Ok(Some(_))) {
            self.keys.iter().for_each(|key| stale::unhold(key, &owner));
        }
        Ok(tokens?.map(|tokens| MultiGuard { link, keys: self.keys.clone(), owner, tokens, released: false }))
    }
}

/// Every key of a [`MultiLock`], held; released (one hold of each) when
/// dropped.
pub struct MultiGuard<C: ConnectionLike> {
    link: Link<C>,
    keys: Vec<String>,
    owner: String,
    tokens: Vec<u64>,
    released: bool,
}

impl<C: ConnectionLike> MultiGuard<C> {
    /// Each key's fencing token, in the order of the keys.
    pub fn tokens(&self) -> &[u64] {
        &self.tokens
    }

    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// [`Guard::fenced`](crate::Guard::fenced) for one of the keys: runs
    /// `command` as `FLOCK.FENCED key token command ...` with that key's
    /// token, so the command runs only while this grant of `key` holds it.
    /// An error of code `STALE` means nothing ran. A multi-guard keeps no
    /// record of losses, so every call is sent and the server decides (a
    /// token that stopped holding never holds again). Sent once, never
    /// resent after an I/O error (no request ID). A key not among
    /// [`MultiGuard::keys`] is a client error, and nothing is sent.
    pub fn fenced_on<T: FromRedisValue>(&mut self, key: &str, command: &Cmd) -> RedisResult<T> {
        let Some(i) = self.keys.iter().position(|k| k == key) else {
            return Err(RedisError::from((
                ErrorKind::ClientError,
                "not a key of this multi-lock",
                format!("{key} is not among {:?}; nothing was sent", self.keys),
            )));
        };
        let fenced = fenced_cmd(key, self.tokens[i], command)?;
        fenced.query(self.link.current()?)
    }

    /// Resets every key's lease to `lease` from now (`FLOCK.RENEW` each, in
    /// one pipeline); `NOTOWNER` if one was lost.
    pub fn renew(&mut self, lease: Duration) -> RedisResult<()> {
        let mut pipe = redis::pipe();
        for key in &self.keys {
            pipe.cmd("FLOCK.RENEW")
                .arg(key)
                .arg(&self.owner)
                .arg(millis(lease))
                .arg("ID")
                .arg(uuid::Uuid::new_v4().to_string());
        }
        let conn = self.link.current()?;
        pipe.query::<Vec<u64>>(conn).map(drop)
    }

    /// `FLOCK.RELEASEALL`: one hold of each key; each key's holds left.
    /// `NOTOWNER` if one was lost meanwhile; the keys still held are then
    /// given back one by one.
    pub fn release(mut self) -> RedisResult<Vec<u64>> {
        self.release_once()
    }

    fn release_once(&mut self) -> RedisResult<Vec<u64>> {
        self.released = true;
        let mut cmd = redis::cmd("FLOCK.RELEASEALL");
        cmd.arg(self.keys.len()).arg(&self.keys).arg(&self.owner);
        let released: RedisResult<Vec<u64>> = self.link.query(&cmd);
        if matches!(&released, Err(e) if is_notowner(e)) {
            for key in &self.keys {
                let _: RedisResult<u64> = self.link.query(redis::cmd("FLOCK.RELEASE").arg(key).arg(&self.owner));
            }
        }
        for (i, key) in self.keys.iter().enumerate() {
            stale::unhold(key, &self.owner);
            if let Some(left) = released.as_ref().map(|left| left.get(i).copied()).transpose() {
                stale::released(key, &self.owner, self.tokens[i], left);
            }
        }
        released
    }
}

impl<C: ConnectionLike> Drop for MultiGuard<C> {
    fn drop(&mut self) {
        if !self.released {
            let _ = self.release_once();
        }
    }
}

impl<C: ConnectionLike> std::fmt::Debug for MultiGuard<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("keys", &self.keys)
            .field("owner", &self.owner)
            .field("tokens", &self.tokens)
            .finish()
    }
}
