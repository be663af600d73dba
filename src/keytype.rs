//! The `flocklock` key type's callbacks: persistence (RDB, AOF rewrite and
//! the module's aux data), memory usage, and a key leaving its name.

use redis_module::native_types::RedisType;

use crate::args;
use crate::deadlines::Deadlines;
use crate::engine;
use crate::ffi::{self, Aof, Io, KeyType};
use crate::lock::{Holder, Lock, Member, Mode};
use crate::state::{self, Lease};
use crate::value::{
    member_numbers, mode_args, request_numbers, state_numbers, LockValue, ENCODING_VERSION, REMOTE_SESSION, TYPE_NAME,
};

pub static FLOCK_TYPE: RedisType = RedisType::new(TYPE_NAME, ENCODING_VERSION, ffi::type_methods::<LockType>());

struct LockType;

impl KeyType for LockType {
    type Value = LockValue;

    fn load(io: &Io, encver: i32) -> Option<LockValue> {
        match load_lock(io, encver, ffi::now_ms()) {
            Ok(mut value) => {
                let (db, key) = io.key();
                let place = state::with(|s| s.place(db, &key));
                engine::schedule_lease_now(&mut value, &place);
                Some(value)
            }
            Err(e) => {
                io.log_error(&format!("FLOCK cannot load a lock: {e}"));
                None
            }
        }
    }

    fn save(io: &Io, value: &LockValue) {
        let holder = value.lock.holder();
        io.save_unsigned(u64::from(holder.is_some()));
        if let Some(holder) = holder {
            io.save_bytes(&holder.owner);
            for n in state_numbers(holder, value.lock.session().is_some()) {
                io.save_unsigned(n as u64);
            }
        }
        let requests = value.lock.requests();
        io.save_unsigned(requests.map_or(0, |r| r.iter().count()) as u64);
        for (id, record) in requests.into_iter().flat_map(|r| r.iter()) {
            io.save_bytes(id);
            for n in request_numbers(record) {
                io.save_unsigned(n);
            }
        }
        let (_, limit) = mode_args(value.lock.mode());
        io.save_unsigned(u64::from(limit));
        io.save_unsigned(value.lock.member_count() as u64);
        for member in value.lock.members() {
            io.save_bytes(&member.holder.owner);
            for n in member_numbers(member) {
                io.save_unsigned(n);
            }
        }
    }

    fn rewrite_aof(aof: &Aof, value: &LockValue) {
        if let Some(holder) = value.lock.holder() {
            aof.emit(c"FLOCK.STATE", &holder.owner, &state_numbers(holder, value.lock.session().is_some()));
        }
        let (mode, limit) = mode_args(value.lock.mode());
        for member in value.lock.members() {
            let numbers = member_numbers(member).map(|n| n as i64);
            aof.emit_member(mode, i64::from(limit), &member.holder.owner, &numbers);
        }
        for (id, record) in value.lock.requests().into_iter().flat_map(|r| r.iter()) {
            aof.emit(c"FLOCK.ID", id, &request_numbers(record).map(|n| n as i64));
        }
        // A semaphore kept only by its request IDs is still one.
        if value.lock.holder_count() == 0 && limit > 0 {
            aof.emit_mode(mode, i64::from(limit));
        }
    }

    fn mem_usage(value: &LockValue, key: &dyn Fn() -> (i32, Vec<u8>)) -> usize {
        let filed = value.lock.holders().filter(|(h, _, _)| h.deadline_id.is_some()).count();
        // A filed lease is a wheel entry plus its place: the key name and 4 bytes.
        let lease = if filed > 0 { filed * (Deadlines::<Lease>::entry_size() + 4 + key().1.len()) } else { 0 };
        std::mem::size_of::<LockValue>() + value.lock.heap_size() + lease
    }

    fn unlink(value: &mut LockValue, db: i32, key: &[u8]) {
        engine::detach(value, db, key);
    }

    fn aux_save(io: &Io) {
        io.save_unsigned(state::with(|s| s.tokens.last()));
    }

    fn aux_load(io: &Io, encver: i32) -> bool {
        // The aux data (the highest token) is the same in every version.
        let known = (1..=ENCODING_VERSION).contains(&encver);
        match io.load_unsigned() {
            Some(last) if known && last <= args::MAX_TOKEN => {
                state::with(|s| s.tokens.observe(last));
                true
            }
            Some(last) if known => {
                io.log_error(&format!(
                    "FLOCK refuses a highest token of {last}: tokens are at most {}",
                    args::MAX_TOKEN
                ));
                false
            }
            _ => {
                io.log_error(&format!("FLOCK cannot load its module data (encoding version {encver})"));
                false
            }
        }
    }
}

/// Reads the mode and shared or semaphore holders of encoding version 3.
fn load_members(
    lock: &mut Lock<crate::ffi::BlockedId>,
    limit: u64,
    count: u64,
    bytes: impl Fn() -> Result<Vec<u8>, String>,
    number: impl Fn() -> Result<u64, String>,
    now: u64,
) -> Result<(), String> {
    let invalid = |e: args::ArgError| format!("no command could have made it: {e}");
    let mode = args::mode(limit == 0, limit).map_err(invalid)?;
    if count > 0 && lock.holder().is_some() {
        return Err("no command could have made it: an exclusive holder together with shared ones".into());
    }
    let mut in_use = 0u64;
    for _ in 0..count {
        let owner = bytes()?;
        let h = args::holder(&owner, number()?, number()?, number()?, number()?, now).map_err(invalid)?;
        let permits = args::member_permits(mode, number()?).map_err(invalid)?;
        in_use += u64::from(permits);
        if lock.member(h.token).is_some() || lock.is_holder(h.owner) {
            return Err("no command could have made it: two holders with one token or one owner".into());
        }
        if let Mode::Semaphore(limit) = mode {
            if in_use > u64::from(limit) {
                return Err(format!("no command could have made it: more than the {limit} permits in use"));
            }
        }
        state::with(|s| s.tokens.observe(h.token));
        let holder = Holder::new(h.owner.into(), h.holds, h.token, h.deadline_ms);
        lock.set_member(Member { holder, session: h.session.then_some(REMOTE_SESSION), permits }, mode);
    }
    if mode != Mode::Lock {
        lock.set_mode(mode);
    }
    // Loading is not a change to follow: the caller files the leases.
    lock.take_changes();
    Ok(())
}

/// Reads one lock, checking every field against what a command could have
/// made: a crafted RESTORE payload or a corrupt file is refused whole.
fn load_lock(io: &Io, encver: i32, now: u64) -> Result<LockValue, String> {
    let short = || "the data ends early".to_string();
    let number = || io.load_unsigned().ok_or_else(short);
    let bytes = || io.load_bytes().ok_or_else(short);
    let has_holder = match encver {
        1 => true,
        2 | 3 => number()? == 1,
        _ => return Err(format!("encoding version {encver} is unknown: this FLOCK knows 1 to {ENCODING_VERSION}")),
    };
    let mut lock = Lock::default();
    if has_holder {
        let owner = bytes()?;
        let h = args::holder(owner.as_ref(), number()?, number()?, number()?, number()?, now)
            .map_err(|e| format!("no command could have made it: {e}"))?;
        state::with(|s| s.tokens.observe(h.token));
        // The connection a SESSION lock was bound to is not on this server;
        // the flag stays visible and the lease still bounds the lock.
        let holder = Holder::new(h.owner.into(), h.holds, h.token, h.deadline_ms);
        lock.set_holder(Some(holder), h.session.then_some(REMOTE_SESSION));
    }
    let records = if encver == 1 { 0 } else { number()? };
    for _ in 0..records {
        let id = bytes()?;
        let record = args::request(id.as_ref(), number()?, number()?, number()?, now)
            .map_err(|e| format!("no command could have made it: {e}"))?;
        lock.restore_request(id.as_ref(), record);
    }
    if encver >= 3 {
        load_members(&mut lock, number()?, number()?, || bytes().map(|b| b.as_ref().to_vec()), number, now)?;
    }
    Ok(LockValue::new(lock))
}
