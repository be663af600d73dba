//! The lease deadlines of all locks, in one hierarchical timing wheel.
//!
//! A Redis timer per lock costs about 120 bytes (its record, a radix-tree
//! entry and the boxed callback data), more than a third of an idle lock.
//! The wheel keeps one small slab entry per deadline instead, and the Redis
//! layer arms a single timer for the nearest one. Insert and remove are O(1),
//! and so is finding the next deadline (one bitmap per level). Ids cannot
//! move, so the slab keeps its peak size until the last entry leaves.
//!
//! As in the wheels of the Linux kernel and tokio, level `l` has 64 slots of
//! 64^l ms each. An entry sits at the level of the highest base-64 digit in
//! which its deadline differs from the wheel's time; when the time reaches a
//! slot above level 0, its entries move down to the level that now fits them.
//! Such a slot can hold every entry (after a long pause, all deadlines of
//! the last 4 s share a level-2 slot), so they move a bounded step per call.

use std::mem::ManuallyDrop;
use std::num::NonZeroU32;

const SLOT_BITS: u32 = 6;
const SLOTS: usize = 1 << SLOT_BITS;
/// 64^7 ms = 2^42 ms: the longest lease (2^40 ms) fits from any time of day.
const LEVELS: usize = 7;
const NIL: u32 = u32::MAX;
/// Entries moved down a level per `pop_due` call at most.
const MOVE_STEP: usize = 64;

/// What `pop_due` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Pop<T> {
    /// An entry whose deadline is at or before the time given, and its
    /// former id.
    Due(DeadlineId, T),
    /// Nothing yet: entries of a slot whose time has come moved down a
    /// level, and more are left to move. Call again.
    Moved,
    /// Nothing is due.
    Idle,
}

/// Where an entry is; it stays valid until the entry is removed or popped,
/// then its index may be reused by a later entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeadlineId(NonZeroU32);

impl DeadlineId {
    fn index(self) -> u32 {
        self.0.get() - 1
    }

    fn of(index: u32) -> Self {
        Self(NonZeroU32::new(index + 1).expect("deadline index below u32::MAX"))
    }
}

struct Entry<T> {
    /// The deadline, raised to the wheel's time if it was already past.
    when: u64,
    prev: u32,
    /// Also links free entries.
    next: u32,
    /// Dropped where it is taken out (`take`) or in `Drop for Deadlines`,
    /// never by the slab: so an emptied slab is freed without a pass over
    /// it (a million entries are 40 MB: a pass was a 4 ms stall at the end
    /// of a backlog of due leases).
    item: Option<ManuallyDrop<T>>,
}

#[derive(Clone, Copy)]
struct Level {
    occupied: u64,
    heads: [u32; SLOTS],
}

pub struct Deadlines<T> {
    entries: Vec<Entry<T>>,
    free: u32,
    levels: [Level; LEVELS],
    /// The wheel's time: nothing is due before it.
    elapsed: u64,
    len: usize,
}

impl<T> Drop for Deadlines<T> {
    fn drop(&mut self) {
        if self.len > 0 {
            self.entries.iter_mut().filter_map(|e| e.item.take()).for_each(|item| drop(ManuallyDrop::into_inner(item)));
        }
    }
}

impl<T> Default for Deadlines<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            free: NIL,
            levels: [Level { occupied: 0, heads: [NIL; SLOTS] }; LEVELS],
            elapsed: 0,
            len: 0,
        }
    }
}

/// The level for `when` at wheel time `elapsed` (`when >= elapsed`).
fn level_for(elapsed: u64, when: u64) -> usize {
    let differing = (elapsed ^ when) | (SLOTS as u64 - 1);
    let highest = 63 - differing.leading_zeros();
    (highest / SLOT_BITS) as usize
}

fn slot_for(when: u64, level: usize) -> usize {
    ((when >> (level as u32 * SLOT_BITS)) as usize) & (SLOTS - 1)
}

impl<T> Deadlines<T> {
    /// Bytes of one entry, as the slab stores it.
    pub const fn entry_size() -> usize {
        std::mem::size_of::<Entry<T>>()
    }

    /// Entries filed.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn insert(&mut self, deadline: u64, item: T) -> DeadlineId {
        let when = self.placeable(deadline);
        let entry = Entry { when, prev: NIL, next: NIL, item: Some(ManuallyDrop::new(item)) };
        let index = match self.free {
            NIL => {
                let index =
                    u32::try_from(self.entries.len()).ok().filter(|&i| i < NIL).expect("deadline index overflow");
                self.entries.push(entry);
                index
            }
            index => {
                self.free = self.entries[index as usize].next;
                self.entries[index as usize] = entry;
                index
            }
        };
        self.link(index);
        self.len += 1;
        DeadlineId::of(index)
    }

    pub fn get(&self, id: DeadlineId) -> Option<&T> {
        self.entries.get(id.index() as usize)?.item.as_deref()
    }

    /// Takes the entry out; `None` if `id` is not in use.
    pub fn remove(&mut self, id: DeadlineId) -> Option<T> {
        self.get(id)?;
        Some(self.take(id.index()))
    }

    /// Takes out every entry whose item fails `keep`: O(entries), for when
    /// many go at once (a flushed database).
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        let mut index = 0;
        while index < self.entries.len() {
            if self.entries[index].item.as_deref().is_some_and(|item| !keep(item)) {
                self.take(index as u32);
            }
            index += 1;
        }
    }

    /// The time the next entry falls due (or a slot of entries must move
    /// down a level, which is when to look again); `None` if empty.
    pub fn next_deadline(&self) -> Option<u64> {
        self.next_slot().map(|(_, _, start)| start)
    }

    /// The entry with the earliest deadline if it is at or before `now`
    /// (entries due in the same millisecond in any order), after moving at
    /// most `MOVE_STEP` entries down a level.
    pub fn pop_due(&mut self, now: u64) -> Pop<T> {
        let mut moved = 0;
        loop {
            let Some((level, slot, start)) = self.next_slot().filter(|&(_, _, start)| start <= now) else {
                self.elapsed = self.elapsed.max(now);
                return Pop::Idle;
            };
            self.elapsed = start;
            let head = self.levels[level].heads[slot];
            if level == 0 {
                return Pop::Due(DeadlineId::of(head), self.take(head));
            }
            if moved == MOVE_STEP {
                return Pop::Moved;
            }
            // The slot's time has come: its entries move down, from the
            // front; the rest wait in the slot, which stays first in line.
            let mut cursor = head;
            while cursor != NIL && moved < MOVE_STEP {
                let next = self.entries[cursor as usize].next;
                self.link(cursor);
                cursor = next;
                moved += 1;
            }
            self.levels[level].heads[slot] = cursor;
            match cursor {
                NIL => self.levels[level].occupied &= !(1 << slot),
                rest => self.entries[rest as usize].prev = NIL,
            }
        }
    }

    /// A deadline the wheel can place: not before its time, and within the
    /// span of its top level (a later one is looked at again at that end).
    fn placeable(&self, deadline: u64) -> u64 {
        let top_end = self.elapsed | ((1u64 << (LEVELS as u32 * SLOT_BITS)) - 1);
        deadline.clamp(self.elapsed, top_end)
    }

    /// A slot above level 0 at the wheel's time: its entries are moving down
    /// (see `pop_due`). Only such a slot can be at the wheel's time.
    fn moving(&self) -> Option<(usize, usize)> {
        (1..LEVELS)
            .map(|level| (level, slot_for(self.elapsed, level)))
            .find(|&(level, slot)| self.levels[level].occupied & (1 << slot) != 0)
    }

    /// The slot to look at next, with its level and start time: one whose
    /// entries are moving down, or else the lowest occupied slot. Lower
    /// levels come first: their entries share more leading digits with the
    /// wheel's time. Within a level, occupied slots are never behind it.
    fn next_slot(&self) -> Option<(usize, usize, u64)> {
        if let Some((level, slot)) = self.moving() {
            // It started at the wheel's time, which has not moved since.
            return Some((level, slot, self.elapsed));
        }
        self.levels.iter().enumerate().find(|(_, l)| l.occupied != 0).map(|(level, l)| {
            let shift = level as u32 * SLOT_BITS;
            let current = slot_for(self.elapsed, level);
            let ahead = l.occupied & (u64::MAX << current);
            debug_assert!(ahead != 0, "an occupied slot behind the wheel's time");
            let slot = ahead.trailing_zeros() as usize;
            let level_start = self.elapsed & !((1u64 << (shift + SLOT_BITS)) - 1);
            (level, slot, level_start + ((slot as u64) << shift))
        })
    }

    fn bucket(&self, index: u32) -> (usize, usize) {
        let when = self.entries[index as usize].when;
        let level = level_for(self.elapsed, when);
        (level, slot_for(when, level))
    }

    /// The slot whose list starts with entry `index`: the one its deadline
    /// falls in now, unless it is still waiting to move down.
    fn slot_headed_by(&self, index: u32) -> (usize, usize) {
        let (level, slot) = self.bucket(index);
        if self.levels[level].heads[slot] == index {
            return (level, slot);
        }
        self.moving().expect("a list head is in its slot or in the one moving down")
    }

    /// Pushes entry `index` on the front of the list of its slot.
    fn link(&mut self, index: u32) {
        let (level, slot) = self.bucket(index);
        let head = self.levels[level].heads[slot];
        if head != NIL {
            self.entries[head as usize].prev = index;
        }
        let entry = &mut self.entries[index as usize];
        entry.prev = NIL;
        entry.next = head;
        self.levels[level].heads[slot] = index;
        self.levels[level].occupied |= 1 << slot;
    }

    /// Unlinks entry `index` (in use) and frees it.
    fn take(&mut self, index: u32) -> T {
        let Entry { prev, next, .. } = self.entries[index as usize];
        match prev {
            NIL => {
                let (level, slot) = self.slot_headed_by(index);
                self.levels[level].heads[slot] = next;
                if next == NIL {
                    self.levels[level].occupied &= !(1 << slot);
                }
            }
            prev => self.entries[prev as usize].next = next,
        }
        if next != NIL {
            self.entries[next as usize].prev = prev;
        }
        let item = self.entries[index as usize].item.take().expect("a linked entry holds its item");
        let item = ManuallyDrop::into_inner(item);
        self.len -= 1;
        if self.len == 0 {
            // Ids cannot move, so the slab only shrinks when it is empty.
            self.entries = Vec::new();
            self.free = NIL;
        } else {
            self.entries[index as usize].next = self.free;
            self.free = index;
        }
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Everything due at `now`, in any order, as (deadline, item).
    fn drain(wheel: &mut Deadlines<u64>, now: u64) -> Vec<u64> {
        let mut due = Vec::new();
        loop {
            match wheel.pop_due(now) {
                Pop::Due(_, item) => due.push(item),
                Pop::Moved => {}
                Pop::Idle => break,
            }
        }
        due.sort_unstable();
        due
    }

    #[test]
    fn pops_what_is_due_and_nothing_else() {
        let mut wheel = Deadlines::default();
        let now = 1_700_000_000_000;
        wheel.pop_due(now);
        for delay in [5, 64, 65, 4096, 300_000, 1 << 40] {
            wheel.insert(now + delay, delay);
        }
        assert_eq!(wheel.next_deadline().map(|d| d <= now + 5), Some(true));
        assert_eq!(drain(&mut wheel, now + 4), Vec::<u64>::new());
        assert_eq!(drain(&mut wheel, now + 64), vec![5, 64]);
        assert_eq!(drain(&mut wheel, now + 299_999), vec![65, 4096]);
        assert_eq!(drain(&mut wheel, now + (1 << 40)), vec![300_000, 1 << 40]);
        assert_eq!(wheel.len, 0);
        assert_eq!(wheel.next_deadline(), None);
    }

    #[test]
    fn a_past_deadline_is_due_at_once() {
        let mut wheel = Deadlines::default();
        wheel.pop_due(10_000);
        wheel.insert(3, 3);
        assert_eq!(wheel.next_deadline(), Some(10_000));
        assert_eq!(drain(&mut wheel, 10_000), vec![3]);
    }

    #[test]
    fn a_deadline_beyond_the_top_level_pops_at_its_end_to_be_placed_again() {
        let mut wheel = Deadlines::default();
        let end = (1u64 << 42) - 1;
        wheel.pop_due(end - 10);
        wheel.insert(end + 100, 7);
        assert_eq!(wheel.next_deadline(), Some(end));
        assert_eq!(drain(&mut wheel, end), vec![7]);
    }

    #[test]
    fn a_removed_entry_never_fires_and_its_id_is_reused() {
        let mut wheel = Deadlines::default();
        let keep = wheel.insert(300, 3);
        let a = wheel.insert(100, 1);
        assert_eq!(wheel.remove(a), Some(1));
        assert_eq!(wheel.remove(a), None);
        let b = wheel.insert(200, 2);
        assert_ne!(b, keep);
        assert_eq!(a, b, "the freed index is reused");
        assert_eq!(drain(&mut wheel, 1000), vec![2, 3]);
        assert_eq!(wheel.entries.capacity(), 0, "an empty wheel gives its slab back");
    }

    #[test]
    fn retain_takes_out_the_rejected_entries_only() {
        let mut wheel = Deadlines::default();
        for n in 0..100u64 {
            wheel.insert(n * 37, n);
        }
        wheel.retain(|n| n % 3 != 0);
        assert_eq!(wheel.len, 66);
        assert_eq!(drain(&mut wheel, 10_000), (0..100).filter(|n| n % 3 != 0).collect::<Vec<_>>());
    }

    #[test]
    fn every_item_is_dropped_once_whether_taken_out_retained_away_or_left_in_the_wheel() {
        let item = std::rc::Rc::new(());
        let mut wheel = Deadlines::default();
        let ids: Vec<_> = (0..300u64).map(|n| wheel.insert(n * 1000, item.clone())).collect();
        drop(wheel.remove(ids[7]));
        wheel.retain(|_| false);
        assert_eq!(std::rc::Rc::strong_count(&item), 1, "emptied: every item dropped");
        for n in 0..300u64 {
            wheel.insert(n, item.clone());
        }
        while let Pop::Due(..) | Pop::Moved = wheel.pop_due(100) {}
        drop(wheel);
        assert_eq!(std::rc::Rc::strong_count(&item), 1, "the items left in a dropped wheel are dropped with it");
    }

    #[test]
    fn a_crowded_slot_moves_down_in_steps_and_still_pops_earliest_first() {
        let mut wheel = Deadlines::default();
        wheel.pop_due(0);
        // 1000 deadlines in one level-2 slot (4096 ms), inserted latest first.
        let ids: Vec<DeadlineId> = (0..1000u64).rev().map(|n| wheel.insert(4096 + n * 4, n)).collect();
        let now = 4096 + 4000;
        assert_eq!(wheel.pop_due(now), Pop::Moved, "the first call only moves entries down");
        // Taken out while the slot moves down: one still in it, the one at
        // its head, and one moved already; and one put in.
        assert_eq!(wheel.remove(ids[0]), Some(999));
        assert_eq!(wheel.remove(ids[999 - MOVE_STEP]), Some(MOVE_STEP as u64));
        assert_eq!(wheel.remove(ids[999]), Some(0));
        wheel.insert(4096 + 1, 1000);
        let mut popped = Vec::new();
        loop {
            match wheel.pop_due(now) {
                Pop::Due(_, n) => popped.push(n),
                Pop::Moved => {}
                Pop::Idle => break,
            }
        }
        let mut expected: Vec<u64> = vec![1000];
        expected.extend((1..999).filter(|&n| n != MOVE_STEP as u64));
        assert_eq!(popped, expected, "in deadline order, the removed ones never");
        assert_eq!(wheel.len, 0);
    }

    #[test]
    fn an_entry_with_a_token_and_a_boxed_place_is_40_bytes() {
        assert_eq!(Deadlines::<(u64, Box<[u8]>)>::entry_size(), 40);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        Remove(usize),
        /// Moves the time on, then calls `pop_due` up to so many times.
        Advance(u64, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        let delay = prop_oneof![0u64..100, 0u64..5000, 0u64..(1 << 20), 0u64..(1 << 40)];
        let by = prop_oneof![0u64..70, 0u64..100_000, 0u64..(1 << 30)];
        let calls = prop_oneof![0usize..4, 0usize..1000];
        prop_oneof![
            3 => delay.prop_map(Op::Insert),
            1 => any::<usize>().prop_map(Op::Remove),
            2 => (by, calls).prop_map(|(by, calls)| Op::Advance(by, calls)),
        ]
    }

    proptest! {
        /// Against a sorted map of (deadline, or the wheel's time if that is
        /// later, serial): every entry pops exactly once, earliest first, when
        /// the time has reached its deadline and never before; removed ones
        /// never; and the wheel only rests when nothing is due.
        #[test]
        fn behaves_like_a_sorted_map(start in 0u64..(1 << 40), ops in prop::collection::vec(op(), 0..400)) {
            let mut wheel = Deadlines::default();
            let mut model: BTreeMap<(u64, u64), DeadlineId> = BTreeMap::new();
            let mut now = start;
            let mut serial = 0u64;
            prop_assert_eq!(wheel.pop_due(now), Pop::Idle);
            for op in ops {
                match op {
                    Op::Insert(delay) => {
                        serial += 1;
                        let id = wheel.insert(now + delay, serial);
                        model.insert(((now + delay).max(wheel.elapsed), serial), id);
                    }
                    Op::Remove(i) if !model.is_empty() => {
                        let key = *model.keys().nth(i % model.len()).unwrap();
                        let id = model.remove(&key).unwrap();
                        prop_assert_eq!(wheel.remove(id), Some(key.1));
                    }
                    Op::Remove(_) => {}
                    Op::Advance(by, calls) => {
                        now += by;
                        for _ in 0..calls {
                            match wheel.pop_due(now) {
                                Pop::Due(id, item) => {
                                    let first = model.keys().next().map(|k| k.0);
                                    let key = *model.keys().find(|k| k.1 == item).unwrap();
                                    prop_assert!(key.0 <= now, "{:?} popped at {}", key, now);
                                    prop_assert_eq!(Some(key.0), first, "not the earliest deadline");
                                    prop_assert_eq!(model.remove(&key), Some(id));
                                }
                                Pop::Moved => {}
                                Pop::Idle => {
                                    let first = model.keys().next().map(|k| k.0);
                                    prop_assert!(first.is_none_or(|f| f > now), "idle with {:?} due at {}", first, now);
                                    break;
                                }
                            }
                        }
                    }
                }
                prop_assert_eq!(wheel.len, model.len());
                let next = wheel.next_deadline();
                match model.keys().next() {
                    None => prop_assert_eq!(next, None),
                    Some(&(first, _)) => {
                        let next = next.unwrap();
                        prop_assert!(next <= first.max(now), "next {} after the first deadline {}", next, first);
                    }
                }
            }
        }
    }
}
