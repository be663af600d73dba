//! The holders of a read-write lock held shared, or of a semaphore: each
//! with its own holds, lease, session binding and permits, found by owner
//! and by token in O(1), with a log of what changed for the Redis layer to
//! follow (leases, sessions, replication).
//!
//! An exclusive lock never has any of this: `Lock` keeps its one holder
//! inline and boxes `Shared` only while a key needs it.

use std::collections::HashMap;

use crate::lock::Holder;

/// A shared or semaphore holder: a holder of its own, with its own session
/// binding and, on a semaphore, the permits it holds (0 for a shared holder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub holder: Holder,
    pub session: Option<u64>,
    pub permits: u32,
}

impl Member {
    /// What it takes from the key: its permits, or one reader's share.
    fn weight(&self) -> u64 {
        u64::from(self.permits.max(1))
    }
}

/// A change to the holders' table, for the caller to follow with leases,
/// session bindings and replication.
#[derive(Debug)]
pub enum TableChange {
    /// The holder with this token was granted, reentered or renewed; the
    /// session it was bound to before, if it had one.
    Set { token: u64, old_session: Option<u64> },
    /// This holder is gone (released, expired, ended).
    Gone(Member),
}

#[derive(Default)]
struct Table {
    by_token: HashMap<u64, Member>,
    by_owner: HashMap<Box<[u8]>, u64>,
    /// Permits held (semaphore), or shared holders (lock).
    used: u64,
}

/// What only shared and semaphore keys have.
#[derive(Default)]
pub struct Shared {
    /// The limit of a semaphore; `None` for a lock.
    pub limit: Option<u32>,
    /// Dropped with its last member.
    table: Option<Table>,
    changes: Vec<TableChange>,
}

impl Shared {
    /// Nothing left to keep: the key is a lock again with no members.
    pub fn is_empty(&self) -> bool {
        self.limit.is_none() && self.table.is_none() && self.changes.is_empty()
    }

    /// In no particular order.
    pub fn members(&self) -> impl Iterator<Item = &Member> + '_ {
        self.table.iter().flat_map(|t| t.by_token.values())
    }

    pub fn members_mut(&mut self) -> impl Iterator<Item = &mut Member> + '_ {
        self.table.iter_mut().flat_map(|t| t.by_token.values_mut())
    }

    pub fn len(&self) -> usize {
        self.table.as_ref().map_or(0, |t| t.by_token.len())
    }

    /// Permits in use (semaphore), or readers (lock).
    pub fn used(&self) -> u64 {
        self.table.as_ref().map_or(0, |t| t.used)
    }

    pub fn get(&self, token: u64) -> Option<&Member> {
        self.table.as_ref()?.by_token.get(&token)
    }

    pub fn get_mut(&mut self, token: u64) -> Option<&mut Member> {
        self.table.as_mut()?.by_token.get_mut(&token)
    }

    pub fn of_owner(&self, owner: &[u8]) -> Option<&Member> {
        let table = self.table.as_ref()?;
        table.by_token.get(table.by_owner.get(owner)?)
    }

    /// Logs that the member with this token changed (holds, lease, session).
    pub fn touched(&mut self, token: u64, old_session: Option<u64>) {
        self.changes.push(TableChange::Set { token, old_session });
    }

    pub fn take_changes(&mut self) -> Vec<TableChange> {
        std::mem::take(&mut self.changes)
    }

    /// Adds or replaces a member (the same owner's entry goes first: with
    /// the same token it is the same grant, which keeps its lease entry).
    pub fn insert(&mut self, mut member: Member) {
        let owner = member.holder.owner.clone();
        let token = member.holder.token;
        // A token names one grant: another owner's entry under it (only
        // replicated state could bring one) goes.
        if self.get(token).is_some_and(|m| m.holder.owner != owner) {
            self.remove(token, true);
        }
        let old = self.of_owner(&owner).map(|m| m.holder.token);
        let mut old_session = None;
        match old.and_then(|t| self.remove(t, false)) {
            Some(old) if old.holder.token == token => {
                member.holder.deadline_id = old.holder.deadline_id;
                old_session = old.session;
            }
            old => self.changes.extend(old.map(TableChange::Gone)),
        }
        let table = self.table.get_or_insert_with(Table::default);
        table.used += member.weight();
        table.by_owner.insert(owner, token);
        table.by_token.insert(token, member);
        self.touched(token, old_session);
    }

    /// Takes a member out; logged as gone unless it is being replaced.
    pub fn remove(&mut self, token: u64, log: bool) -> Option<Member> {
        let table = self.table.as_mut()?;
        let member = table.by_token.remove(&token)?;
        table.by_owner.remove(&member.holder.owner);
        table.used -= member.weight();
        if table.by_token.is_empty() {
            self.table = None;
        }
        if log {
            self.changes.push(TableChange::Gone(member.clone()));
        }
        Some(member)
    }

    /// Takes every member out, each logged as gone.
    pub fn clear(&mut self) {
        if let Some(table) = self.table.take() {
            self.changes.extend(table.by_token.into_values().map(TableChange::Gone));
        }
    }

    /// Heap bytes: this, and the table with its owner strings.
    pub fn heap_size(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.table.as_ref().map_or(0, |t| {
                let owners: usize = t.by_token.values().map(|m| m.holder.owner.len()).sum();
                owners * 2
                    + t.by_token.capacity() * (std::mem::size_of::<(u64, Member)>() + 1)
                    + t.by_owner.capacity() * (std::mem::size_of::<(Box<[u8]>, u64)>() + 1)
            })
    }
}
