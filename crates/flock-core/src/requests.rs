//! Request IDs: the replies of commands sent with `ID request-id`, kept for
//! a while so that a command a client resends (its reply was lost) is
//! answered the same and applied once.
//!
//! A lock in use keeps its own table, so the IDs persist, replicate and
//! migrate with its key. A free lock leaves no key (an old client's `SET NX`
//! must find the name free): its table moves to `Remembered`, and back into
//! the lock when the key is made again. Each record stays at least until the
//! expiry it was given; records leave in the order they came, so pruning is
//! O(1) per record and a lookup is one hash probe (two while the table
//! grows).
//!
//! A hot lock remembers hundreds of thousands of IDs (two a pair for the
//! retry window, 60 s by default). Its table grows in steps, as Redis's own
//! dict does: rehashing it whole at once stalled the server for up to 32 ms
//! at 840,000 records (0.8 ms now, the larger table's allocation).

use crate::chunked::ChunkedQueue;
use hashbrown::HashTable;
use std::collections::hash_map::Entry as Slot;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};

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

/// A record in arrival order, with its id's hash: the table grows (and
/// clears its tombstones) without hashing every id again, which cost a
/// client's uncontended pair about 900 instructions. `live` is false once
/// its id was recorded again: the table then points at the newer record.
/// The record's fields lie here side by side, so the hash fits in what a
/// `Record`'s padding took (48 bytes).
#[derive(Debug)]
struct Entry {
    id: Box<[u8]>,
    hash: u64,
    reply: u64,
    expires_ms: u64,
    kind: Kind,
    live: bool,
}

impl Entry {
    fn record(&self) -> Record {
        Record { kind: self.kind, reply: self.reply, expires_ms: self.expires_ms }
    }
}

/// A growth of `by_id` under way: the records of the table it outgrew move
/// into it a few at each record made (`Requests::step`), oldest first.
#[derive(Debug)]
struct Growth {
    outgrown: HashTable<u64>,
    /// The sequence number of the next record `step` looks at.
    cursor: u64,
}

/// Each id is stored once, in `order`; the table holds only the sequence
/// number of an id's live record (8 bytes and a control byte), so a
/// remembered UUID costs about half of what a map from id to record plus a
/// queue of ids did.
#[derive(Debug, Default)]
pub struct Requests {
    /// Every record not yet pruned, oldest first.
    order: ChunkedQueue<Entry>,
    /// The sequence number of `order[0]`: how many records were pruned.
    first: u64,
    /// The sequence numbers of the live records, found by their id.
    by_id: HashTable<u64>,
    /// While `by_id` grows, the table it outgrew (boxed: a table that never
    /// grows, as most do, pays 8 bytes for it).
    growth: Option<Box<Growth>>,
    /// Keyed (SipHash): request IDs are chosen by clients.
    hasher: RandomState,
    /// No record expires later than this.
    latest_ms: u64,
}

impl Requests {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.by_id.len() + self.growth.as_ref().map_or(0, |g| g.outgrown.len())
    }

    fn at(&self, seq: u64) -> &Entry {
        &self.order[(seq - self.first) as usize]
    }

    pub fn get(&self, id: &[u8]) -> Option<Record> {
        let hash = self.hasher.hash_one(id);
        let is_id = |&seq: &u64| *self.at(seq).id == *id;
        let seq = self.by_id.find(hash, is_id).or_else(|| self.growth.as_ref()?.outgrown.find(hash, is_id))?;
        Some(self.at(*seq).record())
    }

    /// The record of `id`, after forgetting what has expired at `now_ms`.
    pub fn find(&mut self, id: &[u8], now_ms: u64) -> Option<Record> {
        self.prune(now_ms);
        // One behind a record that expires later is still here.
        self.get(id).filter(|r| r.expires_ms > now_ms)
    }

    /// Adds `other`'s records, the smaller table into the larger; for an id
    /// in both, the record that expires later.
    pub fn merge(&mut self, mut other: Requests) {
        if other.len() > self.len() {
            std::mem::swap(self, &mut other);
        }
        for (id, record) in other.iter() {
            if self.get(id).is_none_or(|mine| mine.expires_ms < record.expires_ms) {
                self.record(id, record);
            }
        }
    }

    pub fn record(&mut self, id: &[u8], record: Record) {
        let seq = self.made();
        let hash = self.hasher.hash_one(id);
        let (order, first) = (&mut self.order, self.first);
        let is_id = |&s: &u64| *order[(s - first) as usize].id == *id;
        let earlier = match self.by_id.find_mut(hash, is_id) {
            Some(live) => Some(std::mem::replace(live, seq)),
            None => {
                let outgrown = self.growth.as_mut().and_then(|g| g.outgrown.find_entry(hash, is_id).ok());
                let moved = outgrown.map(|older| older.remove().0);
                self.insert(hash, seq);
                moved
            }
        };
        if let Some(earlier) = earlier {
            self.order[(earlier - self.first) as usize].live = false;
        }
        let Record { kind, reply, expires_ms } = record;
        self.order.push_back(Entry { id: id.into(), hash, reply, expires_ms, kind, live: true });
        self.latest_ms = self.latest_ms.max(record.expires_ms);
        self.step();
    }

    /// Files `seq` under `hash` in `by_id`. A full table is not rehashed
    /// whole (hashbrown would, on this insert): a table twice the records'
    /// size takes its place, and `step` moves the records into it.
    fn insert(&mut self, hash: u64, seq: u64) {
        if !self.by_id.is_empty() && self.by_id.len() == self.by_id.capacity() {
            // The last growth has moved everything unless records were made
            // again and again under a few ids; then the rest moves now.
            while self.growth.is_some() {
                self.step();
            }
            let grown = HashTable::with_capacity(2 * self.by_id.len());
            let outgrown = std::mem::replace(&mut self.by_id, grown);
            self.growth = Some(Box::new(Growth { outgrown, cursor: self.first }));
        }
        let (order, first) = (&self.order, self.first);
        self.by_id.insert_unique(hash, seq, |&s| order[(s - first) as usize].hash);
    }

    /// Moves the live records among the next few of `order` from the
    /// outgrown table into `by_id`. Each record made looks at this many, so a growth ends
    /// long before the new table fills (unless most records are dead ones,
    /// of ids made again).
    fn step(&mut self) {
        const LOOKED_AT: u64 = 8;
        let made = self.made();
        let Some(growth) = self.growth.as_mut() else { return };
        let start = growth.cursor.max(self.first);
        let end = (start + LOOKED_AT).min(made);
        let (order, first) = (&self.order, self.first);
        for seq in start..end {
            let entry = &order[(seq - first) as usize];
            if entry.live {
                if let Ok(found) = growth.outgrown.find_entry(entry.hash, |&s| s == seq) {
                    found.remove();
                    self.by_id.insert_unique(entry.hash, seq, |&s| order[(s - first) as usize].hash);
                }
            }
        }
        growth.cursor = end;
        if growth.outgrown.is_empty() {
            self.growth = None;
        }
    }

    /// Forgets every record whose expiry has passed at `now_ms`, as far as
    /// they came in order (a record given a later expiry before a shorter
    /// window was set may keep the ones behind it a little longer).
    pub fn prune(&mut self, now_ms: u64) {
        while let Some(oldest) = self.order.front().filter(|e| e.expires_ms <= now_ms) {
            if oldest.live {
                let first = self.first;
                if let Ok(found) = self.by_id.find_entry(oldest.hash, |&s| s == first) {
                    found.remove();
                } else if let Some(Ok(found)) =
                    self.growth.as_mut().map(|g| g.outgrown.find_entry(oldest.hash, |&s| s == first))
                {
                    found.remove();
                }
            }
            self.order.pop_front();
            self.first += 1;
        }
        if self.is_empty() {
            self.first += self.order.len() as u64;
            self.order = ChunkedQueue::default();
            self.by_id = HashTable::new();
            self.growth = None;
        }
    }

    /// No record outlives this: when the table will be empty at the latest.
    pub fn latest_expiry(&self) -> u64 {
        self.latest_ms
    }

    /// Records, oldest first, each once.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Record)> + '_ {
        Self::live(self.order.iter())
    }

    /// The records made since `made()` answered `since`, oldest first.
    pub fn made_since(&self, since: u64) -> impl Iterator<Item = (&[u8], Record)> + '_ {
        let skip = usize::try_from(since.saturating_sub(self.first)).unwrap_or(usize::MAX);
        Self::live(self.order.iter_from(skip))
    }

    fn live<'a>(entries: impl Iterator<Item = &'a Entry>) -> impl Iterator<Item = (&'a [u8], Record)> {
        entries.filter(|e| e.live).map(|e| (&*e.id, e.record()))
    }

    /// Records made so far, for telling which ones an operation added.
    pub fn made(&self) -> u64 {
        self.first + self.order.len() as u64
    }

    /// Heap bytes: each record's id, its entry in the order and its place
    /// in the table.
    pub fn heap_size(&self) -> usize {
        let ids: usize = self.order.iter().map(|e| e.id.len()).sum();
        let table = |t: &HashTable<u64>| t.capacity() * (std::mem::size_of::<u64>() + 1);
        let outgrown = self.growth.as_ref().map_or(0, |g| std::mem::size_of::<Growth>() + table(&g.outgrown));
        ids + self.order.heap_size() + table(&self.by_id) + outgrown
    }
}

/// The tables of locks that have no key now, by lock, each kept until its
/// last record expires. Entries leave in the order their tables last grew,
/// each checked against its table's sequence number when it comes first:
/// every operation is O(1) amortized (a merge: O(the smaller table)).
pub struct Remembered<K> {
    /// Each table with the sequence number of its newest entry in `order`.
    by_key: HashMap<K, (Requests, u64)>,
    /// Keys with the latest expiry their table had then, and a sequence
    /// number: an entry whose table grew or left since is stale.
    order: ChunkedQueue<(K, u64, u64)>,
    made: u64,
    /// Tables whose every record expired, freed `FREED_PER_PRUNE` records
    /// at each prune: freeing a hot lock's at once, one free per ID, took
    /// 11 ms at 840,000.
    retired: Vec<Requests>,
}

/// How many records of retired tables a prune frees (about 15 µs).
const FREED_PER_PRUNE: usize = 1024;

impl<K> Default for Remembered<K> {
    fn default() -> Self {
        Self { by_key: HashMap::new(), order: ChunkedQueue::default(), made: 0, retired: Vec::new() }
    }
}

impl<K: Hash + Eq + Clone> Remembered<K> {
    /// Keeps the table of a lock that leaves its key.
    pub fn keep(&mut self, key: K, requests: Requests) {
        if requests.is_empty() {
            return;
        }
        self.file(key, |entry| match entry {
            Slot::Occupied(mine) => {
                let mine = mine.into_mut();
                mine.0.merge(requests);
                mine
            }
            Slot::Vacant(none) => none.insert((requests, 0)),
        });
    }

    /// One record of a lock with no key (replicated or loaded before the
    /// key is made, or after it went).
    pub fn record(&mut self, key: K, id: &[u8], record: Record) {
        self.file(key, |entry| {
            let table = entry.or_default();
            table.0.record(id, record);
            table
        });
    }

    /// Files `key`'s table, as `change` leaves its entry, again under its
    /// latest expiry: one lookup of the key.
    fn file(&mut self, key: K, change: impl FnOnce(Slot<'_, K, (Requests, u64)>) -> &mut (Requests, u64)) {
        self.made += 1;
        let (table, made) = change(self.by_key.entry(key.clone()));
        *made = self.made;
        self.order.push_back((key, table.latest_expiry(), self.made));
    }

    /// The table of a lock made again under its key.
    pub fn take(&mut self, key: &K) -> Option<Requests> {
        self.by_key.remove(key).map(|(table, _)| table)
    }

    /// The record of `id` for the lock `key` has no key for.
    pub fn find(&mut self, key: &K, id: &[u8], now_ms: u64) -> Option<Record> {
        self.by_key.get_mut(key)?.0.find(id, now_ms)
    }

    /// Forgets the tables whose every record has expired at `now_ms`, and
    /// frees some of the records of those too large to free at once.
    pub fn prune(&mut self, now_ms: u64) {
        while let Some((key, _, seq)) = self.order.front().filter(|&&(_, until, _)| until <= now_ms) {
            if self.by_key.get(key).is_some_and(|&(_, at)| at == *seq) {
                if let Some((table, _)) =
                    self.by_key.remove(key).filter(|(table, _)| table.order.len() > FREED_PER_PRUNE)
                {
                    self.retired.push(table);
                }
            }
            self.order.pop_front();
        }
        if self.by_key.is_empty() {
            self.order = ChunkedQueue::default();
        }
        let mut left = FREED_PER_PRUNE;
        while let Some(table) = self.retired.last_mut() {
            while left > 0 && table.order.pop_front().is_some() {
                left -= 1;
            }
            if left == 0 {
                break;
            }
            self.retired.pop();
        }
    }

    /// When `prune` next has something to do: at once (0) while a retired
    /// table is being freed.
    pub fn next_expiry(&self) -> Option<u64> {
        if !self.retired.is_empty() {
            return Some(0);
        }
        self.order.front().map(|&(_, until, _)| until)
    }

    /// Locks remembered.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &Requests)> + '_ {
        self.by_key.iter().map(|(k, (t, _))| (k, t))
    }

    /// Forgets the locks `gone` names (a flushed database).
    pub fn forget_where(&mut self, gone: impl Fn(&K) -> bool) {
        self.by_key.retain(|k, _| !gone(k));
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
        assert_eq!(r.get(b"a"), Some(rec(Kind::Release, 1, 100)));
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
                    let made: Vec<_> = r.made_since(before).map(|(id, rec)| (id.to_vec(), rec)).collect();
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
                    proptest::prop_assert_eq!(r.get(&[id]), live.iter().find(|(i, _)| *i == id).map(|&(_, rec)| rec));
                }
                proptest::prop_assert_eq!(r.len(), live.len());
                proptest::prop_assert_eq!(r.iter().map(|(id, rec)| (id[0], rec)).collect::<Vec<_>>(), live);
            }
        }
    }

    /// Thousands of records, some ids made again: every one is found at
    /// each point of the table's growths, which move the records a few at a
    /// time, and prunes find them wherever they are.
    #[test]
    fn a_growing_table_finds_every_record_while_its_records_move() {
        let mut r = Requests::default();
        let mut latest = std::collections::HashMap::new();
        let mut while_moving = 0;
        for n in 0u64..6_000 {
            let id = if n % 5 == 4 { n / 3 } else { n };
            r.record(&id.to_be_bytes(), rec(Kind::Acquire, n, 10_000 + n));
            latest.insert(id, n);
            if r.growth.is_some() {
                while_moving += 1;
                if while_moving % 97 == 0 {
                    for (id, &n) in &latest {
                        assert_eq!(r.get(&id.to_be_bytes()).map(|r| r.reply), Some(n), "id {id} while moving");
                    }
                }
            }
            assert_eq!(r.len(), latest.len());
        }
        assert!(while_moving > 1_000, "the growths took steps ({while_moving} records made while one ran)");
        r.prune(10_000 + 3_000);
        latest.retain(|_, &mut n| n > 3_000);
        assert_eq!(r.len(), latest.len());
        for (id, &n) in &latest {
            assert_eq!(r.get(&id.to_be_bytes()).map(|r| r.reply), Some(n));
        }
        r.prune(u64::MAX);
        assert!(r.is_empty() && r.heap_size() == 0);
    }

    #[test]
    fn a_merge_keeps_every_id_once_with_its_later_record() {
        let mut a = Requests::default();
        a.record(b"x", rec(Kind::Release, 1, 100));
        a.record(b"y", rec(Kind::Release, 2, 100));
        let mut b = Requests::default();
        b.record(b"y", rec(Kind::Release, 3, 300));
        b.record(b"z", rec(Kind::Renew, 4, 50));
        b.merge(a);
        let mut all: Vec<_> = b.iter().map(|(id, r)| (id.to_vec(), r.reply)).collect();
        all.sort();
        assert_eq!(all, [(b"x".to_vec(), 1), (b"y".to_vec(), 3), (b"z".to_vec(), 4)]);
        assert_eq!(b.latest_expiry(), 300);
    }

    fn table(records: &[(&[u8], u64)]) -> Requests {
        let mut t = Requests::default();
        for &(id, expires_ms) in records {
            t.record(id, rec(Kind::Release, 0, expires_ms));
        }
        t
    }

    #[test]
    fn a_remembered_table_is_found_taken_back_or_forgotten_when_its_last_record_expires() {
        let mut r = Remembered::default();
        r.keep("a", table(&[(b"1", 100), (b"2", 200)]));
        r.keep("b", table(&[(b"3", 150)]));
        r.keep("c", Requests::default());
        assert_eq!((r.len(), r.next_expiry()), (2, Some(200)), "an empty table is not kept");
        assert_eq!(r.find(&"a", b"1", 99).map(|r| r.expires_ms), Some(100));
        assert_eq!(r.find(&"a", b"1", 100), None, "expired");
        r.prune(199);
        assert_eq!(r.len(), 2, "a's last record is still due at 200");
        r.prune(200);
        assert_eq!(r.len(), 0, "b's entry was behind a's and goes with it");
        r.keep("a", table(&[(b"1", 500)]));
        assert_eq!(r.take(&"a").map(|t| t.len()), Some(1));
        assert!(r.take(&"a").is_none());
        r.prune(1_000);
        assert_eq!(r.order.len(), 0, "stale entries leave too");
    }

    #[test]
    fn a_large_expired_table_is_freed_a_part_at_each_prune() {
        let mut r = Remembered::default();
        let records: Vec<[u8; 4]> = (0..5_000u32).map(u32::to_be_bytes).collect();
        r.keep("hot", table(&records.iter().map(|id| (&id[..], 100)).collect::<Vec<_>>()));
        r.keep("small", table(&[(b"1", 100)]));
        r.prune(100);
        assert!(r.is_empty(), "both forgotten at once");
        assert_eq!(
            r.retired.iter().map(|t| t.order.len()).sum::<usize>(),
            5_000 - FREED_PER_PRUNE,
            "the small one went whole"
        );
        assert_eq!(r.next_expiry(), Some(0), "the timer comes back at once");
        let mut prunes = 1;
        while r.next_expiry().is_some() {
            r.prune(100);
            prunes += 1;
        }
        assert_eq!(prunes, 5, "{FREED_PER_PRUNE} records a prune");
    }

    #[test]
    fn a_table_that_grows_again_is_kept_until_its_new_expiry() {
        let mut r = Remembered::default();
        r.keep("a", table(&[(b"1", 100)]));
        r.record("a", b"2", rec(Kind::Renew, 7, 300));
        r.keep("a", table(&[(b"3", 200)]));
        r.prune(250);
        assert_eq!(r.find(&"a", b"2", 250).map(|r| r.reply), Some(7));
        assert_eq!(r.find(&"a", b"3", 250), None);
        r.prune(300);
        assert!(r.is_empty());
        r.record("b", b"x", rec(Kind::Renew, 1, 10));
        r.forget_where(|k| *k == "b");
        assert!(r.is_empty());
    }

    #[test]
    fn a_record_with_its_hash_takes_what_it_took_without() {
        assert_eq!(std::mem::size_of::<Entry>(), 48);
    }

    #[test]
    fn kinds_round_trip_through_their_codes() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_code(kind.code()), Some(kind));
        }
        assert_eq!(Kind::from_code(4), None);
    }
}
