//! FIFO queue of waiters with O(1) push, pop and removal from the middle.
//!
//! A waiter can leave from anywhere in the queue (timeout, disconnect), so
//! the queue is a doubly linked list threaded through a slab. Handles carry a
//! generation so that a stale handle (the waiter already left) can never
//! remove someone else who reused the slot.

use std::sync::atomic::{AtomicU64, Ordering};

const NIL: u32 = u32::MAX;

/// Source of slot generations for every queue: a handle of a waiter that
/// left never matches a later waiter, of this queue or of a later queue of
/// the same lock (a lock drops its queue while nobody waits). 64 bits never
/// wrap: at a billion waiters a second they last 584 years.
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WaiterId {
    index: u32,
    generation: u64,
}

struct Node<T> {
    value: T,
    prev: u32,
    next: u32,
}

struct Slot<T> {
    generation: u64,
    node: Option<Node<T>>,
}

pub struct WaitQueue<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
    len: usize,
}

impl<T> Default for WaitQueue<T> {
    fn default() -> Self {
        Self { slots: Vec::new(), free: Vec::new(), head: NIL, tail: NIL, len: 0 }
    }
}

impl<T> WaitQueue<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn push_back(&mut self, value: T) -> WaiterId {
        let node = Node { value, prev: self.tail, next: NIL };
        let generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
        let slot = Slot { generation, node: Some(node) };
        let index = match self.free.pop() {
            Some(index) => {
                self.slots[index as usize] = slot;
                index
            }
            None => {
                let index = u32::try_from(self.slots.len()).expect("queue index overflow");
                self.slots.push(slot);
                index
            }
        };
        match self.tail {
            NIL => self.head = index,
            tail => self.node_mut(tail).next = index,
        }
        self.tail = index;
        self.len += 1;
        WaiterId { index, generation: self.slots[index as usize].generation }
    }

    pub fn pop_front(&mut self) -> Option<T> {
        match self.head {
            NIL => None,
            head => self.unlink(head),
        }
    }

    /// Removes the waiter behind `id`; `None` if it already left.
    pub fn remove(&mut self, id: WaiterId) -> Option<T> {
        let slot = self.slots.get(id.index as usize).filter(|slot| slot.generation == id.generation)?;
        slot.node.as_ref()?;
        self.unlink(id.index)
    }

    /// The waiter behind `id`; `None` if it left.
    pub fn get(&self, id: WaiterId) -> Option<&T> {
        let slot = self.slots.get(id.index as usize).filter(|slot| slot.generation == id.generation)?;
        slot.node.as_ref().map(|node| &node.value)
    }

    /// The waiter behind `id`, where it is in the queue; `None` if it left.
    pub fn get_mut(&mut self, id: WaiterId) -> Option<&mut T> {
        let slot = self.slots.get_mut(id.index as usize).filter(|slot| slot.generation == id.generation)?;
        slot.node.as_mut().map(|node| &mut node.value)
    }

    /// Head first.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        let mut cursor = self.head;
        std::iter::from_fn(move || {
            if cursor == NIL {
                return None;
            }
            let node = self.slots[cursor as usize].node.as_ref()?;
            cursor = node.next;
            Some(&node.value)
        })
    }

    /// Bytes held on the heap by the queue's own structure.
    pub fn heap_size(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot<T>>() + self.free.capacity() * std::mem::size_of::<u32>()
    }

    fn node_mut(&mut self, index: u32) -> &mut Node<T> {
        self.slots[index as usize].node.as_mut().expect("linked slot is occupied")
    }

    fn unlink(&mut self, index: u32) -> Option<T> {
        let slot = &mut self.slots[index as usize];
        let node = slot.node.take()?;
        match node.prev {
            NIL => self.head = node.next,
            prev => self.node_mut(prev).next = node.next,
        }
        match node.next {
            NIL => self.tail = node.prev,
            next => self.node_mut(next).prev = node.prev,
        }
        self.len -= 1;
        self.free.push(index);
        Some(node.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[test]
    fn removes_from_the_middle_and_keeps_order() {
        let mut q = WaitQueue::default();
        let a = q.push_back('a');
        let b = q.push_back('b');
        q.push_back('c');
        assert_eq!(q.remove(b), Some('b'));
        assert_eq!(q.remove(b), None, "a handle works once");
        assert_eq!(q.iter().copied().collect::<String>(), "ac");
        assert_eq!(q.pop_front(), Some('a'));
        assert_eq!(q.remove(a), None);
        assert_eq!(q.pop_front(), Some('c'));
        assert!(q.is_empty());
    }

    #[test]
    fn stale_handle_does_not_remove_slot_reuser() {
        let mut q = WaitQueue::default();
        q.push_back(0);
        let old = q.push_back(1);
        q.remove(old);
        let new = q.push_back(2);
        assert_eq!(q.remove(old), None);
        assert_eq!(q.remove(new), Some(2));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push,
        Pop,
        Remove(usize),
    }

    proptest! {
        #[test]
        fn behaves_like_a_vecdeque(ops in prop::collection::vec(
            prop_oneof![Just(Op::Push), Just(Op::Pop), (0usize..64).prop_map(Op::Remove)], 0..300)
        ) {
            let mut q = WaitQueue::default();
            let mut model: VecDeque<(u32, WaiterId)> = VecDeque::new();
            let mut next = 0u32;
            for op in ops {
                match op {
                    Op::Push => {
                        let id = q.push_back(next);
                        model.push_back((next, id));
                        next += 1;
                    }
                    Op::Pop => prop_assert_eq!(q.pop_front(), model.pop_front().map(|(v, _)| v)),
                    Op::Remove(i) if !model.is_empty() => {
                        let (v, id) = model.remove(i % model.len()).unwrap();
                        prop_assert_eq!(q.remove(id), Some(v));
                    }
                    Op::Remove(_) => {}
                }
                prop_assert_eq!(q.len(), model.len());
                prop_assert!(q.iter().copied().eq(model.iter().map(|(v, _)| *v)));
            }
        }
    }
}
