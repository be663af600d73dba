//! Argument parsing for the FLOCK commands, on raw byte arguments and free of
//! any Redis API, so that every malformed input maps to one error variant
//! (its text is the Redis layer's `errors`) and the parser can be fuzzed
//! without a server.

use crate::holders::Want;
use crate::limits::{MAX_ALL_KEYS, MAX_ID_LEN, MAX_LOCK_DELAY_MS, MAX_MS, MAX_OWNER_LEN};
use crate::record::parse_u64;

#[derive(Debug, PartialEq, Eq, Clone)]
pub enum ArgError {
    Arity,
    Owner,
    Lease,
    Timeout,
    UnknownOption(String),
    Repeated(&'static str),
    MissingValue(&'static str),
    /// A request ID outside 1..=64 bytes.
    Id,
    /// An option other than `ID request-id` after RELEASE, RENEW or FORCERELEASE.
    UnknownIdOption(String),
    /// `PERMITS n` outside 1..=m, or without `LIMIT m`.
    Permits,
    /// `LIMIT m` outside 1..=2^32-1.
    Limit,
    /// Both `SHARED` and `PERMITS`.
    SharedAndPermits,
    /// A session ID other than 32 lowercase hex digits.
    SessionId,
    /// FLOCK.INBOX's timeout-ms.
    InboxTimeout,
    /// `LOCKDELAY ms` outside 0..=MAX_LOCK_DELAY_MS.
    LockDelay,
    /// `lease-ms` 0 (the grant lives while its session does) without
    /// `INBOX session-id` to name that session.
    SessionLease,
    /// FLOCK.SESSION's `TIMEOUT ms` outside its range, or another option.
    SessionTimeout,
    /// `numkeys` outside 1..=`MAX_ALL_KEYS`, or more than the keys given.
    NumKeys,
    /// A key named twice in one ACQUIREALL or RELEASEALL (its position).
    DuplicateKey(usize),
    /// An option of ACQUIRE that a command on several keys does not take.
    NotForAll(&'static str),
    /// FLOCK.TOP's `COUNT n` or FLOCK.LONGLOG GET's count, not a number in range.
    Count,
    /// An option FLOCK.TOP does not take.
    TopOption(String),
    /// FLOCK.TOP's `BY` something other than waiters, wait or hold.
    TopBy,
    /// FLOCK.LONGLOG without GET, LEN or RESET, or with more than they take.
    LongLog,
}

/// Session IDs are 32 lowercase hex digits (128 random bits).
pub const SESSION_ID_LEN: usize = 32;

#[derive(Debug, PartialEq, Eq)]
pub struct AcquireArgs<'a> {
    pub owner: &'a [u8],
    pub lease_ms: u64,
    /// `Some(0)` waits without limit.
    pub wait_ms: Option<u64>,
    pub session: bool,
    pub id: Option<&'a [u8]>,
    pub want: Want,
    /// `INBOX session-id`: sent on behalf of that session.
    pub inbox: Option<&'a [u8]>,
    /// `LOCKDELAY ms`; else the module's default applies.
    pub lock_delay_ms: Option<u32>,
}

/// `owner lease-ms [WAIT timeout-ms] [SESSION] [INBOX session-id] [ID
/// request-id] [LOCKDELAY ms] [SHARED | PERMITS n LIMIT m]` (after the key).
pub fn acquire<'a>(args: &[&'a [u8]]) -> Result<AcquireArgs<'a>, ArgError> {
    let [owner, lease, options @ ..] = args else {
        return Err(ArgError::Arity);
    };
    let mut parsed = AcquireArgs {
        owner: parse_owner(owner)?,
        lease_ms: parse_ms(lease, 0).ok_or(ArgError::Lease)?,
        wait_ms: None,
        session: false,
        id: None,
        want: Want::Exclusive,
        inbox: None,
        lock_delay_ms: None,
    };
    let mut rest = options.iter();
    while let Some(option) = rest.next() {
        if option.eq_ignore_ascii_case(b"WAIT") {
            if parsed.wait_ms.is_some() {
                return Err(ArgError::Repeated("WAIT"));
            }
            let value = rest.next().ok_or(ArgError::MissingValue("WAIT"))?;
            parsed.wait_ms = Some(parse_ms(value, 0).ok_or(ArgError::Timeout)?);
        } else if option.eq_ignore_ascii_case(b"SESSION") {
            if parsed.session {
                return Err(ArgError::Repeated("SESSION"));
            }
            parsed.session = true;
        } else if option.eq_ignore_ascii_case(b"ID") {
            if parsed.id.is_some() {
                return Err(ArgError::Repeated("ID"));
            }
            parsed.id = Some(parse_id(rest.next().ok_or(ArgError::MissingValue("ID"))?)?);
        } else if option.eq_ignore_ascii_case(b"INBOX") {
            if parsed.inbox.is_some() {
                return Err(ArgError::Repeated("INBOX"));
            }
            parsed.inbox = Some(parse_session_id(rest.next().ok_or(ArgError::MissingValue("INBOX"))?)?);
        } else if option.eq_ignore_ascii_case(b"LOCKDELAY") {
            if parsed.lock_delay_ms.is_some() {
                return Err(ArgError::Repeated("LOCKDELAY"));
            }
            let value = rest.next().ok_or(ArgError::MissingValue("LOCKDELAY"))?;
            let ms = parse_u64(value).and_then(|ms| u32::try_from(ms).ok()).filter(|&ms| ms <= MAX_LOCK_DELAY_MS);
            parsed.lock_delay_ms = Some(ms.ok_or(ArgError::LockDelay)?);
        } else if option.eq_ignore_ascii_case(b"SHARED") {
            parsed.want = match parsed.want {
                Want::Exclusive => Want::Shared,
                Want::Shared => return Err(ArgError::Repeated("SHARED")),
                Want::Permits { .. } => return Err(ArgError::SharedAndPermits),
            };
        } else if option.eq_ignore_ascii_case(b"PERMITS") {
            parsed.want = match parsed.want {
                Want::Exclusive => permits(rest.next(), rest.next(), rest.next())?,
                Want::Shared => return Err(ArgError::SharedAndPermits),
                Want::Permits { .. } => return Err(ArgError::Repeated("PERMITS")),
            };
        } else {
            return Err(ArgError::UnknownOption(printable(option)));
        }
    }
    if parsed.lease_ms == 0 {
        // The session it lives with is the one it is bound to.
        parsed.session = true;
        if parsed.inbox.is_none() {
            return Err(ArgError::SessionLease);
        }
    }
    Ok(parsed)
}

/// The shortest and longest session timeouts, in milliseconds.
pub const SESSION_TIMEOUTS: std::ops::RangeInclusive<u64> = 100..=3_600_000;

/// `[TIMEOUT ms] [WITHTIMEOUT]` (SESSION): the session's timeout, if
/// given, and whether the reply names the timeout.
pub fn session(args: &[&[u8]]) -> Result<(Option<u64>, bool), ArgError> {
    let (mut timeout, mut with_timeout) = (None, false);
    let mut rest = args.iter();
    while let Some(option) = rest.next() {
        if option.eq_ignore_ascii_case(b"TIMEOUT") && timeout.is_none() {
            let ms = rest.next().and_then(|ms| parse_u64(ms)).filter(|ms| SESSION_TIMEOUTS.contains(ms));
            timeout = Some(ms.ok_or(ArgError::SessionTimeout)?);
        } else if option.eq_ignore_ascii_case(b"WITHTIMEOUT") && !with_timeout {
            with_timeout = true;
        } else {
            return Err(ArgError::SessionTimeout);
        }
    }
    Ok((timeout, with_timeout))
}

/// The keys of a command on several keys, and the arguments after them.
pub type KeysAndRest<'a, 'b> = (&'b [&'a [u8]], &'b [&'a [u8]]);

/// `numkeys key [key ...] rest...` (ACQUIREALL, RELEASEALL): the keys, each
/// once, and what follows them.
pub fn keys<'a, 'b>(args: &'b [&'a [u8]]) -> Result<KeysAndRest<'a, 'b>, ArgError> {
    let [numkeys, rest @ ..] = args else { return Err(ArgError::Arity) };
    let n = parse_u64(numkeys).and_then(|n| usize::try_from(n).ok()).filter(|n| (1..=MAX_ALL_KEYS).contains(n));
    let n = n.filter(|&n| n <= rest.len()).ok_or(ArgError::NumKeys)?;
    let (keys, rest) = rest.split_at(n);
    let mut seen = std::collections::HashSet::with_capacity(n);
    if let Some(at) = keys.iter().position(|k| !seen.insert(*k)) {
        return Err(ArgError::DuplicateKey(at + 1));
    }
    Ok((keys, rest))
}

/// `numkeys key [key ...] owner lease-ms [WAIT timeout-ms] [SESSION] [ID
/// request-id] [SHARED]`: as ACQUIRE's, without `INBOX` (a blocked client
/// waits) or `PERMITS` (a semaphore is one key).
pub fn acquire_all<'a, 'b>(args: &'b [&'a [u8]]) -> Result<(&'b [&'a [u8]], AcquireArgs<'a>), ArgError> {
    let (keys, rest) = keys(args)?;
    let parsed = acquire(rest)?;
    if parsed.inbox.is_some() {
        return Err(ArgError::NotForAll("INBOX"));
    }
    if matches!(parsed.want, Want::Permits { .. }) {
        return Err(ArgError::NotForAll("PERMITS"));
    }
    Ok((keys, parsed))
}

/// `n LIMIT m` after `PERMITS`: 1 <= n <= m <= 2^32-1.
fn permits(n: Option<&&[u8]>, keyword: Option<&&[u8]>, m: Option<&&[u8]>) -> Result<Want, ArgError> {
    let n = n.ok_or(ArgError::MissingValue("PERMITS"))?;
    if !keyword.is_some_and(|k| k.eq_ignore_ascii_case(b"LIMIT")) {
        return Err(ArgError::Permits);
    }
    let limit = m.and_then(|m| parse_u64(m)).and_then(|m| u32::try_from(m).ok()).filter(|&m| m > 0);
    let limit = limit.ok_or(ArgError::Limit)?;
    let n = parse_u64(n).and_then(|n| u32::try_from(n).ok()).filter(|&n| (1..=limit).contains(&n));
    Ok(Want::Permits { n: n.ok_or(ArgError::Permits)?, limit })
}

fn parse_session_id(id: &[u8]) -> Result<&[u8], ArgError> {
    let hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    match id.len() == SESSION_ID_LEN && id.iter().all(hex) {
        true => Ok(id),
        false => Err(ArgError::SessionId),
    }
}

/// `owner` (CANCEL).
pub fn cancel<'a>(args: &[&'a [u8]]) -> Result<&'a [u8], ArgError> {
    match args {
        [owner] => parse_owner(owner),
        _ => Err(ArgError::Arity),
    }
}

/// `timeout-ms` (INBOX): 0 waits without limit.
pub fn inbox(args: &[&[u8]]) -> Result<u64, ArgError> {
    match args {
        [timeout] => parse_ms(timeout, 0).ok_or(ArgError::InboxTimeout),
        _ => Err(ArgError::Arity),
    }
}

/// `owner [ID request-id]` (RELEASE).
pub fn release<'a>(args: &[&'a [u8]]) -> Result<(&'a [u8], Option<&'a [u8]>), ArgError> {
    match args {
        [owner, options @ ..] => Ok((parse_owner(owner)?, id_option(options)?)),
        _ => Err(ArgError::Arity),
    }
}

/// RENEW's owner, lease-ms and request ID.
pub type RenewArgs<'a> = (&'a [u8], u64, Option<&'a [u8]>);

/// `owner lease-ms [ID request-id]` (RENEW).
pub fn renew<'a>(args: &[&'a [u8]]) -> Result<RenewArgs<'a>, ArgError> {
    match args {
        [owner, lease, options @ ..] => Ok((parse_owner(owner)?, parse_lease(lease)?, id_option(options)?)),
        _ => Err(ArgError::Arity),
    }
}

/// `[ID request-id]` (FORCERELEASE, and after RELEASE's and RENEW's arguments).
pub fn id_option<'a>(options: &[&'a [u8]]) -> Result<Option<&'a [u8]>, ArgError> {
    match options {
        [] => Ok(None),
        [option, rest @ ..] if !option.eq_ignore_ascii_case(b"ID") => Err(ArgError::UnknownIdOption(printable(option))),
        [_] => Err(ArgError::MissingValue("ID")),
        [_, id] => parse_id(id).map(Some),
        [_, _, extra, ..] if extra.eq_ignore_ascii_case(b"ID") => Err(ArgError::Repeated("ID")),
        [_, _, extra, ..] => Err(ArgError::UnknownIdOption(printable(extra))),
    }
}

fn parse_id(id: &[u8]) -> Result<&[u8], ArgError> {
    match id.len() {
        1..=MAX_ID_LEN => Ok(id),
        _ => Err(ArgError::Id),
    }
}

fn parse_owner(owner: &[u8]) -> Result<&[u8], ArgError> {
    if owner.is_empty() || owner.len() > MAX_OWNER_LEN {
        return Err(ArgError::Owner);
    }
    Ok(owner)
}

fn parse_lease(lease: &[u8]) -> Result<u64, ArgError> {
    parse_ms(lease, 1).ok_or(ArgError::Lease)
}

/// A plain decimal integer in `min..=MAX_MS`: no sign, no spaces, no float.
fn parse_ms(value: &[u8], min: u64) -> Option<u64> {
    parse_u64(value).filter(|n| (min..=MAX_MS).contains(n))
}

/// Echoes an unknown option safely inside an error line: printable ASCII
/// only, because the crate sends each char of an error as one byte (`c as
/// u8`), so anything else would reach the client as invalid UTF-8, which
/// clients such as redis-rs cannot parse.
fn printable(option: &[u8]) -> String {
    shown(option, 32)
}

/// Client bytes inside an error line: the first `max` bytes, printable
/// ASCII as it is, every other byte as `?`.
pub fn shown(bytes: &[u8], max: usize) -> String {
    bytes.iter().take(max).map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '?' }).collect()
}

/// How FLOCK.TOP orders the contended locks, the first first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopOrder {
    /// Most waiters.
    Waiters,
    /// The oldest wait.
    Wait,
    /// The longest held.
    Hold,
}

#[derive(Debug, PartialEq, Eq)]
pub struct TopArgs<'a> {
    /// `None`: all of them.
    pub count: Option<usize>,
    pub pattern: Option<&'a [u8]>,
    pub by: TopOrder,
}

/// FLOCK.TOP lists this many locks unless told otherwise.
pub const TOP_COUNT: usize = 10;

/// `[COUNT n] [MATCH pattern] [BY waiters|wait|hold]` (TOP), each once, in
/// any order.
pub fn top<'a>(args: &[&'a [u8]]) -> Result<TopArgs<'a>, ArgError> {
    let (mut count, mut pattern, mut by) = (None, None, None);
    let mut rest = args.iter();
    while let Some(option) = rest.next() {
        let upper = option.to_ascii_uppercase();
        let (name, seen): (&'static str, bool) = match upper.as_slice() {
            b"COUNT" => ("COUNT", count.is_some()),
            b"MATCH" => ("MATCH", pattern.is_some()),
            b"BY" => ("BY", by.is_some()),
            _ => return Err(ArgError::TopOption(printable(option))),
        };
        if seen {
            return Err(ArgError::Repeated(name));
        }
        let value = *rest.next().ok_or(ArgError::MissingValue(name))?;
        match name {
            "COUNT" => count = Some(parse_u64(value).and_then(|n| usize::try_from(n).ok()).ok_or(ArgError::Count)?),
            "MATCH" => pattern = Some(value),
            _ => {
                by = Some(match value.to_ascii_lowercase().as_slice() {
                    b"waiters" => TopOrder::Waiters,
                    b"wait" => TopOrder::Wait,
                    b"hold" => TopOrder::Hold,
                    _ => return Err(ArgError::TopBy),
                })
            }
        }
    }
    let count = match count {
        Some(0) => None,
        Some(n) => Some(n),
        None => Some(TOP_COUNT),
    };
    Ok(TopArgs { count, pattern, by: by.unwrap_or(TopOrder::Waiters) })
}

/// `owner` (OWNER).
pub fn owner<'a>(args: &[&'a [u8]]) -> Result<&'a [u8], ArgError> {
    cancel(args)
}

#[derive(Debug, PartialEq, Eq)]
pub enum LongLogArgs {
    /// The newest this many entries (`None`: all).
    Get(Option<usize>),
    Len,
    Reset,
}

/// FLOCK.LONGLOG GET shows this many entries unless told otherwise.
pub const LONGLOG_COUNT: usize = 10;

/// `GET [count] | LEN | RESET` (LONGLOG); a count of -1 is all, as SLOWLOG's.
pub fn longlog(args: &[&[u8]]) -> Result<LongLogArgs, ArgError> {
    let Some((sub, rest)) = args.split_first() else { return Err(ArgError::Arity) };
    match (sub.to_ascii_uppercase().as_slice(), rest) {
        (b"GET", []) => Ok(LongLogArgs::Get(Some(LONGLOG_COUNT))),
        (b"GET", [b"-1"]) => Ok(LongLogArgs::Get(None)),
        (b"GET", [n]) => {
            parse_u64(n).and_then(|n| usize::try_from(n).ok()).map(|n| LongLogArgs::Get(Some(n))).ok_or(ArgError::Count)
        }
        (b"LEN", []) => Ok(LongLogArgs::Len),
        (b"RESET", []) => Ok(LongLogArgs::Reset),
        _ => Err(ArgError::LongLog),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn acq(args: &[&str]) -> Result<AcquireArgs<'static>, ArgError> {
        let owned: Vec<&'static [u8]> =
            args.iter().map(|a| &*Box::leak(a.as_bytes().to_vec().into_boxed_slice())).collect();
        acquire(&owned)
    }

    #[test]
    fn accepts_options_in_any_order_and_case() {
        let a = acq(&["me", "1000", "session", "Wait", "0"]).unwrap();
        assert_eq!((a.owner, a.lease_ms, a.wait_ms, a.session), (&b"me"[..], 1000, Some(0), true));
        assert_eq!(acq(&["me", "1099511627776"]).unwrap().lease_ms, MAX_MS);
    }

    #[test]
    fn rejects_each_kind_of_bad_input() {
        assert_eq!(acq(&["me"]), Err(ArgError::Arity));
        assert_eq!(acq(&["", "10"]), Err(ArgError::Owner));
        assert_eq!(acq(&[&"x".repeat(257), "10"]), Err(ArgError::Owner));
        assert_eq!(acq(&["me", "0"]), Err(ArgError::SessionLease));
        assert_eq!(acq(&["me", "0", "SESSION"]), Err(ArgError::SessionLease));
        for lease in ["-1", "1.5", "+5", " 5", "1099511627777", "18446744073709551616", "abc"] {
            assert_eq!(acq(&["me", lease]), Err(ArgError::Lease), "{lease}");
        }
        assert_eq!(acq(&["me", "10", "WAIT", "-1"]), Err(ArgError::Timeout));
        assert_eq!(acq(&["me", "10", "WAIT"]), Err(ArgError::MissingValue("WAIT")));
        assert_eq!(acq(&["me", "10", "WAIT", "1", "wait", "2"]), Err(ArgError::Repeated("WAIT")));
        assert_eq!(acq(&["me", "10", "SESSION", "SESSION"]), Err(ArgError::Repeated("SESSION")));
        assert_eq!(acq(&["me", "10", "WAITS", "1"]), Err(ArgError::UnknownOption("WAITS".into())));
        assert_eq!(acq(&["me", "10", "é\r\n\0x"]), Err(ArgError::UnknownOption("?????x".into())));
        assert_eq!(acq(&["me", "10", "ID"]), Err(ArgError::MissingValue("ID")));
        assert_eq!(acq(&["me", "10", "ID", ""]), Err(ArgError::Id));
        assert_eq!(acq(&["me", "10", "ID", &"i".repeat(65)]), Err(ArgError::Id));
        assert_eq!(acq(&["me", "10", "ID", "a", "id", "b"]), Err(ArgError::Repeated("ID")));
        assert_eq!(acq(&["me", "10", "id", &"i".repeat(64)]).unwrap().id, Some("i".repeat(64).as_bytes()));
    }

    fn leak(args: &[&str]) -> Vec<&'static [u8]> {
        args.iter().map(|a| &*Box::leak(a.as_bytes().to_vec().into_boxed_slice())).collect()
    }

    #[test]
    fn lease_zero_is_a_session_grant_and_needs_its_inbox() {
        let id = "0123456789abcdef0123456789abcdef";
        let a = acq(&["me", "0", "INBOX", id]).unwrap();
        assert_eq!((a.lease_ms, a.session, a.inbox), (0, true, Some(id.as_bytes())));
    }

    #[test]
    fn session_takes_only_a_timeout_in_range_and_withtimeout() {
        let session = |args: &[&str]| session(&leak(args));
        assert_eq!(session(&[]), Ok((None, false)));
        assert_eq!(session(&["timeout", "100"]), Ok((Some(100), false)));
        assert_eq!(session(&["WithTimeout", "TIMEOUT", "3600000"]), Ok((Some(3_600_000), true)));
        assert_eq!(session(&["WITHTIMEOUT"]), Ok((None, true)));
        let bad: [&[&str]; 7] = [
            &["TIMEOUT", "99"],
            &["TIMEOUT", "3600001"],
            &["TIMEOUT"],
            &["TIMEOUT", "-5"],
            &["WAIT", "100"],
            &["TIMEOUT", "100", "TIMEOUT", "200"],
            &["WITHTIMEOUT", "WITHTIMEOUT"],
        ];
        for bad in bad {
            assert_eq!(session(bad), Err(ArgError::SessionTimeout), "{bad:?}");
        }
    }

    #[test]
    fn acquire_all_takes_numkeys_distinct_keys_then_acquires_options() {
        let args = leak(&["2", "a", "b", "me", "10", "WAIT", "5", "shared", "ID", "r"]);
        let (keys, a) = acquire_all(&args).unwrap();
        assert_eq!(keys, [&b"a"[..], &b"b"[..]]);
        assert_eq!((a.owner, a.wait_ms, a.want, a.id), (&b"me"[..], Some(5), Want::Shared, Some(&b"r"[..])));
        let many: Vec<String> = (0..MAX_ALL_KEYS).map(|i| i.to_string()).collect();
        let mut args: Vec<&str> = vec![];
        let n = MAX_ALL_KEYS.to_string();
        args.push(&n);
        args.extend(many.iter().map(String::as_str));
        args.extend(["me", "10"]);
        assert_eq!(acquire_all(&leak(&args)).unwrap().0.len(), MAX_ALL_KEYS);
    }

    #[test]
    fn acquire_all_rejects_bad_numkeys_duplicates_inbox_and_permits() {
        let all = |args: &[&str]| acquire_all(&leak(args)).map(|(keys, _)| keys.len());
        for n in ["0", "-1", "x", "257"] {
            assert_eq!(all(&[n, "a", "b", "me"]), Err(ArgError::NumKeys), "{n}");
        }
        assert_eq!(all(&["3", "a", "b"]), Err(ArgError::NumKeys), "more keys than arguments");
        assert_eq!(all(&[]), Err(ArgError::Arity));
        assert_eq!(all(&["2", "a", "b"]), Err(ArgError::Arity));
        assert_eq!(all(&["3", "a", "b", "a", "me", "10"]), Err(ArgError::DuplicateKey(3)));
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(all(&["1", "a", "me", "10", "INBOX", id]), Err(ArgError::NotForAll("INBOX")));
        assert_eq!(all(&["1", "a", "me", "10", "PERMITS", "1", "LIMIT", "2"]), Err(ArgError::NotForAll("PERMITS")));
        assert_eq!(all(&["1", "a", "me", "0"]), Err(ArgError::SessionLease));
    }

    #[test]
    fn inbox_takes_a_session_id_of_32_lowercase_hex_digits() {
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(acq(&["me", "10", "WAIT", "0", "inbox", id]).unwrap().inbox, Some(id.as_bytes()));
        for bad in ["", "0123456789ABCDEF0123456789ABCDEF", &id[1..], &format!("{id}0"), "g".repeat(32).as_str()] {
            assert_eq!(acq(&["me", "10", "INBOX", bad]), Err(ArgError::SessionId), "{bad}");
        }
        assert_eq!(acq(&["me", "10", "INBOX"]), Err(ArgError::MissingValue("INBOX")));
        assert_eq!(acq(&["me", "10", "INBOX", id, "INBOX", id]), Err(ArgError::Repeated("INBOX")));
    }

    #[test]
    fn cancel_and_inbox_take_one_argument() {
        let b = |s: &'static str| s.as_bytes();
        assert_eq!(cancel(&[b("me")]), Ok(&b"me"[..]));
        assert_eq!(cancel(&[]), Err(ArgError::Arity));
        assert_eq!(cancel(&[b("me"), b("x")]), Err(ArgError::Arity));
        assert_eq!(cancel(&[b("")]), Err(ArgError::Owner));
        assert_eq!(inbox(&[b("0")]), Ok(0));
        assert_eq!(inbox(&[b("-1")]), Err(ArgError::InboxTimeout));
        assert_eq!(inbox(&[]), Err(ArgError::Arity));
    }

    #[test]
    fn shared_and_permits_choose_the_kind_and_exclude_each_other() {
        assert_eq!(acq(&["me", "10"]).unwrap().want, Want::Exclusive);
        assert_eq!(acq(&["me", "10", "shared", "WAIT", "0"]).unwrap().want, Want::Shared);
        assert_eq!(acq(&["me", "10", "PERMITS", "2", "limit", "3"]).unwrap().want, Want::Permits { n: 2, limit: 3 });
        let max = u32::MAX.to_string();
        assert_eq!(
            acq(&["me", "10", "PERMITS", &max, "LIMIT", &max]).unwrap().want,
            Want::Permits { n: u32::MAX, limit: u32::MAX }
        );
        assert_eq!(acq(&["me", "10", "SHARED", "PERMITS", "1", "LIMIT", "2"]), Err(ArgError::SharedAndPermits));
        assert_eq!(acq(&["me", "10", "PERMITS", "1", "LIMIT", "2", "SHARED"]), Err(ArgError::SharedAndPermits));
        assert_eq!(acq(&["me", "10", "SHARED", "SHARED"]), Err(ArgError::Repeated("SHARED")));
        assert_eq!(
            acq(&["me", "10", "PERMITS", "1", "LIMIT", "2", "PERMITS", "1", "LIMIT", "2"]),
            Err(ArgError::Repeated("PERMITS"))
        );
        assert_eq!(acq(&["me", "10", "PERMITS", "3", "LIMIT", "2"]), Err(ArgError::Permits), "n > m");
        assert_eq!(acq(&["me", "10", "PERMITS", "0", "LIMIT", "2"]), Err(ArgError::Permits), "n = 0");
        assert_eq!(acq(&["me", "10", "PERMITS", "1", "LIMIT", "4294967296"]), Err(ArgError::Limit), "m > 2^32-1");
        assert_eq!(acq(&["me", "10", "PERMITS", "1", "LIMIT", "0"]), Err(ArgError::Limit));
        assert_eq!(acq(&["me", "10", "PERMITS", "1"]), Err(ArgError::Permits), "no LIMIT");
        assert_eq!(acq(&["me", "10", "PERMITS", "1", "WAIT", "2"]), Err(ArgError::Permits));
        assert_eq!(acq(&["me", "10", "PERMITS"]), Err(ArgError::MissingValue("PERMITS")));
    }

    #[test]
    fn id_is_the_one_option_of_release_renew_and_forcerelease() {
        assert_eq!(release(&[b"me", b"ID", b"r1"]), Ok((&b"me"[..], Some(&b"r1"[..]))));
        assert_eq!(renew(&[b"me", b"10"]), Ok((&b"me"[..], 10, None)));
        assert_eq!(id_option(&[b"id", b"x"]), Ok(Some(&b"x"[..])));
        assert_eq!(id_option(&[b"ID"]), Err(ArgError::MissingValue("ID")));
        assert_eq!(id_option(&[b"ID", b""]), Err(ArgError::Id));
        assert_eq!(id_option(&[b"WAIT", b"1"]), Err(ArgError::UnknownIdOption("WAIT".into())));
        assert_eq!(id_option(&[b"ID", b"a", b"ID", b"b"]), Err(ArgError::Repeated("ID")));
        assert_eq!(id_option(&[b"ID", b"a", b"x"]), Err(ArgError::UnknownIdOption("x".into())));
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_arguments(args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..8)) {
            let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            // The options echoed back are ASCII: the crate sends an error's
            // text char by char as bytes.
            let errors = [acquire(&refs).err(), release(&refs).err(), renew(&refs).err(), id_option(&refs).err()];
            for e in errors.into_iter().flatten() {
                if let ArgError::UnknownOption(o) | ArgError::UnknownIdOption(o) = e {
                    prop_assert!(o.is_ascii(), "{o}");
                }
            }
        }
    }

    #[test]
    fn top_takes_each_option_once_in_any_order() {
        assert_eq!(top(&[]), Ok(TopArgs { count: Some(TOP_COUNT), pattern: None, by: TopOrder::Waiters }));
        assert_eq!(
            top(&[b"by", b"HOLD", b"match", b"a*", b"count", b"0"]),
            Ok(TopArgs { count: None, pattern: Some(&b"a*"[..]), by: TopOrder::Hold })
        );
        assert_eq!(top(&[b"COUNT", b"-1"]), Err(ArgError::Count));
        assert_eq!(top(&[b"COUNT"]), Err(ArgError::MissingValue("COUNT")));
        assert_eq!(top(&[b"COUNT", b"1", b"count", b"2"]), Err(ArgError::Repeated("COUNT")));
        assert_eq!(top(&[b"BY", b"owner"]), Err(ArgError::TopBy));
        assert_eq!(top(&[b"LIMIT", b"1"]), Err(ArgError::TopOption("LIMIT".into())));
    }

    #[test]
    fn longlog_takes_get_with_a_count_len_or_reset() {
        assert_eq!(longlog(&[b"get"]), Ok(LongLogArgs::Get(Some(LONGLOG_COUNT))));
        assert_eq!(longlog(&[b"GET", b"-1"]), Ok(LongLogArgs::Get(None)));
        assert_eq!(longlog(&[b"GET", b"3"]), Ok(LongLogArgs::Get(Some(3))));
        assert_eq!(longlog(&[b"GET", b"-2"]), Err(ArgError::Count));
        assert_eq!(longlog(&[b"len"]), Ok(LongLogArgs::Len));
        assert_eq!(longlog(&[b"RESET"]), Ok(LongLogArgs::Reset));
        assert_eq!(longlog(&[b"LEN", b"1"]), Err(ArgError::LongLog));
        assert_eq!(longlog(&[b"HELP"]), Err(ArgError::LongLog));
        assert_eq!(longlog(&[]), Err(ArgError::Arity));
    }
}
