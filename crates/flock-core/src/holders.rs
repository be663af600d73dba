//! Who holds a key: one table for every kind of holder (exclusive, shared,
//! semaphore), each holder found by owner and by token in O(1).
//!
//! Most keys are plain exclusive locks, held by one owner without SESSION:
//! that holder is kept inline (`Holders::One`), so such a key costs no
//! allocation beyond its owner string. Every other case (shared holders, a
//! semaphore's, an exclusive holder bound to a session) is the boxed table.
//! Callers see one kind of holder either way.

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
    /// Any other holders; `None` when nobody holds a lock.
    Table(Option<Box<Table>>),
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
        Holders::Table(None)
    }
}

impl Holders {
    fn table(&self) -> Option<&Table> {
        match self {
            Holders::Table(table) => table.as_deref(),
            Holders::One(_) => None,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Holders::One(_) => 1,
            Holders::Table(table) => table.as_ref().map_or(0, |t| t.by_token.len()),
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
        match self {
            Holders::One(_) => 1,
            Holders::Table(table) => table.as_ref().map_or(0, |t| t.used),
        }
    }

    pub fn get(&self, token: u64) -> Option<(&Holder, Terms)> {
        match self {
            Holders::One(h) if h.token == token => Some((h, Terms::default())),
            Holders::One(_) => None,
            Holders::Table(table) => table.as_ref()?.by_token.get(&token).map(|(h, t)| (h, *t)),
        }
    }

    pub fn get_mut(&mut self, token: u64) -> Option<&mut Holder> {
        match self {
            Holders::One(h) if h.token == token => Some(h),
            Holders::One(_) => None,
            Holders::Table(table) => table.as_mut()?.by_token.get_mut(&token).map(|(h, _)| h),
        }
    }

    /// The token of `owner`'s grant.
    pub fn token_of(&self, owner: &[u8]) -> Option<u64> {
        match self {
            Holders::One(h) => (*h.owner == *owner).then_some(h.token),
            Holders::Table(table) => table.as_ref()?.by_owner.get(owner).copied(),
        }
    }

    /// In no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&Holder, Terms)> + '_ {
        let (one, table) = match self {
            Holders::One(h) => (Some((h, Terms::default())), None),
            Holders::Table(table) => (None, table.as_deref()),
        };
        one.into_iter().chain(table.into_iter().flat_map(|t| t.by_token.values().map(|(h, t)| (h, *t))))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Holder> + '_ {
        let (one, table) = match self {
            Holders::One(h) => (Some(h), None),
            Holders::Table(table) => (None, table.as_deref_mut()),
        };
        one.into_iter().chain(table.into_iter().flat_map(|t| t.by_token.values_mut().map(|(h, _)| h)))
    }

    /// Adds a holder that fits beside the others (same mode, a new owner
    /// and token): the caller checked.
    pub fn insert(&mut self, holder: Holder, terms: Terms, mode: Mode) {
        if matches!(self, Holders::Table(None)) && mode == Mode::Exclusive && terms == Terms::default() {
            *self = Holders::One(holder);
            return;
        }
        self.make_table(mode).add(holder, terms);
    }

    /// The table, made from the inline holder or from nothing.
    fn make_table(&mut self, mode: Mode) -> &mut Table {
        if let Holders::One(_) = self {
            let Holders::One(one) = std::mem::take(self) else { unreachable!("matched above") };
            let mut table = Table::new(Mode::Exclusive);
            table.add(one, Terms::default());
            *self = Holders::Table(Some(table));
        }
        let Holders::Table(table) = self else { unreachable!("made a table above") };
        table.get_or_insert_with(|| Table::new(mode))
    }

    pub fn remove(&mut self, token: u64) -> Option<(Holder, Terms)> {
        match self {
            Holders::One(h) if h.token == token => {
                let Holders::One(h) = std::mem::take(self) else { unreachable!("matched above") };
                Some((h, Terms::default()))
            }
            Holders::One(_) => None,
            Holders::Table(slot) => {
                let table = slot.as_mut()?;
                let (holder, terms) = table.by_token.remove(&token)?;
                table.by_owner.remove(&holder.owner);
                table.used -= weight(terms);
                // A semaphore stays one while its key exists.
                if table.by_token.is_empty() && table.mode.limit().is_none() {
                    *slot = None;
                }
                Some((holder, terms))
            }
        }
    }

    /// Binds the holder with this token to `session` (or unbinds it).
    pub fn set_session(&mut self, token: u64, session: Option<u64>) {
        if session.is_some() && matches!(self, Holders::One(h) if h.token == token) {
            self.make_table(Mode::Exclusive);
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
        match self {
            Holders::Table(Some(table)) => table.by_token.get_mut(&token).map(|(_, terms)| terms),
            _ => None,
        }
    }

    /// Takes every holder out; a semaphore stays one.
    pub fn drain(&mut self) -> Vec<(Holder, Terms)> {
        match std::mem::take(self) {
            Holders::One(h) => vec![(h, Terms::default())],
            Holders::Table(None) => Vec::new(),
            Holders::Table(Some(mut table)) => {
                let drained = table.by_token.drain().map(|(_, entry)| entry).collect();
                if let Some(limit) = table.mode.limit() {
                    *self = Holders::Table(Some(Table::new(Mode::Semaphore(limit))));
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
            *self = Holders::Table(mode.limit().map(|limit| Table::new(Mode::Semaphore(limit))));
            return true;
        }
        false
    }

    /// Heap bytes: owner strings, and the table with its owner copies.
    pub fn heap_size(&self) -> usize {
        match self {
            Holders::One(h) => h.owner.len(),
            Holders::Table(None) => 0,
            Holders::Table(Some(t)) => {
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
    fn a_plain_exclusive_holder_is_inline_and_anything_else_is_the_table() {
        assert_eq!(std::mem::size_of::<Holders>(), 40, "one enum, the inline holder's size");
        let mut h = Holders::default();
        h.insert(holder("a", 1), Terms::default(), Mode::Exclusive);
        assert!(matches!(h, Holders::One(_)));
        h.set_session(1, Some(7));
        assert!(matches!(h, Holders::Table(Some(_))), "a session moves it into the table");
        assert_eq!(h.get(1).map(|(h, t)| (&*h.owner, t.session)), Some((&b"a"[..], Some(7))));
        assert_eq!(h.token_of(b"a"), Some(1));
        assert!(h.remove(1).is_some());
        assert!(matches!(h, Holders::Table(None)), "an empty lock table goes");
    }

    #[test]
    fn shared_and_semaphore_holders_are_counted_by_weight() {
        let mut h = Holders::default();
        h.insert(holder("a", 1), Terms::default(), Mode::Shared);
        h.insert(holder("b", 2), Terms::default(), Mode::Shared);
        assert_eq!((h.len(), h.used(), h.mode()), (2, 2, Mode::Shared));
        let mut s = Holders::default();
        s.insert(holder("a", 1), Terms { session: None, permits: 3, session_lease: false }, Mode::Semaphore(5));
        assert_eq!((s.used(), s.token_of(b"a")), (3, Some(1)));
        s.remove(1);
        assert_eq!((s.used(), s.mode()), (0, Mode::Semaphore(5)), "a semaphore stays one");
        assert!(s.set_kind(Mode::Exclusive), "an empty semaphore may become a lock");
        assert_eq!((s.mode(), s.len(), s.used()), (Mode::Exclusive, 0, 0), "an exclusive lock nobody holds");
    }
}
