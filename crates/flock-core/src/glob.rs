//! Glob-style patterns on binary key names, as Redis's `SCAN ... MATCH` and
//! `KEYS` read them: `*` any run, `?` one byte, `[abc]`, `[^a]`, `[a-z]`
//! classes, `\x` the byte x. Matching backtracks only to the last `*`, so
//! it takes O(pattern x name) at worst, never exponential time.

/// Whether `name` matches `pattern` as a whole.
pub fn matches(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    // Where to resume after the last `*`: the pattern after it, and the
    // name position it has absorbed up to.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match step(pattern, p, name[n]) {
            Step::Star => {
                star = Some((p + 1, n));
                p += 1;
                continue;
            }
            Step::Matched(next) => {
                p = next;
                n += 1;
                continue;
            }
            Step::Failed => {}
        }
        match star {
            Some((after, absorbed)) => {
                star = Some((after, absorbed + 1));
                p = after;
                n = absorbed + 1;
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

enum Step {
    Star,
    /// The byte matched the element at the position; the next one starts here.
    Matched(usize),
    Failed,
}

/// Tries the pattern element at `p` on one byte.
fn step(pattern: &[u8], p: usize, byte: u8) -> Step {
    match pattern.get(p) {
        None => Step::Failed,
        Some(b'*') => Step::Star,
        Some(b'?') => Step::Matched(p + 1),
        Some(b'[') => class(pattern, p + 1, byte),
        Some(b'\\') if p + 1 < pattern.len() => matched(pattern[p + 1] == byte, p + 2),
        Some(&c) => matched(c == byte, p + 1),
    }
}

fn matched(yes: bool, next: usize) -> Step {
    if yes {
        Step::Matched(next)
    } else {
        Step::Failed
    }
}

/// A class whose body starts at `p` (after `[`); as in Redis, an unclosed
/// class runs to the end of the pattern.
fn class(pattern: &[u8], mut p: usize, byte: u8) -> Step {
    let negated = pattern.get(p) == Some(&b'^');
    if negated {
        p += 1;
    }
    let mut found = false;
    while p < pattern.len() && pattern[p] != b']' {
        if pattern[p] == b'\\' && p + 1 < pattern.len() {
            found |= pattern[p + 1] == byte;
            p += 2;
        } else if p + 2 < pattern.len() && pattern[p + 1] == b'-' && pattern[p + 2] != b']' {
            let (lo, hi) = (pattern[p].min(pattern[p + 2]), pattern[p].max(pattern[p + 2]));
            found |= (lo..=hi).contains(&byte);
            p += 3;
        } else {
            found |= pattern[p] == byte;
            p += 1;
        }
    }
    matched(found != negated, (p + 1).min(pattern.len()))
}

#[cfg(test)]
mod tests {
    use super::matches;
    use proptest::prelude::*;

    #[test]
    fn the_forms_of_redis_patterns_match_as_in_redis() {
        let yes: &[(&[u8], &[u8])] = &[
            (b"*", b""),
            (b"*", b"orders"),
            (b"ord*", b"orders"),
            (b"*ers", b"orders"),
            (b"o*d*s", b"orders"),
            (b"h?llo", b"hello"),
            (b"h[ae]llo", b"hallo"),
            (b"h[^e]llo", b"hallo"),
            (b"h[a-b]llo", b"hbllo"),
            (b"h[b-a]llo", b"hallo"),
            (b"h\\*llo", b"h*llo"),
            (b"[\\]]", b"]"),
            (b"job:*:lock", b"job:a:b:lock"),
            (b"\xff*", b"\xff\x00"),
        ];
        let no: &[(&[u8], &[u8])] = &[
            (b"", b"a"),
            (b"ord*", b"or"),
            (b"h?llo", b"hllo"),
            (b"h[ae]llo", b"hillo"),
            (b"h[^e]llo", b"hello"),
            (b"h\\*llo", b"hello"),
            (b"job:*:lock", b"job:a:b:locks"),
            (b"a*b", b"aaaa"),
        ];
        for (p, n) in yes {
            assert!(matches(p, n), "{:?} should match {:?}", String::from_utf8_lossy(p), String::from_utf8_lossy(n));
        }
        for (p, n) in no {
            assert!(
                !matches(p, n),
                "{:?} should not match {:?}",
                String::from_utf8_lossy(p),
                String::from_utf8_lossy(n)
            );
        }
    }

    #[test]
    fn many_stars_over_a_long_name_take_no_exponential_time() {
        let name = vec![b'a'; 10_000];
        assert!(!matches(b"*a*a*a*a*a*a*a*a*a*a*b", &name));
    }

    proptest! {
        #[test]
        fn a_name_matches_itself_escaped_and_every_star_pattern_around_it(name in proptest::collection::vec(any::<u8>(), 0..20), cut in 0usize..20) {
            let escaped: Vec<u8> = name.iter().flat_map(|&b| [b'\\', b]).collect();
            prop_assert!(matches(&escaped, &name));
            let cut = cut.min(name.len());
            let prefix: Vec<u8> = name[..cut].iter().flat_map(|&b| [b'\\', b]).chain([b'*']).collect();
            prop_assert!(matches(&prefix, &name));
        }
    }
}
