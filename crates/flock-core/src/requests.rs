//! Request IDs: the replies of commands sent with `ID request-id`, kept for
//! a while so that a command a client resends (its reply was lost) is
//! answered the same and applied once.
//!
//! A lock keeps its own table, so the IDs live, persist, replicate and
//! migrate with its key. Each record stays at least until the expiry it was
//! given; records leave in the order they came, so pruning is O(1) per
//! record and a lookup is one hash probe.

use hashbrown::HashTable;
use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};

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

/// A record in arrival order. `live` is false once its id was recorded
/// again: the table then points at the newer record.
#[derive(Debug)]
struct Entry {
    id: Box<[u8]>,
    record: Record,
    live: bool,
}

/// Each id is stored once, in `order`; the table holds only the sequence
/// number of an id's live record (8 bytes and a control byte), so a
/// remembered UUID costs about half of what a map from id to record plus a
/// queue of ids did.
#[derive(Debug, Default)]
pub struct Requests {
    /// Every record not yet pruned, oldest first.
    order: VecDeque<Entry>,
    /// The sequence number of `order[0]`: how many records were pruned.
    first: u64,
    /// The sequence numbers of the live records, found by their id.
    by_id: HashTable<u64>,
    /// Keyed (SipHash): request IDs are chosen by clients.
    hasher: RandomState,
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

    fn at(&self, seq: u64) -> &Entry {
        &self.order[(seq - self.first) as usize]
    }

    pub fn get(&self, id: &[u8]) -> Option<&Record> {
        let seq = self.by_id.find(self.hasher.hash_one(id), |&seq| *self.at(seq).id == *id)?;
        Some(&self.at(*seq).record)
    }

    pub fn record(&mut self, id: &[u8], record: Record) {
        let seq = self.made();
        let hash = self.hasher.hash_one(id);
        let (order, first, hasher) = (&mut self.order, self.first, &self.hasher);
        match self.by_id.find_mut(hash, |&s| *order[(s - first) as usize].id == *id) {
            Some(live) => {
                order[(*live - first) as usize].live = false;
                *live = seq;
            }
            None => {
                self.by_id.insert_unique(hash, seq, |&s| hasher.hash_one(&*order[(s - first) as usize].id));
            }
        }
        order.push_back(Entry { id: id.into(), record, live: true });
        self.latest_ms = self.latest_ms.max(record.expires_ms);
    }

    /// Forgets every record whose expiry has passed at `now_ms`, as far as
    /// they came in order (a record given a later expiry before a shorter
    /// window was set may keep the ones behind it a little longer).
    pub fn prune(&mut self, now_ms: u64) {
        while let Some(oldest) = self.order.front().filter(|e| e.record.expires_ms <= now_ms) {
            if oldest.live {
                let first = self.first;
                if let Ok(found) = self.by_id.find_entry(self.hasher.hash_one(&*oldest.id), |&s| s == first) {
                    found.remove();
                }
            }
            self.order.pop_front();
            self.first += 1;
        }
        if self.by_id.is_empty() {
            self.first += self.order.len() as u64;
            self.order = VecDeque::new();
            self.by_id = HashTable::new();
        }
    }

    /// No record outlives this: when the table will be empty at the latest.
    pub fn latest_expiry(&self) -> u64 {
        self.latest_ms
    }

    /// Records, oldest first, each once.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Record)> + '_ {
        Self::live(self.order.iter())
    }

    /// The records made since `made()` answered `since`, oldest first.
    pub fn made_since(&self, since: u64) -> impl Iterator<Item = (&[u8], &Record)> + '_ {
        let skip = usize::try_from(since.saturating_sub(self.first)).unwrap_or(usize::MAX);
        Self::live(self.order.iter().skip(skip))
    }

    fn live<'a>(entries: impl Iterator<Item = &'a Entry>) -> impl Iterator<Item = (&'a [u8], &'a Record)> {
        entries.filter(|e| e.live).map(|e| (&*e.id, &e.record))
    }

    /// Records made so far, for telling which ones an operation added.
    pub fn made(&self) -> u64 {
        self.first + self.order.len() as u64
    }

    /// Heap bytes: each record's id, its entry in the order and its place
    /// in the table.
    pub fn heap_size(&self) -> usize {
        let ids: usize = self.order.iter().map(|e| e.id.len()).sum();
        let order = self.order.capacity() * std::mem::size_of::<Entry>();
        let table = self.by_id.capacity() * (std::mem::size_of::<u64>() + 1);
        ids + order + table
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

    proptest::proptest! {
        /// Against a model (every record kept in a Vec, looked up by
        /// scanning): lookups, counts and the listing agree after any mix
        /// of records (ids re-recorded too) and prunes.
        #[test]
        fn agrees_with_a_list_of_records(ops in proptest::collection::vec((0u8..12, 0u64..40, proptest::bool::ANY), 1..200)) {
            let mut r = Requests::default();
            let mut model: Vec<(u8, Record)> = Vec::new();
            let mut now = 0;
            for (n, (id, window, prune)) in ops.into_iter().enumerate() {
                if prune {
                    now += window;
                    r.prune(now);
                    // Forgotten in arrival order too, up to the first record not due.
                    let due = model.iter().take_while(|(_, rec)| rec.expires_ms <= now).count();
                    model.drain(..due);
                } else {
                    let rec = rec(Kind::Renew, n as u64, now + window);
                    let before = r.made();
                    r.record(&[id], rec);
                    let made: Vec<_> = r.made_since(before).map(|(id, rec)| (id.to_vec(), *rec)).collect();
                    proptest::prop_assert_eq!(made, vec![(vec![id], rec)]);
                    model.push((id, rec));
                }
                // An id's record is the last one made for it.
                let live: Vec<(u8, Record)> = model
                    .iter()
                    .enumerate()
                    .filter(|(p, (i, _))| model.iter().rposition(|(j, _)| j == i) == Some(*p))
                    .map(|(_, e)| *e)
                    .collect();
                for id in 0u8..12 {
                    proptest::prop_assert_eq!(r.get(&[id]), live.iter().find(|(i, _)| *i == id).map(|(_, rec)| rec));
                }
                proptest::prop_assert_eq!(r.len(), live.len());
                proptest::prop_assert_eq!(r.iter().map(|(id, rec)| (id[0], *rec)).collect::<Vec<_>>(), live);
            }
        }
    }

    #[test]
    fn kinds_round_trip_through_their_codes() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_code(kind.code()), Some(kind));
        }
        assert_eq!(Kind::from_code(4), None);
    }
}
