//! Argument parsing for the FLOCK commands, on raw byte arguments and free of
//! any Redis API, so that every malformed input maps to one clear error and
//! the parser can be fuzzed without a server.

use std::fmt;

use crate::lock::{Mode, Want};
use crate::requests::{Kind, Record, MAX_ID_LEN};

pub const MAX_OWNER_LEN: usize = 256;
pub const MAX_MS: u64 = 1 << 40;
/// Replies carry tokens as signed 64-bit integers.
pub const MAX_TOKEN: u64 = i64::MAX as u64;

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
    /// A holder that no command could have made; says which field.
    State(&'static str),
    /// `PERMITS n` outside 1..=m, or without `LIMIT m`.
    Permits,
    /// `LIMIT m` outside 1..=2^32-1.
    Limit,
    /// Both `SHARED` and `PERMITS`.
    SharedAndPermits,
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Arity => write!(f, "ERR wrong number of arguments"),
            Self::Owner => write!(f, "ERR invalid owner: it must be 1 to {MAX_OWNER_LEN} bytes long"),
            Self::Lease => write!(f, "ERR invalid lease-ms: it must be an integer number of milliseconds from 1 to {MAX_MS}"),
            Self::Timeout => write!(
                f,
                "ERR invalid WAIT timeout-ms: it must be an integer number of milliseconds from 0 (no limit) to {MAX_MS}"
            ),
            Self::UnknownOption(o) => {
                write!(
                    f,
                    "ERR unknown option '{o}': FLOCK.ACQUIRE takes only WAIT timeout-ms, SESSION and ID request-id, and SHARED or PERMITS n LIMIT m"
                )
            }
            Self::Id => write!(f, "ERR invalid request ID: it must be 1 to {MAX_ID_LEN} bytes long"),
            Self::UnknownIdOption(o) => write!(f, "ERR unknown option '{o}': the only option here is ID request-id"),
            Self::Repeated(o) => write!(f, "ERR option {o} given more than once: each option may appear once"),
            Self::MissingValue("ID") => write!(f, "ERR option ID has no value: write ID request-id"),
            Self::MissingValue("PERMITS") => write!(f, "ERR option PERMITS has no value: write PERMITS n LIMIT m"),
            Self::MissingValue(o) => write!(f, "ERR option {o} has no value: write {o} timeout-ms (0 waits without limit)"),
            Self::State(field) => write!(f, "ERR invalid FLOCK.STATE holder: {field}"),
            Self::Permits => write!(
                f,
                "ERR invalid PERMITS: write PERMITS n LIMIT m with n an integer from 1 to m (the permits this owner takes)"
            ),
            Self::Limit => write!(
                f,
                "ERR invalid LIMIT: it must be an integer from 1 to {} (the permits of the semaphore)",
                u32::MAX
            ),
            Self::SharedAndPermits => {
                write!(f, "ERR SHARED and PERMITS exclude each other: SHARED is for a read-write lock, PERMITS for a semaphore")
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct AcquireArgs<'a> {
    pub owner: &'a [u8],
    pub lease_ms: u64,
    /// `Some(0)` waits without limit.
    pub wait_ms: Option<u64>,
    pub session: bool,
    pub id: Option<&'a [u8]>,
    pub want: Want,
}

/// `owner lease-ms [WAIT timeout-ms] [SESSION] [ID request-id] [SHARED |
/// PERMITS n LIMIT m]` (after the key).
pub fn acquire<'a>(args: &[&'a [u8]]) -> Result<AcquireArgs<'a>, ArgError> {
    let [owner, lease, options @ ..] = args else {
        return Err(ArgError::Arity);
    };
    let mut parsed = AcquireArgs {
        owner: parse_owner(owner)?,
        lease_ms: parse_lease(lease)?,
        wait_ms: None,
        session: false,
        id: None,
        want: Want::Exclusive,
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
    Ok(parsed)
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

/// `owner holds token deadline-ms session` (FLOCK.STATE), or nothing.
pub fn state<'a>(args: &[&'a [u8]], now_ms: u64) -> Result<Option<StateArgs<'a>>, ArgError> {
    match *args {
        [] => Ok(None),
        [owner, holds, token, deadline, session] => {
            holder_words([owner, holds, token, deadline, session], now_ms).map(Some)
        }
        _ => Err(ArgError::Arity),
    }
}

/// A replicated or loaded number; `field` says what it must be.
fn state_number(word: &[u8], field: &'static str) -> Result<u64, ArgError> {
    parse_u64(word).ok_or(ArgError::State(field))
}

/// `owner holds token deadline-ms session` as FLOCK.STATE and FLOCK.HOLDER
/// send them, checked by `holder`.
fn holder_words<'a>(
    [owner, holds, token, deadline, session]: [&'a [u8]; 5],
    now_ms: u64,
) -> Result<StateArgs<'a>, ArgError> {
    holder(
        owner,
        state_number(holds, HOLDS)?,
        state_number(token, TOKEN)?,
        state_number(deadline, DEADLINE)?,
        state_number(session, SESSION)?,
        now_ms,
    )
}

const OWNER: &str = "owner must be 1 to 256 bytes";
const HOLDS: &str = "holds must be an integer from 1 to 4294967295";
const TOKEN: &str = "token must be an integer from 1 to 9223372036854775807";
const DEADLINE: &str =
    "deadline-unix-ms must be an integer no later than 2^41 ms after this server's clock (a lease is at most 2^40 ms)";
const SESSION: &str = "session must be 0 or 1";

/// A holder as FLOCK.STATE or an RDB file gives it, checked against what a
/// command could have made: anything else (a crafted RESTORE payload, a
/// corrupt file) is refused, never stored with a number that would wrap.
/// Deadlines get 2^40 ms of slack beyond the longest lease for clocks that
/// differ between the server that wrote them and this one.
pub fn holder(
    owner: &[u8],
    holds: u64,
    token: u64,
    deadline_ms: u64,
    session: u64,
    now_ms: u64,
) -> Result<StateArgs<'_>, ArgError> {
    let check = |ok: bool, field| if ok { Ok(()) } else { Err(ArgError::State(field)) };
    check(!owner.is_empty() && owner.len() <= MAX_OWNER_LEN, OWNER)?;
    let holds = u32::try_from(holds).ok().filter(|&h| h > 0).ok_or(ArgError::State(HOLDS))?;
    check((1..=MAX_TOKEN).contains(&token), TOKEN)?;
    check(deadline_ms <= now_ms.saturating_add(2 * MAX_MS), DEADLINE)?;
    check(session <= 1, SESSION)?;
    Ok(StateArgs { owner, holds, token, deadline_ms, session: session == 1 })
}

const MODE: &str = "mode must be shared with limit 0, or semaphore with a limit from 1 to 4294967295";
const PERMITS: &str = "permits must be 0 for a shared holder and 1 to the limit for a semaphore holder";

/// A shared or semaphore holder as FLOCK.HOLDER or an RDB file gives it.
#[derive(Debug, PartialEq, Eq)]
pub struct MemberArgs<'a> {
    pub holder: StateArgs<'a>,
    pub permits: u32,
}

/// The mode and limit of FLOCK.HOLDER or an RDB file: `shared 0` or
/// `semaphore m`.
pub fn mode(shared: bool, limit: u64) -> Result<Mode, ArgError> {
    match (shared, u32::try_from(limit)) {
        (true, Ok(0)) => Ok(Mode::Lock),
        (false, Ok(limit)) if limit > 0 => Ok(Mode::Semaphore(limit)),
        _ => Err(ArgError::State(MODE)),
    }
}

/// A member's permits, checked against the key's mode.
pub fn member_permits(mode: Mode, permits: u64) -> Result<u32, ArgError> {
    let ok = match mode {
        Mode::Lock => permits == 0,
        Mode::Semaphore(limit) => (1..=u64::from(limit)).contains(&permits),
    };
    ok.then_some(permits as u32).ok_or(ArgError::State(PERMITS))
}

/// What FLOCK.HOLDER sets: the key's mode and, for one owner, its grant or
/// (`None`) that it holds nothing.
pub type HolderArgs<'a> = (Mode, Option<(&'a [u8], Option<MemberArgs<'a>>)>);

/// `shared|semaphore limit [owner [holds token deadline-ms session permits]]`
/// (FLOCK.HOLDER).
pub fn member<'a>(args: &[&'a [u8]], now_ms: u64) -> Result<HolderArgs<'a>, ArgError> {
    let [kind, limit, rest @ ..] = args else { return Err(ArgError::Arity) };
    let shared = match () {
        _ if kind.eq_ignore_ascii_case(b"shared") => true,
        _ if kind.eq_ignore_ascii_case(b"semaphore") => false,
        _ => return Err(ArgError::State(MODE)),
    };
    let mode = mode(shared, state_number(limit, MODE)?)?;
    match *rest {
        [] => Ok((mode, None)),
        [owner] => Ok((mode, Some((parse_owner(owner).map_err(|_| ArgError::State(OWNER))?, None)))),
        [owner, holds, token, deadline, session, permits] => {
            let holder = holder_words([owner, holds, token, deadline, session], now_ms)?;
            let permits = member_permits(mode, state_number(permits, PERMITS)?)?;
            Ok((mode, Some((holder.owner, Some(MemberArgs { holder, permits })))))
        }
        _ => Err(ArgError::Arity),
    }
}

const REQUEST: &str = "a request record is an ID of 1 to 64 bytes, a command code 0 to 3, a reply from 0 to \
                       9223372036854775807 and an expiry no later than 2^41 ms after this server's clock";

/// A remembered request as FLOCK.ID or an RDB file gives it, checked as
/// `holder` checks a holder.
pub fn request(id: &[u8], kind: u64, reply: u64, expires_ms: u64, now_ms: u64) -> Result<Record, ArgError> {
    let kind = Kind::from_code(kind).ok_or(ArgError::State(REQUEST))?;
    let ok =
        (1..=MAX_ID_LEN).contains(&id.len()) && reply <= MAX_TOKEN && expires_ms <= now_ms.saturating_add(2 * MAX_MS);
    ok.then_some(Record { kind, reply, expires_ms }).ok_or(ArgError::State(REQUEST))
}

/// `id kind reply expires-unix-ms` (FLOCK.ID).
pub fn request_args<'a>(args: &[&'a [u8]], now_ms: u64) -> Result<(&'a [u8], Record), ArgError> {
    let number = |word| state_number(word, REQUEST);
    match *args {
        [id, kind, reply, expires] => Ok((id, request(id, number(kind)?, number(reply)?, number(expires)?, now_ms)?)),
        _ => Err(ArgError::Arity),
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct StateArgs<'a> {
    pub owner: &'a [u8],
    pub holds: u32,
    pub token: u64,
    pub deadline_ms: u64,
    pub session: bool,
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

/// A plain decimal integer that fits in 64 bits.
fn parse_u64(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 20 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// Echoes an unknown option safely inside an error line: printable ASCII
/// only, because the crate sends each char of an error as one byte (`c as
/// u8`), so anything else would reach the client as invalid UTF-8, which
/// clients such as redis-rs cannot parse.
fn printable(option: &[u8]) -> String {
    option.iter().take(32).map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '?' }).collect()
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
        for lease in ["0", "-1", "1.5", "+5", " 5", "1099511627777", "18446744073709551616", "abc"] {
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
    fn a_member_no_command_could_have_made_is_refused() {
        let now = 1_700_000_000_000;
        let m = |args: &[&str]| {
            let owned: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            member(&owned, now).map(|(mode, m)| (mode, m.map(|(o, h)| (o.to_vec(), h.map(|h| h.permits)))))
        };
        assert_eq!(m(&["shared", "0"]), Ok((Mode::Lock, None)));
        assert_eq!(m(&["semaphore", "3", "o"]), Ok((Mode::Semaphore(3), Some((b"o".to_vec(), None)))));
        assert_eq!(
            m(&["semaphore", "3", "o", "1", "5", "0", "0", "3"]),
            Ok((Mode::Semaphore(3), Some((b"o".to_vec(), Some(3)))))
        );
        assert_eq!(m(&["shared", "0", "o", "1", "5", "0", "1", "0"]), Ok((Mode::Lock, Some((b"o".to_vec(), Some(0))))));
        assert_eq!(
            m(&["semaphore", "3", "o", "1", "5", "0", "0", "4"]),
            Err(ArgError::State(PERMITS)),
            "beyond the limit"
        );
        assert_eq!(m(&["semaphore", "3", "o", "1", "5", "0", "0", "0"]), Err(ArgError::State(PERMITS)));
        assert_eq!(m(&["shared", "0", "o", "1", "5", "0", "0", "1"]), Err(ArgError::State(PERMITS)));
        assert_eq!(m(&["shared", "1"]), Err(ArgError::State(MODE)));
        assert_eq!(m(&["semaphore", "0"]), Err(ArgError::State(MODE)));
        assert_eq!(m(&["semaphore", "4294967296"]), Err(ArgError::State(MODE)));
        assert_eq!(m(&["exclusive", "0"]), Err(ArgError::State(MODE)));
        assert_eq!(m(&["shared", "0", "o", "0", "5", "0", "0", "0"]), Err(ArgError::State(HOLDS)));
        assert_eq!(m(&["shared", "0", "o", "1"]), Err(ArgError::Arity));
        assert_eq!(m(&["shared"]), Err(ArgError::Arity));
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

    #[test]
    fn a_holder_no_command_could_make_is_refused_field_by_field() {
        let now = 1_700_000_000_000;
        let ok =
            |owner: &'static [u8], holds, token, deadline, session| holder(owner, holds, token, deadline, session, now);
        assert!(ok(b"o", 1, 1, 0, 0).is_ok());
        assert!(ok(b"o", u64::from(u32::MAX), MAX_TOKEN, now + 2 * MAX_MS, 1).is_ok());
        assert_eq!(ok(b"", 1, 1, 0, 0), Err(ArgError::State(OWNER)));
        assert_eq!(ok(&[b'x'; 257], 1, 1, 0, 0), Err(ArgError::State(OWNER)));
        assert_eq!(ok(b"o", 0, 1, 0, 0), Err(ArgError::State(HOLDS)));
        assert_eq!(ok(b"o", 1 << 32, 1, 0, 0), Err(ArgError::State(HOLDS)));
        assert_eq!(ok(b"o", 1, 0, 0, 0), Err(ArgError::State(TOKEN)));
        assert_eq!(ok(b"o", 1, MAX_TOKEN + 1, 0, 0), Err(ArgError::State(TOKEN)));
        assert_eq!(ok(b"o", 1, u64::MAX, 0, 0), Err(ArgError::State(TOKEN)));
        assert_eq!(ok(b"o", 1, 1, now + 2 * MAX_MS + 1, 0), Err(ArgError::State(DEADLINE)));
        assert_eq!(ok(b"o", 1, 1, 0, 2), Err(ArgError::State(SESSION)));
        assert_eq!(
            state(&[b"o", b"1", b"18446744073709551615", b"0", b"0"], now),
            Err(ArgError::State(TOKEN)),
            "FLOCK.STATE refuses a token beyond i64::MAX"
        );
        assert_eq!(state(&[b"o", b"1", b"-1", b"0", b"0"], now), Err(ArgError::State(TOKEN)));
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_arguments(args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..8)) {
            let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            // ASCII only: the crate sends error text char by char as bytes.
            let errors = [acquire(&refs).err(), release(&refs).err(), renew(&refs).err(), id_option(&refs).err()];
            for e in errors.into_iter().flatten() {
                prop_assert!(e.to_string().is_ascii(), "{e}");
            }
            let _ = request_args(&refs, 1_700_000_000_000);
            let _ = state(&refs, 1_700_000_000_000);
            let _ = member(&refs, 1_700_000_000_000);
        }
    }
}
