//! The record of long holds and long waits (`FLOCK.LONGLOG`), as `SLOWLOG`
//! is of slow commands: the newest entries, at most a set number.

use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Hold,
    Wait,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Hold => "hold",
            Kind::Wait => "wait",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Rising, never given twice (RESET keeps counting, as SLOWLOG does).
    pub id: u64,
    /// When it ended.
    pub at_unix_ms: u64,
    pub kind: Kind,
    pub key: Box<[u8]>,
    pub owner: Box<[u8]>,
    pub duration_ms: u64,
    /// How it ended (`End::name`, `WaitEnd::name`).
    pub ended: &'static str,
}

/// What ended, for `LongLog::offer`.
pub struct Ended<'a> {
    pub kind: Kind,
    pub key: &'a [u8],
    pub owner: &'a [u8],
    pub duration_ms: u64,
    pub ended: &'static str,
}

#[derive(Default)]
pub struct LongLog {
    entries: VecDeque<Entry>,
    next_id: u64,
}

/// When an ending is long enough to keep, and how many are kept.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// 0: holds are not recorded.
    pub hold_ms: u64,
    /// 0: waits are not recorded.
    pub wait_ms: u64,
    pub max_len: usize,
}

impl LongLog {
    /// Keeps `e` if it lasted at least its kind's threshold, as ending at
    /// `at_unix_ms()`: a hold or wait that is not kept costs the check alone.
    pub fn offer(&mut self, e: Ended, at_unix_ms: impl FnOnce() -> u64, limits: Limits) {
        let threshold = match e.kind {
            Kind::Hold => limits.hold_ms,
            Kind::Wait => limits.wait_ms,
        };
        if threshold == 0 || e.duration_ms < threshold || limits.max_len == 0 {
            return;
        }
        let entry = Entry {
            id: self.next_id,
            at_unix_ms: at_unix_ms(),
            kind: e.kind,
            key: e.key.into(),
            owner: e.owner.into(),
            duration_ms: e.duration_ms,
            ended: e.ended,
        };
        self.next_id += 1;
        self.entries.push_front(entry);
        self.entries.truncate(limits.max_len);
    }

    /// The newest `n` entries, newest first (`None`: all).
    pub fn newest(&self, n: Option<usize>) -> impl ExactSizeIterator<Item = &Entry> {
        self.entries.iter().take(n.unwrap_or(usize::MAX).min(self.entries.len()))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn reset(&mut self) {
        self.entries.clear();
    }

    /// A lower `flock.longlog-max-len` drops the oldest at once.
    pub fn shorten(&mut self, max_len: usize) {
        self.entries.truncate(max_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { hold_ms: 100, wait_ms: 50, max_len: 3 };

    fn ended(kind: Kind, key: &'static [u8], duration_ms: u64) -> Ended<'static> {
        Ended { kind, key, owner: b"o", duration_ms, ended: "released" }
    }

    #[test]
    fn only_what_lasted_its_threshold_is_kept_newest_first() {
        let mut log = LongLog::default();
        log.offer(ended(Kind::Hold, b"short", 99), || 1, LIMITS);
        log.offer(ended(Kind::Hold, b"long", 100), || 2, LIMITS);
        log.offer(ended(Kind::Wait, b"short-wait", 49), || 3, LIMITS);
        log.offer(ended(Kind::Wait, b"long-wait", 50), || 4, LIMITS);
        let keys: Vec<&[u8]> = log.newest(None).map(|e| &*e.key).collect();
        assert_eq!(keys, [&b"long-wait"[..], b"long"]);
        assert_eq!(log.newest(None).map(|e| e.id).collect::<Vec<_>>(), [1, 0]);
        assert_eq!(log.newest(Some(1)).len(), 1);
    }

    #[test]
    fn the_oldest_go_first_and_ids_keep_rising_across_reset() {
        let mut log = LongLog::default();
        for i in 0..5 {
            log.offer(ended(Kind::Hold, b"k", 100 + i), || i, LIMITS);
        }
        assert_eq!(log.newest(None).map(|e| e.duration_ms).collect::<Vec<_>>(), [104, 103, 102]);
        log.reset();
        assert!(log.is_empty());
        log.offer(ended(Kind::Hold, b"k", 100), || 9, LIMITS);
        assert_eq!(log.newest(None).next().map(|e| e.id), Some(5));
        log.shorten(0);
        assert_eq!(log.len(), 0);
    }

    #[test]
    fn a_threshold_of_zero_or_no_room_keeps_nothing() {
        let mut log = LongLog::default();
        log.offer(ended(Kind::Hold, b"k", u64::MAX), || 1, Limits { hold_ms: 0, ..LIMITS });
        log.offer(ended(Kind::Wait, b"k", u64::MAX), || 1, Limits { max_len: 0, ..LIMITS });
        assert!(log.is_empty());
    }
}
