//! Who holds a key: one table for every kind of holder (exclusive, shared,
//! semaphore), each holder found by owner and by token in O(1).
//!
//! Most keys are plain exclusive locks, held by one owner without SESSION:
//! that holder is kept inline (`Holders::One`), so such a key costs no
//! allocation beyond its owner string. An exclusive holder bound to a
//! session (the clients' default) is boxed with its terms (`Boxed::Bound`,
//! one allocation); every other case (shared holders, a semaphore's) is the
//! boxed table. Callers see one kind of holder either way.

use rustc_hash::FxHashMap;
use std::collections::HashMap;

use crate::deadlines::DeadlineId;

/// A grant: who holds it, how often, under which fencing token, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub owner: Box<[u8]>,
    pub token: u64,
    /// Absolute unix milliseconds.
    pub deadline_ms: u64,
    pub holds: u32,
    /// Where the Redis layer filed this lease's deadline to be woken at it;
    /// a new holder has none. Kept here because it costs no extra bytes.
    pub deadline_id: Option<DeadlineId>,
}

impl Holder {
    pub fn new(owner: Box<[u8]>, holds: u32, token: u64, deadline_ms: u64) -> Self {
        Self { owner, token, deadline_ms, holds, deadline_id: None }
    }
}

/// What a holder holds beyond its lease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Terms {
    /// The client id whose disconnect ends the grant (SESSION).
    pub session: Option<u64>,
    /// A semaphore holder's permits; 0 for a lock's holders.
    pub permits: u32,
    /// No lease of its own (`lease-ms` 0): it lives while its session does.
    /// Its deadline is only what replicas and the disk see (the session's
    /// timeout, pushed on as the session is heard from), so the master
    /// never ends it there. Neither replicated nor persisted: a loaded or
    /// replicated grant has a plain lease.
    pub session_lease: bool,
    /// How long the lock stays closed to everyone after this grant ends
    /// without its holder releasing it (`LOCKDELAY`): time for a holder that
    /// lost it unawares to stop writing. Kept on the master only.
    pub lock_delay_ms: u32,
}

/// How a key is held. All of a key's holders hold it in one mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Exclusive,
    /// The read side of a read-write lock.
    Shared,
    /// A semaphore of this many permits.
    Semaphore(u32),
}

impl Mode {
    /// The semaphore's limit; `None` for a lock (exclusive or shared).
    pub fn limit(self) -> Option<u32> {
        match self {
            Mode::Semaphore(limit) => Some(limit),
            Mode::Exclusive | Mode::Shared => None,
        }
    }

    /// Both are modes of one kind of key: a lock, or the same semaphore.
    pub fn same_key_kind(self, other: Mode) -> bool {
        self.limit() == other.limit()
    }
}

/// What an ACQUIRE asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// The lock alone (no `SHARED`, no `PERMITS`).
    Exclusive,
    /// The read side of a read-write lock.
    Shared,
    /// `n` of the `limit` permits of a semaphore.
    Permits { n: u32, limit: u32 },
}

impl Want {
    /// Whether a holder of `self` and one of `other` exclude each other
    /// whatever else holds the key: writers exclude everyone, readers only
    /// writers, and two semaphore grants whose permits together exceed the
    /// limit exclude each other.
    pub fn conflicts(self, other: Want) -> bool {
        match (self, other) {
            (Want::Shared, Want::Shared) => false,
            (Want::Permits { n, limit }, Want::Permits { n: m, .. }) => u64::from(n) + u64::from(m) > u64::from(limit),
            _ => true,
        }
    }

    pub fn mode(self) -> Mode {
        match self {
            Want::Exclusive => Mode::Exclusive,
            Want::Shared => Mode::Shared,
            Want::Permits { limit, .. } => Mode::Semaphore(limit),
        }
    }

    pub fn permits(self) -> u32 {
        match self {
            Want::Permits { n, .. } => n,
            Want::Exclusive | Want::Shared => 0,
        }
    }
}

pub enum Holders {
    /// One exclusive holder without a session: a plain lock.
    One(Holder),
    /// Nobody (`None`: a free lock), or any other holders.
    Boxed(Option<Boxed>),
}

/// Holders kept behind a pointer, so that a plain lock's value keeps its
/// size (one enum of two boxes fits where `One`'s holder leaves room).
pub enum Boxed {
    /// One exclusive holder with its terms (a session): one allocation.
    Bound(Box<(Holder, Terms)>),
    /// Shared holders, a semaphore's, or several exclusive ones restored.
    Table(Box<Table>),
}

pub struct Table {
    mode: Mode,
    by_token: FxHashMap<u64, (Holder, Terms)>,
    by_owner: HashMap<Box<[u8]>, u64>,
    /// Permits held (semaphore), or holders (lock).
    used: u64,
}

impl Table {
    fn new(mode: Mode) -> Box<Self> {
        Box::new(Table { mode, by_token: FxHashMap::default(), by_owner: HashMap::new(), used: 0 })
    }

    fn add(&mut self, holder: Holder, terms: Terms) {
        self.used += weight(terms);
        self.by_owner.insert(holder.owner.clone(), holder.token);
        self.by_token.insert(holder.token, (holder, terms));
    }
}

/// What a holder takes from the key: its permits, or one reader's share.
fn weight(terms: Terms) -> u64 {
    u64::from(terms.permits.max(1))
}

impl Default for Holders {
    fn default() -> Self {
        Holders::Boxed(None)
    }
}

impl Holders {
    fn table(&self) -> Option<&Table> {
        match self {
            Holders::Boxed(Some(Boxed::Table(table))) => Some(table),
            _ => None,
        }
    }

    fn table_mut(&mut self) -> Option<&mut Table> {
        match self {
            Holders::Boxed(Some(Boxed::Table(table))) => Some(table),
            _ => None,
        }
    }

    /// The one exclusive holder kept outside a table, with its terms.
    fn single(&self) -> Option<(&Holder, Terms)> {
        match self {
            Holders::One(h) => Some((h, Terms::default())),
            Holders::Boxed(Some(Boxed::Bound(bound))) => Some((&bound.0, bound.1)),
            Holders::Boxed(_) => None,
        }
    }

    /// Takes out the one holder kept outside a table, leaving nobody.
    fn take_single(&mut self) -> Option<(Holder, Terms)> {
        match std::mem::take(self) {
            Holders::One(h) => Some((h, Terms::default())),
            Holders::Boxed(Some(Boxed::Bound(bound))) => Some(*bound),
            other => {
                *self = other;
                None
            }
        }
    }

    pub fn len(&self) -> usize {
        match (self.single(), self.table()) {
            (Some(_), _) => 1,
            (None, table) => table.map_or(0, |t| t.by_token.len()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How the key is held; a key nobody holds is an exclusive lock unless
    /// it stays a semaphore.
    pub fn mode(&self) -> Mode {
        self.table().map_or(Mode::Exclusive, |t| t.mode)
    }

    /// Permits in use (semaphore), or holders (lock).
    pub fn used(&self) -> u64 {
        match (self.single(), self.table()) {
            (Some(_), _) => 1,
            (None, table) => table.map_or(0, |t| t.used),
        }
    }

    pub fn get(&self, token: u64) -> Option<(&Holder, Terms)> {
        match self.table() {
            Some(table) => table.by_token.get(&token).map(|(h, t)| (h, *t)),
            None => self.single().filter(|(h, _)| h.token == token),
        }
    }

    pub fn get_mut(&mut self, token: u64) -> Option<&mut Holder> {
        self.entry_mut(token).map(|(h, _)| h)
    }

    /// The holder with this token, and its terms where they can change (a
    /// plain lock's are none).
    fn entry_mut(&mut self, token: u64) -> Option<(&mut Holder, Option<&mut Terms>)> {
        let (holder, terms) = match self {
            Holders::One(h) => (h, None),
            Holders::Boxed(Some(Boxed::Bound(bound))) => (&mut bound.0, Some(&mut bound.1)),
            Holders::Boxed(Some(Boxed::Table(table))) => {
                return table.by_token.get_mut(&token).map(|(h, terms)| (h, Some(terms)));
            }
            Holders::Boxed(None) => return None,
        };
        (holder.token == token).then_some((holder, terms))
    }

    /// The token of `owner`'s grant.
    pub fn token_of(&self, owner: &[u8]) -> Option<u64> {
        match self.table() {
            Some(table) => table.by_owner.get(owner).copied(),
            None => self.single().filter(|(h, _)| *h.owner == *owner).map(|(h, _)| h.token),
        }
    }

    /// In no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&Holder, Terms)> + '_ {
        let table = self.table().into_iter().flat_map(|t| t.by_token.values().map(|(h, t)| (h, *t)));
        self.single().into_iter().chain(table)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Holder> + '_ {
        let (one, table) = match self {
            Holders::One(h) => (Some(h), None),
            Holders::Boxed(Some(Boxed::Bound(bound))) => (Some(&mut bound.0), None),
            Holders::Boxed(Some(Boxed::Table(table))) => (None, Some(table)),
            Holders::Boxed(None) => (None, None),
        };
        one.into_iter().chain(table.into_iter().flat_map(|t| t.by_token.values_mut().map(|(h, _)| h)))
    }

    /// Adds a holder that fits beside the others (same mode, a new owner
    /// and token): the caller checked.
    pub fn insert(&mut self, holder: Holder, terms: Terms, mode: Mode) {
        if matches!(self, Holders::Boxed(None)) && mode == Mode::Exclusive {
            *self = match terms == Terms::default() {
                true => Holders::One(holder),
                false => Holders::Boxed(Some(Boxed::Bound(Box::new((holder, terms))))),
            };
            return;
        }
        self.make_table(mode).add(holder, terms);
    }

    /// The table, made from the one holder or from nothing.
    fn make_table(&mut self, mode: Mode) -> &mut Table {
        let table = match self.take_single() {
            Some((one, terms)) => {
                let mut table = Table::new(Mode::Exclusive);
                table.add(one, terms);
                Some(table)
            }
            None if matches!(self, Holders::Boxed(None)) => Some(Table::new(mode)),
            None => None,
        };
        if let Some(table) = table {
            *self = Holders::Boxed(Some(Boxed::Table(table)));
        }
        self.table_mut().expect("made a table above")
    }

    pub fn remove(&mut self, token: u64) -> Option<(Holder, Terms)> {
        let Some(table) = self.table_mut() else {
            return match self.single() {
                Some((h, _)) if h.token == token => self.take_single(),
                _ => None,
            };
        };
        let (holder, terms) = table.by_token.remove(&token)?;
        table.by_owner.remove(&holder.owner);
        table.used -= weight(terms);
        // A semaphore stays one while its key exists.
        if table.by_token.is_empty() && table.mode.limit().is_none() {
            *self = Holders::Boxed(None);
        }
        Some((holder, terms))
    }

    /// Binds the holder with this token to `session` (or unbinds it).
    pub fn set_session(&mut self, token: u64, session: Option<u64>) {
        if session.is_some() && matches!(self, Holders::One(h) if h.token == token) {
            let Some(one) = self.take_single() else { unreachable!("matched above") };
            *self = Holders::Boxed(Some(Boxed::Bound(Box::new(one))));
        }
        if let Some(terms) = self.terms_mut(token) {
            terms.session = session;
        }
    }

    /// Whether the holder with this token lives while its session does
    /// (`Terms::session_lease`); only a holder bound to a session can.
    pub fn set_session_lease(&mut self, token: u64, session_lease: bool) {
        if let Some(terms) = self.terms_mut(token).filter(|t| t.session.is_some() || !session_lease) {
            terms.session_lease = session_lease;
        }
    }

    fn terms_mut(&mut self, token: u64) -> Option<&mut Terms> {
        self.entry_mut(token).and_then(|(_, terms)| terms)
    }

    /// Takes every holder out; a semaphore stays one.
    pub fn drain(&mut self) -> Vec<(Holder, Terms)> {
        match std::mem::take(self) {
            Holders::One(h) => vec![(h, Terms::default())],
            Holders::Boxed(Some(Boxed::Bound(bound))) => vec![*bound],
            Holders::Boxed(None) => Vec::new(),
            Holders::Boxed(Some(Boxed::Table(mut table))) => {
                let drained = table.by_token.drain().map(|(_, entry)| entry).collect();
                if let Some(limit) = table.mode.limit() {
                    *self = Holders::Boxed(Some(Boxed::Table(Table::new(Mode::Semaphore(limit)))));
                }
                drained
            }
        }
    }

    /// Makes the key a lock or a semaphore as `mode` says; false if it was
    /// not one already (then the caller ends its holders first).
    pub fn set_kind(&mut self, mode: Mode) -> bool {
        if self.mode().same_key_kind(mode) {
            return true;
        }
        if self.is_empty() {
            *self = Holders::Boxed(mode.limit().map(|limit| Boxed::Table(Table::new(Mode::Semaphore(limit)))));
            return true;
        }
        false
    }

    /// Heap bytes: owner strings, and the table with its owner copies.
    pub fn heap_size(&self) -> usize {
        match self {
            Holders::One(h) => h.owner.len(),
            Holders::Boxed(Some(Boxed::Bound(bound))) => std::mem::size_of::<(Holder, Terms)>() + bound.0.owner.len(),
            Holders::Boxed(None) => 0,
            Holders::Boxed(Some(Boxed::Table(t))) => {
                let owners: usize = t.by_token.values().map(|(h, _)| h.owner.len()).sum();
                std::mem::size_of::<Table>()
                    + owners * 2
                    + t.by_token.capacity() * (std::mem::size_of::<(u64, (Holder, Terms))>() + 1)
                    + t.by_owner.capacity() * (std::mem::size_of::<(Box<[u8]>, u64)>() + 1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(owner: &str, token: u64) -> Holder {
        Holder::new(owner.as_bytes().into(), 1, token, 100)
    }

    #[test]
    fn a_plain_exclusive_holder_is_inline_a_bound_one_boxed_and_anything_else_is_the_table() {
        assert_eq!(std::mem::size_of::<Holders>(), 40, "one enum, the inline holder's size");
        let mut h = Holders::default();
        h.insert(holder("a", 1), Terms::default(), Mode::Exclusive);
        assert!(matches!(h, Holders::One(_)));
        h.set_session(1, Some(7));
        h.set_session_lease(1, true);
        assert!(matches!(h, Holders::Boxed(Some(Boxed::Bound(_)))), "a session boxes it with its terms");
        assert_eq!(h.get(1).map(|(h, t)| (&*h.owner, t.session, t.session_lease)), Some((&b"a"[..], Some(7), true)));
        assert_eq!(h.token_of(b"a"), Some(1));
        assert_eq!(h.remove(1).map(|(_, t)| t.session), Some(Some(7)));
        assert!(matches!(h, Holders::Boxed(None)), "nobody holds it");
        h.insert(holder("b", 2), Terms { session: Some(8), ..Terms::default() }, Mode::Exclusive);
        assert!(matches!(h, Holders::Boxed(Some(Boxed::Bound(_)))), "granted bound to a session");
        h.insert(holder("c", 3), Terms::default(), Mode::Exclusive);
        assert!(matches!(h, Holders::Boxed(Some(Boxed::Table(_)))), "a second holder (a restore) makes the table");
        assert_eq!(h.get(2).map(|(_, t)| t.session), Some(Some(8)), "with the first one's terms");
    }

    #[test]
    fn shared_and_semaphore_holders_are_counted_by_weight() {
        let mut h = Holders::default();
        h.insert(holder("a", 1), Terms::default(), Mode::Shared);
        h.insert(holder("b", 2), Terms::default(), Mode::Shared);
        assert_eq!((h.len(), h.used(), h.mode()), (2, 2, Mode::Shared));
        let mut s = Holders::default();
        s.insert(holder("a", 1), Terms { session: None, permits: 3, ..Terms::default() }, Mode::Semaphore(5));
        assert_eq!((s.used(), s.token_of(b"a")), (3, Some(1)));
        s.remove(1);
        assert_eq!((s.used(), s.mode()), (0, Mode::Semaphore(5)), "a semaphore stays one");
        assert!(s.set_kind(Mode::Exclusive), "an empty semaphore may become a lock");
        assert_eq!((s.mode(), s.len(), s.used()), (Mode::Exclusive, 0, 0), "an exclusive lock nobody holds");
    }
}
