//! Deadlock detection on the wait-for graph of one server: an owner that
//! is about to wait closes a cycle if, through the owners it would wait for
//! (`Lock::blockers`: the holders that must leave and the waiters queued
//! ahead of it), and the owners those wait for in turn, it reaches itself.
//! Each owner is expanded once, so the cost is the part of the graph reachable
//! from the new wait: at most every waiter and holder of the server.

use std::collections::HashMap;

/// The owners on the cycle that `owner` would close by waiting for
/// `blockers`, in wait-for order: `owner` first, each waiting for the next,
/// the last waiting for `owner`. `waits_for(q)` gives the owners `q` waits
/// for now (empty if it waits nowhere). `None`: no cycle.
pub fn cycle(
    owner: &[u8],
    blockers: Vec<Box<[u8]>>,
    mut waits_for: impl FnMut(&[u8]) -> Vec<Box<[u8]>>,
) -> Option<Vec<Box<[u8]>>> {
    // Each owner reached, with the owner it was reached from (None: from `owner`).
    let mut parent: HashMap<Box<[u8]>, Option<Box<[u8]>>> = HashMap::new();
    let mut todo: Vec<Box<[u8]>> = Vec::new();
    for b in blockers {
        if *b == *owner {
            return Some(vec![owner.into()]);
        }
        if !parent.contains_key(&b) {
            parent.insert(b.clone(), None);
            todo.push(b);
        }
    }
    while let Some(q) = todo.pop() {
        for next in waits_for(&q) {
            if *next == *owner {
                return Some(path(owner, &q, &parent));
            }
            if !parent.contains_key(&next) {
                parent.insert(next.clone(), Some(q.clone()));
                todo.push(next);
            }
        }
    }
    None
}

/// `owner`, then the owners from the first one it waits for down to `last`.
fn path(owner: &[u8], last: &[u8], parent: &HashMap<Box<[u8]>, Option<Box<[u8]>>>) -> Vec<Box<[u8]>> {
    let mut back = vec![Box::<[u8]>::from(last)];
    while let Some(Some(up)) = parent.get(back.last().expect("not empty")) {
        back.push(up.clone());
    }
    back.push(owner.into());
    back.reverse();
    back
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn b(s: &str) -> Box<[u8]> {
        s.as_bytes().into()
    }

    fn graph<'a>(edges: &'a [(&'a str, &'a str)]) -> impl FnMut(&[u8]) -> Vec<Box<[u8]>> + 'a {
        move |q| edges.iter().filter(|(from, _)| from.as_bytes() == q).map(|(_, to)| b(to)).collect()
    }

    fn names(c: Option<Vec<Box<[u8]>>>) -> Option<Vec<String>> {
        c.map(|c| c.iter().map(|o| String::from_utf8(o.to_vec()).unwrap()).collect())
    }

    #[test]
    fn two_owners_that_wait_for_each_other_are_a_cycle() {
        // B holds L2 and waits for L1, which A holds; A now asks for L2.
        let found = cycle(b"A", vec![b("B")], graph(&[("B", "A")]));
        assert_eq!(names(found), Some(vec!["A".into(), "B".into()]));
    }

    #[test]
    fn a_chain_that_ends_is_no_cycle_and_a_long_one_that_returns_is() {
        assert_eq!(cycle(b"A", vec![b("B")], graph(&[("B", "C"), ("C", "D")])), None);
        let found = cycle(b"A", vec![b("B"), b("X")], graph(&[("B", "C"), ("C", "D"), ("D", "A"), ("X", "Y")]));
        assert_eq!(names(found), Some(vec!["A".into(), "B".into(), "C".into(), "D".into()]));
    }

    #[test]
    fn a_cycle_among_others_is_not_the_new_waiters() {
        // B and C deadlock each other, but A is only behind them.
        assert_eq!(cycle(b"A", vec![b("B")], graph(&[("B", "C"), ("C", "B")])), None);
    }

    #[test]
    fn a_chain_of_a_thousand_owners_is_walked_once() {
        let names: Vec<String> = (0..1_000).map(|i| format!("o{i}")).collect();
        let mut calls = 0;
        let found = cycle(b"o0", vec![b("o1")], |q| {
            calls += 1;
            let i: usize = std::str::from_utf8(&q[1..]).unwrap().parse().unwrap();
            vec![b(&names[(i + 1) % 1_000])]
        });
        assert_eq!(found.map(|c| c.len()), Some(1_000));
        assert_eq!(calls, 999, "each owner expanded once");
    }

    proptest! {
        /// Against reachability computed by brute force (Floyd–Warshall): a
        /// cycle is found exactly when the new waiter's owner can reach
        /// itself, and what is returned is a real cycle of the graph.
        #[test]
        fn finds_a_cycle_exactly_when_the_owner_reaches_itself(
            edges in proptest::collection::vec((0u8..8, 0u8..8), 0..24),
            blockers in proptest::collection::vec(1u8..8, 1..4),
        ) {
            let n = 8;
            let mut reach = vec![vec![false; n]; n];
            for &(f, t) in &edges {
                reach[f as usize][t as usize] = true;
            }
            for k in 0..n { for i in 0..n { for j in 0..n {
                if reach[i][k] && reach[k][j] { reach[i][j] = true; }
            } } }
            let expected = blockers.iter().any(|&x| x == 0 || reach[x as usize][0]);
            let name = |x: u8| -> Box<[u8]> { vec![x].into() };
            let found = cycle(&[0], blockers.iter().map(|&x| name(x)).collect(), |q| {
                edges.iter().filter(|(f, _)| [*f] == *q).map(|&(_, t)| name(t)).collect()
            });
            prop_assert_eq!(found.is_some(), expected);
            if let Some(c) = found {
                prop_assert_eq!(&*c[0], &[0u8][..]);
                if c.len() > 1 {
                    prop_assert!(blockers.contains(&c[1][0]), "the first step is a blocker");
                }
                for pair in c.windows(2).skip(1) {
                    prop_assert!(edges.contains(&(pair[0][0], pair[1][0])), "{:?} is an edge", pair);
                }
                let last = c.last().unwrap()[0];
                prop_assert!(c.len() == 1 || edges.contains(&(last, 0)), "the last waits for the owner");
            }
        }
    }
}
