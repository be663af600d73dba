//! Sessions: one connection per client process that reads, with
//! `FLOCK.INBOX`, the outcomes of the waits it sent from any connection
//! (`ACQUIRE ... INBOX session-id`) and the losses of the grants it holds.
//! A session lives while it is heard from: each FLOCK command on its
//! connection renews it for its timeout, on the monotonic clock.
//!
//! A session is its connection's state, named by the connection's client id;
//! its random ID is what other connections name it by. Events wait in its
//! inbox until its connection reads them; the one blocked read, if any, is
//! unblocked the moment an event arrives, so a grant or a loss reaches the
//! process in the event-loop turn that made it (docs/internals.md,
//! "Sessions", says why this and not pub/sub or RESP3 pushes).

use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{HashMap, VecDeque};

use crate::config;
use crate::ffi::{BlockedClient, BlockedId};
use crate::place::Place;
use crate::timers::{self, Timer};
use flock_core::args::SESSION_ID_LEN;
use flock_core::effects::{Leave, Loss};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Granted,
    TimedOut,
    Cancelled,
    Error(Leave),
    Lost(Loss),
}

/// One event of an inbox: `kind key owner token detail` to the reader.
#[derive(Debug)]
pub struct Event {
    pub kind: Kind,
    pub place: Place,
    pub owner: Box<[u8]>,
    pub token: u64,
    /// A grant's lease end (unix ms), told as the lease left when the event
    /// is read; `None` for a grant that lives with its session, and for
    /// every other kind.
    pub until_ms: Option<u64>,
}

/// What a blocked `FLOCK.INBOX` is answered with.
pub struct Batch {
    pub events: Vec<Event>,
    /// Set once the reply is written: grants in a batch that never reached
    /// its reader pass on.
    pub delivered: bool,
    pub client: u64,
}

/// The blocked `FLOCK.INBOX` of a session, with its timeout.
struct Reader {
    bc: BlockedClient<Batch>,
    timer: Option<Timer>,
}

pub struct Session {
    pub id: [u8; SESSION_ID_LEN],
    pub inbox: VecDeque<Event>,
    reader: Option<Reader>,
    /// Its waits, each named in `Waiters`.
    pub waits: FxHashSet<u64>,
    /// The tokens of the grants it watches.
    watched: FxHashSet<u64>,
    /// Its own timeout (`FLOCK.SESSION TIMEOUT ms`); `None`: the module's
    /// `session-timeout-ms` at each renewal.
    timeout_ms: Option<u64>,
    /// Monotonic µs by which it must be heard from again.
    deadline_us: u64,
    /// The timer that looks whether it is due (`inbox::on_expiry`), and
    /// the monotonic µs it is set for.
    expiry: Option<Timer>,
    expiry_us: u64,
}

impl Session {
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or_else(config::session_timeout_ms)
    }
}

/// What `Sessions::open` answers.
pub struct Opened {
    pub id: [u8; SESSION_ID_LEN],
    pub timeout_ms: u64,
    /// Its expiry timer must be set.
    pub arm: bool,
}

/// A grant a session watches, with what its `lost` event names.
struct Watch {
    client: u64,
    place: Place,
    owner: Box<[u8]>,
    /// A reply told its holder of it (its acquire's, a reentry's, a
    /// resend's): a `granted` event of it in an inbox says nothing new.
    told: bool,
}

/// Whether `event`, in the inbox of `client`'s session, is still news: not
/// a grant that a reply told of since, on this session or another.
fn untold(watchers: &FxHashMap<u64, Watch>, client: u64, event: &Event) -> bool {
    event.kind != Kind::Granted || !watchers.get(&event.token).is_some_and(|w| w.told || w.client != client)
}

/// What a read of `client`'s session takes out of its `inbox`: every event
/// still news.
fn drain_untold(inbox: &mut VecDeque<Event>, watchers: &FxHashMap<u64, Watch>, client: u64) -> Vec<Event> {
    inbox.drain(..).filter(|e| untold(watchers, client, e)).collect()
}

#[derive(Default)]
pub struct Sessions {
    /// By the client id of the session's connection.
    open: FxHashMap<u64, Session>,
    by_id: HashMap<[u8; SESSION_ID_LEN], u64>,
    watchers: FxHashMap<u64, Watch>,
    /// The connection of each blocked reader, so that its callbacks find it
    /// in O(1) whatever the number of sessions.
    readers: FxHashMap<BlockedId, u64>,
    /// Readers unblocked whose reply is not written yet.
    answered: FxHashSet<u64>,
}

impl Sessions {
    /// The session of connection `client`, opened now if it has none, with
    /// `timeout_ms` as its timeout if given, and that timeout kept from now
    /// on if `pin` (a later `session-timeout-ms` does not change it). It is
    /// heard from now. Its ID and timeout, and true if its timer must be
    /// set (it is new, or its timeout was cut).
    pub fn open(&mut self, client: u64, timeout_ms: Option<u64>, pin: bool, now_us: u64) -> Opened {
        let new = !self.open.contains_key(&client);
        if new {
            let id = loop {
                let id = random_id();
                if !self.by_id.contains_key(&id) {
                    break id;
                }
            };
            self.by_id.insert(id, client);
            let session = Session {
                id,
                inbox: VecDeque::new(),
                reader: None,
                waits: FxHashSet::default(),
                watched: FxHashSet::default(),
                timeout_ms: None,
                deadline_us: 0,
                expiry: None,
                expiry_us: 0,
            };
            self.open.insert(client, session);
        }
        let session = self.open.get_mut(&client).expect("opened above");
        session.timeout_ms = timeout_ms.or(session.timeout_ms);
        if pin {
            session.timeout_ms = Some(session.timeout_ms());
        }
        let (id, timeout_ms) = (session.id, session.timeout_ms());
        let cut = self.heard(client, now_us);
        Opened { id, timeout_ms, arm: new || cut }
    }

    /// `client`'s session (if it has one) was heard from: it lives for its
    /// timeout from `now_us`. True if that is before its timer fires (its
    /// timeout was cut): the caller sets the timer again.
    pub fn heard(&mut self, client: u64, now_us: u64) -> bool {
        let Some(session) = self.open.get_mut(&client) else { return false };
        session.deadline_us = now_us.saturating_add(session.timeout_ms().saturating_mul(1000));
        session.deadline_us < session.expiry_us
    }

    /// How long `client`'s session lives from `now_us` unless heard from
    /// again: `Some(0)` once it is due, `None` if it has none.
    pub fn left_us(&self, client: u64, now_us: u64) -> Option<u64> {
        self.open.get(&client).map(|s| s.deadline_us.saturating_sub(now_us))
    }

    pub fn get(&self, client: u64) -> Option<&Session> {
        self.open.get(&client)
    }

    /// The timer that looks whether `client`'s session is due, set for
    /// `at_us`, in place of the one it had.
    pub fn set_expiry(&mut self, client: u64, timer: Timer, at_us: u64) {
        let Some(session) = self.open.get_mut(&client) else {
            timers::stop_timer(timer);
            return;
        };
        if let Some(old) = session.expiry.replace(timer) {
            timers::stop_timer(old);
        }
        session.expiry_us = at_us;
    }

    /// The connection of the session named `id`.
    pub fn client_of(&self, id: &[u8]) -> Option<u64> {
        self.by_id.get(id).copied()
    }

    pub fn has(&self, client: u64) -> bool {
        self.open.contains_key(&client)
    }

    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    pub fn add_wait(&mut self, client: u64, wait: u64) {
        if let Some(session) = self.open.get_mut(&client) {
            session.waits.insert(wait);
        }
    }

    /// A wait of `client`'s session ended without an event.
    pub fn drop_wait(&mut self, client: u64, wait: u64) {
        if let Some(session) = self.open.get_mut(&client) {
            session.waits.remove(&wait);
        }
    }

    /// Files `event` in the inbox of `client`'s session (if it is still
    /// open), ending the wait it answers, and wakes its reader.
    pub fn push(&mut self, client: u64, wait: Option<u64>, event: Event) {
        let Some(session) = self.open.get_mut(&client) else { return };
        if let Some(wait) = wait {
            session.waits.remove(&wait);
        }
        session.inbox.push_back(event);
        if let Some(reader) = session.reader.take() {
            let events = drain_untold(&mut session.inbox, &self.watchers, client);
            self.answer(client, reader, events);
        }
    }

    /// The events waiting in `client`'s inbox, taken out; `None` if there is
    /// no session or nothing waits.
    pub fn take(&mut self, client: u64) -> Option<Vec<Event>> {
        let session = self.open.get_mut(&client)?;
        let events = drain_untold(&mut session.inbox, &self.watchers, client);
        (!events.is_empty()).then_some(events)
    }

    /// `client`'s `FLOCK.INBOX` blocks until an event comes or `timer` fires.
    pub fn block_reader(&mut self, client: u64, bc: BlockedClient<Batch>, timer: Option<Timer>) {
        if let Some(session) = self.open.get_mut(&client) {
            self.readers.insert(bc.id(), client);
            session.reader = Some(Reader { bc, timer });
        }
    }

    /// Ends the blocked read of `client` with nothing (its timeout), if it
    /// still blocks.
    pub fn end_read(&mut self, client: u64) {
        if let Some(reader) = self.open.get_mut(&client).and_then(|s| s.reader.take()) {
            self.answer(client, reader, Vec::new());
        }
    }

    /// The blocked client `bc` went (closed, CLIENT UNBLOCK, demotion): if
    /// it is a session's reader, its read ends with nothing; the events stay
    /// for the next read.
    pub fn reader_gone(&mut self, bc: BlockedId) {
        if let Some(&client) = self.readers.get(&bc) {
            self.end_read(client);
        }
    }

    fn answer(&mut self, client: u64, reader: Reader, events: Vec<Event>) {
        self.readers.remove(&reader.bc.id());
        if let Some(timer) = reader.timer {
            timers::stop_timer(timer);
        }
        self.answered.insert(client);
        reader.bc.unblock(Batch { events, delivered: false, client });
    }

    /// True while `client`'s read was answered and the reply is not written.
    pub fn is_answered(&self, client: u64) -> bool {
        self.answered.contains(&client)
    }

    pub fn answer_done(&mut self, client: u64) {
        self.answered.remove(&client);
    }

    /// `client`'s session watches the grant with `token` (in place of any
    /// session that watched it before); `told`: a reply tells of it.
    pub fn watch(&mut self, client: u64, token: u64, place: &Place, owner: &[u8], told: bool) {
        self.unwatch(token);
        if let Some(session) = self.open.get_mut(&client) {
            session.watched.insert(token);
            self.watchers.insert(token, Watch { client, place: place.clone(), owner: owner.into(), told });
        }
    }

    /// A reply to a resend of its acquire tells of the grant with `token`:
    /// the resend's session (`inbox`) watches it from now on; without one,
    /// the session that watches it keeps it, told.
    pub fn told(&mut self, inbox: Option<u64>, token: u64, place: &Place, owner: &[u8]) {
        match inbox {
            Some(client) => self.watch(client, token, place, owner, true),
            None => {
                if let Some(watch) = self.watchers.get_mut(&token) {
                    watch.told = true;
                }
            }
        }
    }

    /// The grants among `events` (a read of `client`'s session that never
    /// reached it) that no reply told of either: they pass on.
    pub fn untold_grants(&self, client: u64, events: Vec<Event>) -> Vec<(Place, u64)> {
        events
            .into_iter()
            .filter(|e| e.kind == Kind::Granted && untold(&self.watchers, client, e))
            .map(|e| (e.place, e.token))
            .collect()
    }

    /// The grant with `token` ended: nobody watches it any more, and if the
    /// server ended it (`loss`), its session hears why.
    pub fn ended(&mut self, token: u64, loss: Option<Loss>) {
        let Some(watch) = self.unwatch(token) else { return };
        if let Some(loss) = loss {
            let event = Event { kind: Kind::Lost(loss), place: watch.place, owner: watch.owner, token, until_ms: None };
            self.push(watch.client, None, event);
        }
    }

    fn unwatch(&mut self, token: u64) -> Option<Watch> {
        let watch = self.watchers.remove(&token)?;
        if let Some(session) = self.open.get_mut(&watch.client) {
            session.watched.remove(&token);
        }
        Some(watch)
    }

    /// The tokens of every watched grant whose lock is in a database
    /// identity `matches` accepts.
    pub fn watched_in(&self, matches: impl Fn(u32) -> bool) -> Vec<u64> {
        self.watchers.iter().filter(|(_, w)| matches(w.place.ident())).map(|(&t, _)| t).collect()
    }

    /// Closes `client`'s session: it watches nothing any more and its reader
    /// (if it still blocks) is answered with nothing. The caller ends what
    /// is left: its waits and the grants in its inbox.
    pub fn close(&mut self, client: u64) -> Option<Session> {
        let mut session = self.open.remove(&client)?;
        self.by_id.remove(&session.id);
        let watchers = &self.watchers;
        session.inbox.retain(|e| untold(watchers, client, e));
        if let Some(timer) = session.expiry.take() {
            timers::stop_timer(timer);
        }
        for token in session.watched.drain() {
            self.watchers.remove(&token);
        }
        if let Some(reader) = session.reader.take() {
            self.answer(client, reader, Vec::new());
        }
        Some(session)
    }
}

/// 128 random bits as 32 lowercase hex digits: an ID that cannot be derived
/// from another one, so only those a session's process gave it name it.
fn random_id() -> [u8; SESSION_ID_LEN] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits: u128 = rand::random();
    let mut id = [0; SESSION_ID_LEN];
    for (i, digit) in id.iter_mut().enumerate() {
        *digit = HEX[((bits >> (4 * i)) & 0xf) as usize];
    }
    id
}
