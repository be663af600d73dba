//! Grants the server ended (lease, FORCERELEASE, deletion), remembered for a
//! while so that a later NOTOWNER to their owner can say why. Bounded in
//! time and in number; every operation is O(1) (amortized).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use crate::effects::Loss;

/// How many losses are remembered at most: the oldest is forgotten first.
pub const MAX_LOSSES: usize = 1_000;

pub struct Losses<K> {
    /// Each loss with when it is forgotten and its place in `order`.
    by_key: HashMap<K, (Loss, u64, u64)>,
    /// Keys in the order they were recorded, each with its sequence number:
    /// an entry whose key was recorded again or forgotten since is stale.
    order: VecDeque<(K, u64)>,
    recorded: u64,
    cap: usize,
}

impl<K: Hash + Eq + Clone> Default for Losses<K> {
    fn default() -> Self {
        Self::with_cap(MAX_LOSSES)
    }
}

impl<K: Hash + Eq + Clone> Losses<K> {
    pub fn with_cap(cap: usize) -> Self {
        Self { by_key: HashMap::new(), order: VecDeque::new(), recorded: 0, cap }
    }

    pub fn record(&mut self, key: K, loss: Loss, now_ms: u64, window_ms: u64) {
        self.recorded += 1;
        self.by_key.insert(key.clone(), (loss, now_ms.saturating_add(window_ms), self.recorded));
        self.order.push_back((key, self.recorded));
        while self.order.len() > self.cap || self.front_expired(now_ms) {
            self.pop_front();
        }
    }

    /// Why `key` lost its grant, if that is still remembered.
    pub fn get(&self, key: &K, now_ms: u64) -> Option<Loss> {
        self.by_key.get(key).filter(|&&(_, until, _)| until > now_ms).map(|&(loss, _, _)| loss)
    }

    /// A new grant: an older loss no longer explains a NOTOWNER.
    pub fn forget(&mut self, key: &K) {
        self.by_key.remove(key);
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    fn front_expired(&self, now_ms: u64) -> bool {
        let Some((key, seq)) = self.order.front() else { return false };
        self.by_key.get(key).is_none_or(|&(_, until, at)| at != *seq || until <= now_ms)
    }

    fn pop_front(&mut self) {
        let Some((key, seq)) = self.order.pop_front() else { return };
        if self.by_key.get(&key).is_some_and(|&(_, _, at)| at == seq) {
            self.by_key.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_is_remembered_for_its_window_then_forgotten() {
        let mut l = Losses::default();
        l.record("a", Loss::Expired, 1_000, 500);
        assert_eq!(l.get(&"a", 1_499), Some(Loss::Expired));
        assert_eq!(l.get(&"a", 1_500), None);
        assert_eq!(l.get(&"b", 1_000), None);
    }

    #[test]
    fn the_latest_loss_of_a_key_wins_and_a_new_grant_forgets_it() {
        let mut l = Losses::default();
        l.record("a", Loss::Expired, 0, 100);
        l.record("a", Loss::ForceReleased, 10, 100);
        assert_eq!(l.get(&"a", 50), Some(Loss::ForceReleased));
        l.forget(&"a");
        assert_eq!(l.get(&"a", 50), None);
    }

    #[test]
    fn at_most_cap_are_kept_oldest_first_out_and_stale_entries_do_not_pile_up() {
        let mut l = Losses::with_cap(3);
        for (i, k) in ["a", "b", "c", "d"].into_iter().enumerate() {
            l.record(k, Loss::Deleted, i as u64, 1_000);
        }
        assert_eq!(l.get(&"a", 5), None, "the oldest went first");
        assert!(["b", "c", "d"].iter().all(|k| l.get(k, 5).is_some()));
        for i in 0..1_000 {
            l.record("b", Loss::Expired, 10 + i, 1_000);
        }
        assert!(l.order.len() <= 3 && l.len() <= 3);
        assert_eq!(l.get(&"b", 2_000), Some(Loss::Expired));
    }

    #[test]
    fn expired_losses_leave_as_new_ones_come() {
        let mut l = Losses::with_cap(100);
        l.record("a", Loss::Expired, 0, 10);
        l.record("b", Loss::Expired, 20, 10);
        assert_eq!(l.len(), 1);
    }
}
