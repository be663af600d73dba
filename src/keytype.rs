//! The `flocklock` key type's callbacks: persistence (RDB, AOF rewrite and
//! the module's aux data), memory usage, and a key leaving its name. Every
//! lock is written and read as `record`'s words, as replication sends them.

use redis_module::native_types::RedisType;

use crate::clock;
use crate::engine;
use crate::errors;
use crate::ffi::{self, Aof, Io, KeyType};
use crate::filter;
use crate::moves;
use crate::state::{self, Lease};
use crate::value::{with_args, LockValue, ENCODING_VERSION, HOLDER_COMMAND, ID_COMMAND, REMOTE_SESSION, TYPE_NAME};
use crate::waiters::WaitId;
use flock_core::clock::Now;
use flock_core::effects::End;
use flock_core::holders::{Mode, Terms};
use flock_core::limits::MAX_TOKEN;
use flock_core::lock::Lock;
use flock_core::record::{self, Field, HolderRecord, Shape, Word, Words};
use flock_core::wheel::LeaseWheel;

pub static FLOCK_TYPE: RedisType = RedisType::new(TYPE_NAME, ENCODING_VERSION, ffi::type_methods::<LockType>());

struct LockType;

/// An RDB stream as `record`'s words.
struct Rdb<'a>(&'a Io);

impl Words for Rdb<'_> {
    fn bytes(&mut self) -> Result<Box<[u8]>, Field> {
        self.0.load_bytes().map(|b| b.as_ref().into()).ok_or(Field::Length)
    }

    fn number(&mut self, _: Field) -> Result<u64, Field> {
        self.0.load_unsigned().ok_or(Field::Length)
    }
}

fn save_words(io: &Io, words: &[Word]) {
    for word in words {
        match *word {
            Word::Bytes(b) => io.save_bytes(b),
            Word::Number(n) => io.save_unsigned(n),
        }
    }
}

impl KeyType for LockType {
    type Value = LockValue;

    fn load(io: &Io, encver: i32) -> Option<LockValue> {
        match load_lock(&mut Rdb(io), encver, clock::now()) {
            Ok(mut value) => {
                let (db, key) = io.key();
                state::with(|s| {
                    for (holder, _) in value.lock.holders().iter() {
                        s.tokens.observe(holder.token);
                    }
                    let place = s.place(db, &key);
                    engine::file_leases_now(s, &mut value, &place);
                    engine::reclaim_requests(s, &place, &mut value);
                    // Saved from a key that only a queue kept (or, before
                    // this version, one kept by its request IDs alone).
                    if value.lock.is_idle() {
                        moves::remove_arrived_if_free(None, place);
                    }
                });
                Some(value)
            }
            Err(e) => {
                io.log_error(&format!("FLOCK cannot load a lock: {e}"));
                None
            }
        }
    }

    fn save(io: &Io, value: &LockValue) {
        let (lock, now) = (&value.lock, clock::now());
        save_words(io, &record::mode_words(lock.mode()));
        io.save_unsigned(lock.holders().len() as u64);
        for (holder, terms) in lock.holders().iter() {
            save_words(io, &record::holder_words(holder, terms.session.is_some(), terms.permits, now));
        }
        let requests = lock.requests();
        io.save_unsigned(requests.map_or(0, |r| r.len()) as u64);
        for (id, record) in requests.into_iter().flat_map(|r| r.iter()) {
            save_words(io, &record::request_words(id, record, now));
        }
    }

    fn rewrite_aof(aof: &Aof, value: &LockValue) {
        let (lock, now) = (&value.lock, clock::now());
        for (holder, terms) in lock.holders().iter() {
            let words = record::holder_set_words(lock.mode(), holder, terms.session.is_some(), terms.permits, now);
            with_args(&words, |args| aof.emit(HOLDER_COMMAND, args));
        }
        for (id, record) in lock.requests().into_iter().flat_map(|r| r.iter()) {
            with_args(&record::request_words(id, record, now), |args| aof.emit(ID_COMMAND, args));
        }
        // A semaphore kept only by its request IDs is still one.
        if lock.holders().is_empty() && lock.mode().limit().is_some() {
            with_args(&record::mode_words(lock.mode()), |args| aof.emit(HOLDER_COMMAND, args));
        }
    }

    fn mem_usage(value: &LockValue, key: &dyn Fn() -> (i32, Vec<u8>)) -> usize {
        let filed = value.lock.holders().iter().filter(|(h, _)| h.deadline_id.is_some()).count();
        // A filed lease is a wheel entry plus its place: the key name and 4 bytes.
        let lease = if filed > 0 { filed * (LeaseWheel::<Lease>::entry_size() + 4 + key().1.len()) } else { 0 };
        std::mem::size_of::<LockValue>() + value.lock.heap_size() + lease
    }

    /// A key that `MIGRATE` takes whole moves its grants to the other
    /// server; any other way out of here deletes them.
    fn unlink(value: &mut LockValue, db: i32, key: &[u8]) {
        let why = if filter::is_moving(key) { End::Moved } else { End::Deleted };
        moves::detach(value, db, key, why);
    }

    /// The highest token, then (from version 5) the request IDs of free
    /// locks: a count of locks, each as its db, its key and its records (a
    /// count, then each as `record::request_words`).
    fn aux_save(io: &Io) {
        let now = clock::now();
        state::with(|s| {
            io.save_unsigned(s.tokens.last());
            io.save_unsigned(s.remembered.len() as u64);
            for (place, requests) in s.remembered.iter() {
                io.save_unsigned(s.dbs.db(place.ident()) as u64);
                io.save_bytes(place.key());
                io.save_unsigned(requests.len() as u64);
                for (id, record) in requests.iter() {
                    save_words(io, &record::request_words(id, record, now));
                }
            }
        });
    }

    fn aux_load(io: &Io, encver: i32) -> bool {
        if !(1..=ENCODING_VERSION).contains(&encver) {
            io.log_error(&format!("FLOCK cannot load its module data (encoding version {encver})"));
            return false;
        }
        let loaded = load_aux(&mut Rdb(io), encver, clock::now());
        if let Err(e) = &loaded {
            io.log_error(&format!("FLOCK cannot load its module data: {e}"));
        }
        loaded.is_ok()
    }
}

/// Reads the aux data of encoding `encver` into the state, every field
/// checked as for a lock.
fn load_aux(words: &mut Rdb, encver: i32, now: Now) -> Result<(), String> {
    let last = words.number(Field::Length).map_err(errors::refused_load)?;
    if last > MAX_TOKEN {
        return Err(format!("a highest token of {last}: tokens are at most {MAX_TOKEN}"));
    }
    state::with(|s| s.tokens.observe(last));
    if encver < 5 {
        return Ok(());
    }
    let read = |words: &mut Rdb| -> Result<(), Field> {
        for _ in 0..words.number(Field::Length)? {
            let db = i32::try_from(words.number(Field::Length)?).map_err(|_| Field::Length)?;
            let key = words.bytes()?;
            let place = state::with(|s| s.place(db, &key));
            for _ in 0..words.number(Field::Length)? {
                let (id, record) = record::read_request(words, now)?;
                state::with(|s| s.remembered.record(place.clone(), &id, record));
            }
        }
        state::with(engine::wake_for_remembered);
        Ok(())
    };
    read(words).map_err(errors::refused_load)
}

/// Adds a loaded holder, refusing what no command could have made beside
/// the holders already there.
fn load_holder(lock: &mut Lock<WaitId>, mode: Mode, r: HolderRecord) -> Result<(), Field> {
    let holders = lock.holders();
    let taken = holders.get(r.holder.token).is_some() || holders.token_of(&r.holder.owner).is_some();
    if taken || (!holders.is_empty() && (mode == Mode::Exclusive || holders.mode() != mode)) {
        return Err(Field::Holders);
    }
    if mode.limit().is_some_and(|limit| holders.used() + u64::from(r.permits) > u64::from(limit)) {
        return Err(Field::Limit);
    }
    let terms = Terms { session: r.session.then_some(REMOTE_SESSION), permits: r.permits, ..Terms::default() };
    lock.restore(r.holder, terms, mode, &mut Vec::new());
    Ok(())
}

/// Makes the key what `mode` says (a semaphore stays one without holders).
fn load_kind(lock: &mut Lock<WaitId>, mode: Mode) -> Result<(), Field> {
    if !lock.holders().is_empty() && !lock.mode().same_key_kind(mode) {
        return Err(Field::Holders);
    }
    lock.restore_absent(None, mode, &mut Vec::new());
    Ok(())
}

fn load_holders(words: &mut Rdb, lock: &mut Lock<WaitId>, mode: Mode, shape: Shape, now: Now) -> Result<(), Field> {
    for _ in 0..words.number(Field::Length)? {
        let r = record::read_holder(words, mode, shape, now)?;
        load_holder(lock, mode, r)?;
    }
    Ok(())
}

fn load_requests(words: &mut Rdb, lock: &mut Lock<WaitId>, now: Now) -> Result<(), Field> {
    for _ in 0..words.number(Field::Length)? {
        let (id, record) = record::read_request(words, now)?;
        lock.restore_request(&id, record);
    }
    Ok(())
}

/// Reads one lock of encoding `encver`, every field checked against what a
/// command could have made: a crafted RESTORE payload or a corrupt file is
/// refused whole.
fn load_lock(words: &mut Rdb, encver: i32, now: Now) -> Result<LockValue, String> {
    let mut lock = Lock::default();
    let read = |words: &mut Rdb, lock: &mut Lock<WaitId>| -> Result<(), Field> {
        match encver {
            1 => {
                load_holder(lock, Mode::Exclusive, record::read_holder(words, Mode::Exclusive, Shape::Exclusive, now)?)
            }
            2 | 3 => {
                if words.number(Field::Length)? == 1 {
                    load_holder(
                        lock,
                        Mode::Exclusive,
                        record::read_holder(words, Mode::Exclusive, Shape::Exclusive, now)?,
                    )?;
                }
                load_requests(words, lock, now)?;
                if encver == 3 {
                    let limit = words.number(Field::Mode)?;
                    let mode = record::mode(if limit == 0 { b"shared" } else { b"semaphore" }, limit)?;
                    load_holders(words, lock, mode, Shape::Permits, now)?;
                    load_kind(lock, mode)?;
                }
                Ok(())
            }
            _ => {
                let mode = record::read_mode(words)?;
                let shape = if encver < 6 { Shape::Permits } else { Shape::Left };
                load_holders(words, lock, mode, shape, now)?;
                load_kind(lock, mode)?;
                load_requests(words, lock, now)
            }
        }
    };
    if !(1..=ENCODING_VERSION).contains(&encver) {
        return Err(format!("encoding version {encver} is unknown: this FLOCK knows 1 to {ENCODING_VERSION}"));
    }
    read(words, &mut lock).map_err(errors::refused_load)?;
    Ok(LockValue::new(lock))
}
