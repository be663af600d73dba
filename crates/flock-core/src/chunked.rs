//! A queue kept in chunks of at most `CHUNK` items, indexed by position.
//! A `VecDeque` grows by doubling and moves everything it holds: a hot
//! lock's request IDs (hundreds of thousands, 48 bytes each) stalled the
//! server for 2.6 ms at 131,072 and would for tens of ms at a million.
//! Here a push moves at most one chunk (48 KB of records), and a small
//! queue takes no more than a `VecDeque` would.

use std::collections::VecDeque;
use std::ops::{Index, IndexMut};

const CHUNK: usize = 1024;

/// Items in order, oldest first: `first`, then the chunks of `rest`, each
/// made whole and all full but the last, so a position finds its chunk by
/// division. A queue of at most `CHUNK` items is `first` alone.
#[derive(Debug)]
pub struct ChunkedQueue<T> {
    first: VecDeque<T>,
    /// None, or at least one chunk.
    #[allow(clippy::box_collection, reason = "a small queue pays 8 bytes for it, not a VecDeque's 32")]
    rest: Option<Box<VecDeque<VecDeque<T>>>>,
}

impl<T> Default for ChunkedQueue<T> {
    fn default() -> Self {
        Self { first: VecDeque::new(), rest: None }
    }
}

impl<T> ChunkedQueue<T> {
    pub fn len(&self) -> usize {
        let rest = self.rest.as_ref().map_or(0, |rest| (rest.len() - 1) * CHUNK + rest.back().map_or(0, VecDeque::len));
        self.first.len() + rest
    }

    pub fn push_back(&mut self, item: T) {
        let Some(rest) = &mut self.rest else {
            if self.first.len() < CHUNK {
                return self.first.push_back(item);
            }
            self.rest = Some(Box::new(VecDeque::from([Self::chunk_of(item)])));
            return;
        };
        match rest.back_mut().filter(|last| last.len() < CHUNK) {
            Some(last) => last.push_back(item),
            None => rest.push_back(Self::chunk_of(item)),
        }
    }

    /// A new chunk, made whole at once (it never grows).
    fn chunk_of(item: T) -> VecDeque<T> {
        let mut chunk = VecDeque::with_capacity(CHUNK);
        chunk.push_back(item);
        chunk
    }

    pub fn pop_front(&mut self) -> Option<T> {
        let item = self.first.pop_front();
        if self.first.is_empty() {
            if let Some(rest) = self.rest.as_mut() {
                self.first = rest.pop_front().unwrap_or_default();
                if rest.is_empty() {
                    self.rest = None;
                }
            }
        }
        item
    }

    pub fn front(&self) -> Option<&T> {
        self.first.front()
    }

    /// The chunks after `first`.
    fn chunks(&self) -> impl Iterator<Item = &VecDeque<T>> + '_ {
        self.rest.iter().flat_map(|rest| rest.iter())
    }

    /// The items from position `at` on, in order.
    pub fn iter_from(&self, at: usize) -> impl Iterator<Item = &T> + '_ {
        let in_first = self.first.len();
        let (from_first, chunk, offset) =
            if at < in_first { (at, 0, 0) } else { (in_first, (at - in_first) / CHUNK, (at - in_first) % CHUNK) };
        let chunks = self.chunks().skip(chunk).enumerate();
        self.first
            .range(from_first..)
            .chain(chunks.flat_map(move |(n, c)| c.range(if n == 0 { offset.min(c.len()) } else { 0 }..)))
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.first.iter().chain(self.chunks().flatten())
    }

    /// Heap bytes of the chunks and of the list of them (not what items own).
    pub fn heap_size(&self) -> usize {
        let items = self.first.capacity() + self.chunks().map(VecDeque::capacity).sum::<usize>();
        let list = self.rest.as_ref().map_or(0, |rest| {
            std::mem::size_of::<VecDeque<VecDeque<T>>>() + rest.capacity() * std::mem::size_of::<VecDeque<T>>()
        });
        items * std::mem::size_of::<T>() + list
    }

    fn at(&self, at: usize) -> Option<&T> {
        match at.checked_sub(self.first.len()) {
            None => self.first.get(at),
            Some(after) => self.rest.as_ref()?.get(after / CHUNK)?.get(after % CHUNK),
        }
    }

    fn at_mut(&mut self, at: usize) -> Option<&mut T> {
        match at.checked_sub(self.first.len()) {
            None => self.first.get_mut(at),
            Some(after) => self.rest.as_mut()?.get_mut(after / CHUNK)?.get_mut(after % CHUNK),
        }
    }
}

impl<T> Index<usize> for ChunkedQueue<T> {
    type Output = T;

    fn index(&self, at: usize) -> &T {
        self.at(at).unwrap_or_else(|| panic!("position {at} of a queue of {}", self.len()))
    }
}

impl<T> IndexMut<usize> for ChunkedQueue<T> {
    fn index_mut(&mut self, at: usize) -> &mut T {
        let len = self.len();
        self.at_mut(at).unwrap_or_else(|| panic!("position {at} of a queue of {len}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Against a VecDeque: the same items at every position, from every
        /// position, after any mix of pushes and pops across chunk borders.
        #[test]
        fn agrees_with_a_vecdeque(ops in proptest::collection::vec((proptest::bool::weighted(0.6), 1usize..1500), 1..40)) {
            let (mut q, mut model) = (ChunkedQueue::default(), VecDeque::new());
            let mut next = 0u32;
            for (push, n) in ops {
                for _ in 0..n {
                    if push {
                        q.push_back(next);
                        model.push_back(next);
                        next += 1;
                    } else {
                        proptest::prop_assert_eq!(q.pop_front(), model.pop_front());
                    }
                }
                proptest::prop_assert_eq!(q.len(), model.len());
                proptest::prop_assert_eq!(q.front(), model.front());
                proptest::prop_assert!(q.iter().eq(model.iter()));
                for at in [0, 1, model.len() / 3, model.len().saturating_sub(1), model.len(), model.len() + 5] {
                    proptest::prop_assert!(q.iter_from(at).eq(model.iter().skip(at)), "from {}", at);
                    if at < model.len() {
                        proptest::prop_assert_eq!(q[at], model[at]);
                    }
                }
            }
        }
    }

    #[test]
    fn a_small_queue_takes_what_a_vecdeque_would_and_an_empty_one_nothing() {
        let mut q = ChunkedQueue::default();
        let mut v = VecDeque::new();
        for n in 0..3u64 {
            q.push_back(n);
            v.push_back(n);
        }
        assert_eq!(q.heap_size(), v.capacity() * 8);
        assert_eq!(ChunkedQueue::<u64>::default().heap_size(), 0);
    }

    #[test]
    fn chunks_after_the_first_are_made_whole_and_never_grow() {
        let mut q = ChunkedQueue::default();
        for n in 0..(3 * CHUNK + 5) {
            q.push_back(n);
        }
        assert!(q.chunks().all(|c| c.capacity() == CHUNK));
        q[2 * CHUNK] = 7;
        assert_eq!(q.iter().nth(2 * CHUNK), Some(&7));
        while q.len() > 5 {
            q.pop_front();
        }
        assert!(q.rest.is_none(), "an emptied chunk is given back");
    }
}
