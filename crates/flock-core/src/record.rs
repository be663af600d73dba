//! The one format of everything FLOCK persists and replicates: a key's
//! mode, a holder, a remembered request, each as a fixed row of words
//! (byte strings and numbers). The RDB stores the words in order, the AOF
//! rewrite and replication send them as a command's arguments; decoding
//! checks every field against what a command could have made, so a crafted
//! RESTORE payload, a corrupt file or a forged command is refused whole,
//! never stored with a number that would wrap. Deadlines travel as unix
//! milliseconds, converted from and to the lease clock by `Now` (`clock`).

use crate::clock::Now;
use crate::holders::{Holder, Mode};
use crate::limits::{MAX_ID_LEN, MAX_MS, MAX_OWNER_LEN, MAX_TOKEN};
use crate::requests::{Kind, Record};

/// One word of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Word<'a> {
    Bytes(&'a [u8]),
    Number(u64),
}

/// The field a record was refused for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Owner,
    Holds,
    Token,
    Deadline,
    Session,
    Mode,
    Permits,
    Request,
    /// An RDB ended early, or a command has too few or too many words.
    Length,
    /// Two holders with one token or one owner, or an exclusive holder
    /// beside others.
    Holders,
    /// More permits in use than the semaphore's limit.
    Limit,
}

/// Where a record's words come from: an RDB stream, or a command's
/// arguments (numbers in decimal).
pub trait Words {
    fn bytes(&mut self) -> Result<Box<[u8]>, Field>;
    fn number(&mut self, field: Field) -> Result<u64, Field>;
}

/// A command's arguments as words.
pub struct Args<'a, 'b>(pub std::slice::Iter<'a, &'b [u8]>);

impl Words for Args<'_, '_> {
    fn bytes(&mut self) -> Result<Box<[u8]>, Field> {
        self.0.next().map(|b| (*b).into()).ok_or(Field::Length)
    }

    fn number(&mut self, field: Field) -> Result<u64, Field> {
        parse_u64(self.0.next().ok_or(Field::Length)?).ok_or(field)
    }
}

/// A plain decimal integer that fits in 64 bits: no sign, no spaces.
pub fn parse_u64(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 20 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

fn check(ok: bool, field: Field) -> Result<(), Field> {
    if ok {
        Ok(())
    } else {
        Err(field)
    }
}

/// The words of a key's mode: `exclusive 0`, `shared 0` or `semaphore m`.
pub fn mode_words(mode: Mode) -> [Word<'static>; 2] {
    let (word, limit): (&[u8], u32) = match mode {
        Mode::Exclusive => (b"exclusive", 0),
        Mode::Shared => (b"shared", 0),
        Mode::Semaphore(limit) => (b"semaphore", limit),
    };
    [Word::Bytes(word), Word::Number(u64::from(limit))]
}

pub fn read_mode(words: &mut impl Words) -> Result<Mode, Field> {
    let word = words.bytes()?;
    let limit = words.number(Field::Mode)?;
    mode(&word, limit)
}

/// A mode word and limit; the words are case-insensitive, as commands'.
pub fn mode(word: &[u8], limit: u64) -> Result<Mode, Field> {
    let limit = u32::try_from(limit).map_err(|_| Field::Mode)?;
    match () {
        _ if word.eq_ignore_ascii_case(b"exclusive") && limit == 0 => Ok(Mode::Exclusive),
        _ if word.eq_ignore_ascii_case(b"shared") && limit == 0 => Ok(Mode::Shared),
        _ if word.eq_ignore_ascii_case(b"semaphore") && limit > 0 => Ok(Mode::Semaphore(limit)),
        _ => Err(Field::Mode),
    }
}

/// A holder as it is persisted and replicated; `session` is the flag only:
/// the connection is not on the server that reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderRecord {
    pub holder: Holder,
    pub session: bool,
    pub permits: u32,
}

/// Which trailing words a holder record has: each encoding that added one
/// is still read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Shape {
    /// `owner holds token deadline-unix-ms session`: an exclusive holder
    /// (RDB encodings 1 and 2, FLOCK.STATE).
    Exclusive,
    /// Then `permits` (RDB encodings 3 to 5, FLOCK.HOLDER of 8 words).
    Permits,
    /// Then `left-ms`, what the lease had left when it was written (RDB
    /// encoding 6, FLOCK.HOLDER of 9 words): the most it has when read.
    Left,
}

/// `owner holds token deadline-unix-ms session permits left-ms`, the
/// deadline as the unix time it falls on `now`.
pub fn holder_words(holder: &Holder, session: bool, permits: u32, now: Now) -> [Word<'_>; 7] {
    [
        Word::Bytes(&holder.owner),
        Word::Number(u64::from(holder.holds)),
        Word::Number(holder.token),
        Word::Number(now.to_wall(holder.deadline_ms)),
        Word::Number(u64::from(session)),
        Word::Number(u64::from(permits)),
        Word::Number(now.left(holder.deadline_ms)),
    ]
}

/// The words after the key of `FLOCK.HOLDER` that set a holder in `mode`:
/// `mode_words`, then `holder_words`.
pub fn holder_set_words(mode: Mode, holder: &Holder, session: bool, permits: u32, now: Now) -> [Word<'_>; 9] {
    let [m, l] = mode_words(mode);
    let [o, h, t, d, s, p, left] = holder_words(holder, session, permits, now);
    [m, l, o, h, t, d, s, p, left]
}

/// Reads `holder_words` of a holder in `mode`, of a record of `shape`
/// (without permits, it holds none), its deadline put on the lease clock
/// of `now`. Deadlines get 2^40 ms of slack beyond the longest lease, for
/// clocks that differ between the server that wrote them and this one.
pub fn read_holder(words: &mut impl Words, mode: Mode, shape: Shape, now: Now) -> Result<HolderRecord, Field> {
    let now_ms = now.wall_ms;
    let owner = words.bytes()?;
    check(!owner.is_empty() && owner.len() <= MAX_OWNER_LEN, Field::Owner)?;
    let holds = u32::try_from(words.number(Field::Holds)?).ok().filter(|&h| h > 0).ok_or(Field::Holds)?;
    let token = words.number(Field::Token)?;
    check((1..=MAX_TOKEN).contains(&token), Field::Token)?;
    let deadline_ms = words.number(Field::Deadline)?;
    check(deadline_ms <= now_ms.saturating_add(2 * MAX_MS), Field::Deadline)?;
    let session = words.number(Field::Session)?;
    check(session <= 1, Field::Session)?;
    let permits = if shape >= Shape::Permits { words.number(Field::Permits)? } else { 0 };
    let left_ms = if shape >= Shape::Left { words.number(Field::Deadline)? } else { u64::MAX };
    let permits_fit = match mode {
        Mode::Exclusive | Mode::Shared => permits == 0,
        Mode::Semaphore(limit) => (1..=u64::from(limit)).contains(&permits),
    };
    check(permits_fit, Field::Permits)?;
    let holder = Holder::new(owner, holds, token, now.from_wall(deadline_ms, left_ms));
    Ok(HolderRecord { holder, session: session == 1, permits: permits as u32 })
}

/// `request-id command reply expires-unix-ms`.
pub fn request_words<'a>(id: &'a [u8], record: Record, now: Now) -> [Word<'a>; 4] {
    let expires = Word::Number(now.to_wall(record.expires_ms));
    [Word::Bytes(id), Word::Number(record.kind.code()), Word::Number(record.reply), expires]
}

pub fn read_request(words: &mut impl Words, now: Now) -> Result<Request, Field> {
    let now_ms = now.wall_ms;
    let id = words.bytes()?;
    let kind = Kind::from_code(words.number(Field::Request)?).ok_or(Field::Request)?;
    let reply = words.number(Field::Request)?;
    let expires_ms = words.number(Field::Request)?;
    let ok =
        (1..=MAX_ID_LEN).contains(&id.len()) && reply <= MAX_TOKEN && expires_ms <= now_ms.saturating_add(2 * MAX_MS);
    check(ok, Field::Request)?;
    Ok((id, Record { kind, reply, expires_ms: now.from_wall(expires_ms, u64::MAX) }))
}

/// What one `FLOCK.HOLDER` sets: the key's mode, and one owner's grant or
/// that it holds nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum Set {
    Kind(Mode),
    Absent(Mode, Box<[u8]>),
    Holder(Mode, HolderRecord),
    /// `FLOCK.STATE key` of AOFs written before FLOCK.HOLDER carried every
    /// holder: nobody holds the key exclusively.
    Vacant,
}

/// The word that starts a request ID riding on a `FLOCK.HOLDER` or a
/// `FLOCK.FREE`.
pub const REQUEST_MARK: &[u8] = b"ID";

/// A remembered request ID: `request-id command reply expires-unix-ms`.
pub type Request = (Box<[u8]>, Record);

/// `FLOCK.HOLDER key mode limit [owner [holds token deadline-unix-ms
/// session permits [left-ms]]] [ID request-id command reply expires-unix-ms]`: what
/// it sets, and the request ID it carries (one command where a `FLOCK.ID`
/// and a `FLOCK.HOLDER` would cost the server a propagation each). The
/// mark cannot be mistaken for a field: where it stands, a holder record
/// has its hold count, a number.
pub fn holder_command(args: &[&[u8]], now: Now) -> Result<(Set, Option<Request>), Field> {
    let (state, request) = riding(args, now)?;
    Ok((holder_set(state, now)?, request))
}

/// `FLOCK.FREE key [ID request-id command reply expires-unix-ms]`: the lock
/// was left free (its key goes, as with DEL), after the request ID it
/// carries.
pub fn free_command(args: &[&[u8]], now: Now) -> Result<Option<Request>, Field> {
    match riding(args, now)? {
        ([], request) => Ok(request),
        _ => Err(Field::Length),
    }
}

/// A command's own words, and the request ID riding as its last five.
fn riding<'a, 'b>(args: &'a [&'b [u8]], now: Now) -> Result<(&'a [&'b [u8]], Option<Request>), Field> {
    match args.len().checked_sub(5) {
        Some(at) if args[at].eq_ignore_ascii_case(REQUEST_MARK) => {
            Ok((&args[..at], Some(read_request(&mut Args(args[at + 1..].iter()), now)?)))
        }
        _ => Ok((args, None)),
    }
}

fn holder_set(args: &[&[u8]], now: Now) -> Result<Set, Field> {
    let mut words = Args(args.iter());
    let mode = read_mode(&mut words)?;
    let set = match args.len() {
        2 => Set::Kind(mode),
        3 => {
            let owner = words.bytes()?;
            check(!owner.is_empty() && owner.len() <= MAX_OWNER_LEN, Field::Owner)?;
            Set::Absent(mode, owner)
        }
        8 => Set::Holder(mode, read_holder(&mut words, mode, Shape::Permits, now)?),
        9 => Set::Holder(mode, read_holder(&mut words, mode, Shape::Left, now)?),
        _ => return Err(Field::Length),
    };
    Ok(set)
}

/// `FLOCK.STATE key [owner holds token deadline-unix-ms session]`, as AOFs
/// written before FLOCK.HOLDER carried every holder have it.
pub fn state_command(args: &[&[u8]], now: Now) -> Result<Set, Field> {
    match args.len() {
        0 => Ok(Set::Vacant),
        5 => Ok(Set::Holder(
            Mode::Exclusive,
            read_holder(&mut Args(args.iter()), Mode::Exclusive, Shape::Exclusive, now)?,
        )),
        _ => Err(Field::Length),
    }
}

/// `FLOCK.ID key request-id command reply expires-unix-ms`.
pub fn request_command(args: &[&[u8]], now: Now) -> Result<Request, Field> {
    match args.len() {
        4 => read_request(&mut Args(args.iter()), now),
        _ => Err(Field::Length),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;
    const AT: Now = Now { lease_ms: NOW, wall_ms: NOW };

    fn args(words: &[&str]) -> Vec<&'static [u8]> {
        words.iter().map(|w| &*Box::leak(w.as_bytes().to_vec().into_boxed_slice())).collect()
    }

    fn holder(words: &[&str], mode: Mode) -> Result<HolderRecord, Field> {
        let words = args(words);
        read_holder(&mut Args(words.iter()), mode, Shape::Permits, AT)
    }

    /// Encodes words as a command would carry them.
    fn text(words: &[Word]) -> Vec<Vec<u8>> {
        words
            .iter()
            .map(|w| match w {
                Word::Bytes(b) => b.to_vec(),
                Word::Number(n) => n.to_string().into_bytes(),
            })
            .collect()
    }

    #[test]
    fn every_record_reads_back_as_it_was_written() {
        let h = Holder::new(b"o".as_slice().into(), 3, 42, NOW + 5);
        let words = text(&holder_words(&h, true, 2, AT));
        let refs: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
        let read = read_holder(&mut Args(refs.iter()), Mode::Semaphore(2), Shape::Left, AT).unwrap();
        assert_eq!(read, HolderRecord { holder: h.clone(), session: true, permits: 2 });
        let words = text(&holder_set_words(Mode::Semaphore(2), &h, true, 2, AT));
        let refs: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
        let set = Set::Holder(Mode::Semaphore(2), HolderRecord { holder: h.clone(), session: true, permits: 2 });
        assert_eq!(holder_command(&refs, AT), Ok((set, None)));
        for m in [Mode::Exclusive, Mode::Shared, Mode::Semaphore(7)] {
            let words = text(&mode_words(m));
            let refs: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
            assert_eq!(read_mode(&mut Args(refs.iter())), Ok(m));
        }
        let r = Record { kind: Kind::Renew, reply: 9, expires_ms: NOW };
        let words = text(&request_words(b"id", r, AT));
        let refs: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
        assert_eq!(read_request(&mut Args(refs.iter()), AT), Ok((b"id".as_slice().into(), r)));
        // A request ID riding on each shape of FLOCK.HOLDER.
        for state in [text(&holder_set_words(Mode::Exclusive, &h, false, 0, AT)), text(&mode_words(Mode::Shared)), {
            let mut absent = text(&mode_words(Mode::Shared));
            absent.push(REQUEST_MARK.to_vec());
            absent
        }] {
            let mut words = state.clone();
            words.push(REQUEST_MARK.to_vec());
            words.extend(text(&request_words(b"id", r, AT)));
            let refs: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
            let alone: Vec<&[u8]> = state.iter().map(Vec::as_slice).collect();
            let set = holder_command(&alone, AT).unwrap().0;
            assert_eq!(holder_command(&refs, AT), Ok((set, Some((b"id".as_slice().into(), r)))));
        }
    }

    #[test]
    fn a_holder_no_command_could_make_is_refused_field_by_field() {
        let max = u32::MAX.to_string();
        let deadline = (NOW + 2 * MAX_MS).to_string();
        assert!(holder(&["o", &max, "9223372036854775807", &deadline, "1", "0"], Mode::Exclusive).is_ok());
        assert_eq!(holder(&["", "1", "1", "0", "0", "0"], Mode::Exclusive), Err(Field::Owner));
        assert_eq!(holder(&[&"x".repeat(257), "1", "1", "0", "0", "0"], Mode::Exclusive), Err(Field::Owner));
        assert_eq!(holder(&["o", "0", "1", "0", "0", "0"], Mode::Exclusive), Err(Field::Holds));
        assert_eq!(holder(&["o", "4294967296", "1", "0", "0", "0"], Mode::Exclusive), Err(Field::Holds));
        assert_eq!(holder(&["o", "1", "0", "0", "0", "0"], Mode::Exclusive), Err(Field::Token));
        assert_eq!(holder(&["o", "1", "9223372036854775808", "0", "0", "0"], Mode::Exclusive), Err(Field::Token));
        assert_eq!(holder(&["o", "1", "-1", "0", "0", "0"], Mode::Exclusive), Err(Field::Token));
        let late = (NOW + 2 * MAX_MS + 1).to_string();
        assert_eq!(holder(&["o", "1", "1", &late, "0", "0"], Mode::Exclusive), Err(Field::Deadline));
        assert_eq!(holder(&["o", "1", "1", "0", "2", "0"], Mode::Exclusive), Err(Field::Session));
        assert_eq!(holder(&["o", "1", "1", "0", "0", "1"], Mode::Shared), Err(Field::Permits));
        assert_eq!(holder(&["o", "1", "1", "0", "0", "4"], Mode::Semaphore(3)), Err(Field::Permits));
        assert_eq!(holder(&["o", "1", "1", "0", "0", "0"], Mode::Semaphore(3)), Err(Field::Permits));
        assert_eq!(holder(&["o", "1", "1"], Mode::Exclusive), Err(Field::Length));
    }

    #[test]
    fn modes_and_requests_are_checked() {
        assert_eq!(mode(b"SHARED", 0), Ok(Mode::Shared));
        assert_eq!(mode(b"shared", 1), Err(Field::Mode));
        assert_eq!(mode(b"semaphore", 0), Err(Field::Mode));
        assert_eq!(mode(b"semaphore", 1 << 32), Err(Field::Mode));
        assert_eq!(mode(b"other", 0), Err(Field::Mode));
        let request = |w: &[&str]| read_request(&mut Args(args(w).iter()), AT);
        assert!(request(&["i", "3", "9223372036854775807", "0"]).is_ok());
        assert_eq!(request(&["i", "4", "0", "0"]), Err(Field::Request), "no such command");
        assert_eq!(request(&["", "0", "0", "0"]), Err(Field::Request));
        assert_eq!(request(&[&"i".repeat(65), "0", "0", "0"]), Err(Field::Request));
    }

    #[test]
    fn the_internal_commands_take_their_shapes_only() {
        let cmd = |w: &[&str]| holder_command(&args(w), AT);
        assert_eq!(cmd(&["semaphore", "3"]), Ok((Set::Kind(Mode::Semaphore(3)), None)));
        assert_eq!(cmd(&["shared", "0", "o"]), Ok((Set::Absent(Mode::Shared, b"o".as_slice().into()), None)));
        assert!(matches!(
            cmd(&["exclusive", "0", "o", "1", "5", "0", "1", "0"]),
            Ok((Set::Holder(Mode::Exclusive, _), None))
        ));
        assert_eq!(cmd(&["shared", "0", "o", "1"]), Err(Field::Length));
        assert_eq!(cmd(&["shared"]), Err(Field::Length));
        // A request ID rides only as the last five words, and is checked as FLOCK.ID's.
        assert_eq!(cmd(&["shared", "0", "o", "ID", "i", "0", "1"]), Err(Field::Length));
        assert_eq!(cmd(&["shared", "0", "o", "ID", "i", "9", "1", "0"]), Err(Field::Request));
        assert_eq!(cmd(&["shared", "0", "o", "1", "ID", "i", "0", "1", "0"]), Err(Field::Length));
        let r = Record { kind: Kind::Release, reply: 1, expires_ms: NOW };
        assert_eq!(free_command(&[], AT), Ok(None));
        assert_eq!(
            free_command(&args(&["ID", "i", "1", "1", &NOW.to_string()]), AT),
            Ok(Some((b"i".as_slice().into(), r)))
        );
        assert_eq!(free_command(&args(&["o", "ID", "i", "1", "1", "0"]), AT), Err(Field::Length));
        assert_eq!(free_command(&args(&["ID", "i", "1", "1"]), AT), Err(Field::Length));
        assert_eq!(state_command(&[], AT), Ok(Set::Vacant));
        assert!(matches!(state_command(&args(&["o", "1", "5", "0", "0"]), AT), Ok(Set::Holder(Mode::Exclusive, _))));
        assert_eq!(state_command(&args(&["o", "1", "18446744073709551615", "0", "0"]), AT), Err(Field::Token));
        assert_eq!(request_command(&args(&["i", "0", "1"]), AT), Err(Field::Length));
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_arbitrary_words(words in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300), 0..8)) {
            let refs: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
            let _ = read_mode(&mut Args(refs.iter()));
            let _ = read_holder(&mut Args(refs.iter()), Mode::Semaphore(3), Shape::Left, AT);
            let _ = read_request(&mut Args(refs.iter()), AT);
            let _ = holder_command(&refs, AT);
            let _ = free_command(&refs, AT);
            let _ = state_command(&refs, AT);
            let _ = request_command(&refs, AT);
        }
    }
}
