//! Request IDs: the replies of commands sent with `ID request-id`, kept for
//! a while so that a command a client resends (its reply was lost) is
//! answered the same and applied once.
//!
//! A lock keeps its own table, so the IDs live, persist, replicate and
//! migrate with its key. Each record stays at least until the expiry it was
//! given; records leave in the order they came, so pruning is O(1) per
//! record and a lookup is one hash probe.

use std::collections::{HashMap, VecDeque};

/// The longest request ID, in bytes.
pub const MAX_ID_LEN: usize = 64;

/// Which command a request ID was used with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Acquire,
    Release,
    Renew,
    ForceRelease,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Acquire, Kind::Release, Kind::Renew, Kind::ForceRelease];

    pub fn code(self) -> u64 {
        self as u64
    }

    pub fn from_code(code: u64) -> Option<Kind> {
        Self::ALL.into_iter().find(|k| k.code() == code)
    }

    pub fn command(self) -> &'static str {
        match self {
            Kind::Acquire => "FLOCK.ACQUIRE",
            Kind::Release => "FLOCK.RELEASE",
            Kind::Renew => "FLOCK.RENEW",
            Kind::ForceRelease => "FLOCK.FORCERELEASE",
        }
    }
}

/// What an applied command answered: a token (ACQUIRE, RENEW), the holds
/// left (RELEASE) or the holders removed (FORCERELEASE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub kind: Kind,
    pub reply: u64,
    /// Absolute unix milliseconds.
    pub expires_ms: u64,
}

#[derive(Debug, Default)]
pub struct Requests {
    by_id: HashMap<Box<[u8]>, Record>,
    /// Ids in the order they were recorded, with the expiry each was given.
    order: VecDeque<(u64, Box<[u8]>)>,
    /// Records made so far, for telling which ones an operation added.
    made: u64,
    /// No record expires later than this.
    latest_ms: u64,
}

impl Requests {
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn get(&self, id: &[u8]) -> Option<&Record> {
        self.by_id.get(id)
    }

    pub fn record(&mut self, id: &[u8], record: Record) {
        self.by_id.insert(id.into(), record);
        self.order.push_back((record.expires_ms, id.into()));
        self.made += 1;
        self.latest_ms = self.latest_ms.max(record.expires_ms);
    }

    /// Forgets every record whose expiry has passed at `now_ms`, as far as
    /// they came in order (a record given a later expiry before a shorter
    /// window was set may keep the ones behind it a little longer).
    pub fn prune(&mut self, now_ms: u64) {
        while let Some((expires_ms, _)) = self.order.front().filter(|(e, _)| *e <= now_ms) {
            let expires_ms = *expires_ms;
            let Some((_, id)) = self.order.pop_front() else { break };
            // The id may have been recorded again since, with a later expiry.
            if self.by_id.get(&id).is_some_and(|r| r.expires_ms == expires_ms) {
                self.by_id.remove(&id);
            }
        }
        if self.by_id.is_empty() {
            self.order = VecDeque::new();
            self.by_id = HashMap::new();
        }
    }

    /// No record outlives this: when the table will be empty at the latest.
    pub fn latest_expiry(&self) -> u64 {
        self.latest_ms
    }

    /// Records, oldest first, each once.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Record)> + '_ {
        self.order.iter().filter_map(|(e, id)| self.by_id.get(id).filter(|r| r.expires_ms == *e).map(|r| (&**id, r)))
    }

    /// The records made since `made()` answered `since`, oldest first.
    pub fn made_since(&self, since: u64) -> impl Iterator<Item = (&[u8], &Record)> + '_ {
        let n = usize::try_from(self.made - since).unwrap_or(usize::MAX);
        let skip = self.order.len().saturating_sub(n);
        self.order.iter().skip(skip).filter_map(|(_, id)| self.by_id.get(id).map(|r| (&**id, r)))
    }

    pub fn made(&self) -> u64 {
        self.made
    }

    /// Heap bytes: each record's id twice (table and order), its entry and
    /// its place in the order.
    pub fn heap_size(&self) -> usize {
        let ids: usize = self.order.iter().map(|(_, id)| id.len()).sum();
        let table = self.by_id.capacity() * (std::mem::size_of::<Box<[u8]>>() + std::mem::size_of::<Record>() + 1);
        let order = self.order.capacity() * std::mem::size_of::<(u64, Box<[u8]>)>();
        2 * ids + table + order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: Kind, reply: u64, expires_ms: u64) -> Record {
        Record { kind, reply, expires_ms }
    }

    #[test]
    fn a_record_is_kept_until_its_expiry_and_then_forgotten() {
        let mut r = Requests::default();
        r.record(b"a", rec(Kind::Release, 1, 100));
        r.record(b"b", rec(Kind::Acquire, 7, 200));
        r.prune(99);
        assert_eq!(r.get(b"a"), Some(&rec(Kind::Release, 1, 100)));
        r.prune(100);
        assert_eq!(r.get(b"a"), None);
        assert_eq!(r.len(), 1);
        assert_eq!(r.latest_expiry(), 200);
        r.prune(200);
        assert!(r.is_empty());
        assert_eq!(r.heap_size(), 0, "an empty table gives its memory back");
    }

    #[test]
    fn an_id_recorded_again_keeps_its_newer_record() {
        let mut r = Requests::default();
        r.record(b"a", rec(Kind::Acquire, 1, 100));
        r.record(b"a", rec(Kind::Acquire, 2, 300));
        r.prune(150);
        assert_eq!(r.get(b"a").map(|r| r.reply), Some(2));
        assert_eq!(r.iter().count(), 1, "listed once");
    }

    #[test]
    fn made_since_lists_what_an_operation_added() {
        let mut r = Requests::default();
        r.record(b"a", rec(Kind::Renew, 1, 100));
        let before = r.made();
        r.record(b"b", rec(Kind::Renew, 2, 100));
        r.record(b"c", rec(Kind::Renew, 3, 100));
        let added: Vec<&[u8]> = r.made_since(before).map(|(id, _)| id).collect();
        assert_eq!(added, [&b"b"[..], &b"c"[..]]);
    }

    #[test]
    fn kinds_round_trip_through_their_codes() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_code(kind.code()), Some(kind));
        }
        assert_eq!(Kind::from_code(4), None);
    }
}
