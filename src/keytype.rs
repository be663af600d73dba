//! The `flocklock` key type's callbacks: persistence (RDB, AOF rewrite and
//! the module's aux data), memory usage, and a key leaving its name.

use redis_module::native_types::RedisType;

use crate::args;
use crate::deadlines::Deadlines;
use crate::engine;
use crate::ffi::{self, Aof, Io, KeyType};
use crate::lock::{Holder, Lock};
use crate::state::{self, Lease};
use crate::value::{request_numbers, state_numbers, LockValue, ENCODING_VERSION, REMOTE_SESSION, TYPE_NAME};

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
    }

    fn rewrite_aof(aof: &Aof, value: &LockValue) {
        if let Some(holder) = value.lock.holder() {
            aof.emit(c"FLOCK.STATE", &holder.owner, &state_numbers(holder, value.lock.session().is_some()));
        }
        for (id, record) in value.lock.requests().into_iter().flat_map(|r| r.iter()) {
            aof.emit(c"FLOCK.ID", id, &request_numbers(record).map(|n| n as i64));
        }
    }

    fn mem_usage(value: &LockValue, key: &dyn Fn() -> (i32, Vec<u8>)) -> usize {
        let filed = value.lock.holder().is_some_and(|h| h.deadline_id.is_some());
        // A filed lease is a wheel entry plus its place: the key name and 4 bytes.
        let lease = if filed { Deadlines::<Lease>::entry_size() + 4 + key().1.len() } else { 0 };
        std::mem::size_of::<LockValue>() + value.lock.heap_size() + lease
    }

    fn unlink(value: &mut LockValue, db: i32, key: &[u8]) {
        engine::detach(value, db, key);
    }

    fn aux_save(io: &Io) {
        io.save_unsigned(state::with(|s| s.tokens.last()));
    }

    fn aux_load(io: &Io, encver: i32) -> bool {
        match io.load_unsigned() {
            Some(last) if encver == ENCODING_VERSION && last <= args::MAX_TOKEN => {
                state::with(|s| s.tokens.observe(last));
                true
            }
            Some(last) if encver == ENCODING_VERSION => {
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

/// Reads one lock, checking every field against what a command could have
/// made: a crafted RESTORE payload or a corrupt file is refused whole.
fn load_lock(io: &Io, encver: i32, now: u64) -> Result<LockValue, String> {
    let short = || "the data ends early".to_string();
    let number = || io.load_unsigned().ok_or_else(short);
    let bytes = || io.load_bytes().ok_or_else(short);
    let has_holder = match encver {
        1 => true,
        2 => number()? == 1,
        _ => return Err(format!("encoding version {encver} is unknown: this FLOCK knows 1 and {ENCODING_VERSION}")),
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
    Ok(LockValue::new(lock))
}
