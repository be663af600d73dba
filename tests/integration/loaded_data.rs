//! Lock state that arrives from outside a command (RESTORE payloads, AOF
//! files) is held to what a command could have made: anything else is
//! refused whole, and tokens never wrap or go negative.

use crate::common::*;

use std::time::{SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_millis() as u64
}

const MAX_TOKEN: u64 = i64::MAX as u64;

/// A server that takes RESTORE payloads without a valid checksum, so tests
/// can write lock values field by field.
fn lenient_server() -> (Server, Connection) {
    let s = Server::start();
    let mut c = s.conn();
    let _: () = redis::cmd("DEBUG").arg("SET-SKIP-CHECKSUM-VALIDATION").arg(1).query(&mut c).unwrap();
    (s, c)
}

/// A lock value as DUMP writes it (type byte, module type id, fields as
/// module opcodes, EOF, RDB version, checksum), with the fields `body` writes.
fn dump_with(c: &mut Connection, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    acquire(c, "model", "m", 60_000).unwrap().unwrap();
    let real: Vec<u8> = redis::cmd("DUMP").arg("model").query(c).unwrap();
    force_release(c, "model").unwrap();
    // 0x07 (module value), then the 64-bit type id as an RDB length (0x81 +
    // 8 bytes), whose low 10 bits are the encoding version: set to 3 (a
    // holder flag, the holder, the request IDs, the limit and the shared
    // holders), the layout these tests write, which the module still reads.
    let mut out = real[..10].to_vec();
    let id = u64::from_be_bytes(real[2..10].try_into().unwrap());
    out[2..10].copy_from_slice(&((id & !0x3ff) | 3).to_be_bytes());
    body(&mut out);
    out.push(0x00); // EOF opcode
    out.extend(&real[real.len() - 10..]); // RDB version and a checksum that no longer matches
    out
}

fn number(out: &mut Vec<u8>, n: u64) {
    out.extend([0x02, 0x81]); // unsigned opcode, 64-bit length
    out.extend(n.to_be_bytes());
}

fn string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(0x05); // string opcode
    match bytes.len() {
        n if n < 64 => out.push(n as u8),
        n => out.extend([0x40 | (n >> 8) as u8, n as u8]),
    }
    out.extend(bytes);
}

/// An exclusive lock with the given holder.
fn crafted(c: &mut Connection, owner: &[u8], holder: [u64; 4]) -> Vec<u8> {
    dump_with(c, |out| {
        number(out, 1); // a holder follows
        string(out, owner);
        for n in holder {
            number(out, n);
        }
        number(out, 0); // no request IDs
        number(out, 0); // a lock (limit 0)
        number(out, 0); // no shared holders
    })
}

/// A key of `limit` (0: a lock) with these shared or semaphore holders:
/// owner, then holds, token, deadline, session, permits.
fn crafted_members(c: &mut Connection, limit: u64, members: &[(&[u8], [u64; 5])]) -> Vec<u8> {
    dump_with(c, |out| {
        number(out, 0); // no exclusive holder
        number(out, 0); // no request IDs
        number(out, limit);
        number(out, members.len() as u64);
        for (owner, numbers) in members {
            string(out, owner);
            for n in numbers {
                number(out, *n);
            }
        }
    })
}

fn restore(c: &mut Connection, key: &str, payload: &[u8], ttl: &[&str]) -> RedisResult<String> {
    redis::cmd("RESTORE")
        .arg(key)
        .arg(ttl.first().copied().unwrap_or("0"))
        .arg(payload)
        .arg(&ttl[ttl.len().min(1)..])
        .query(c)
}

#[test]
fn restore_refuses_every_field_no_command_could_have_made_and_creates_nothing() {
    let (_s, mut c) = lenient_server();
    let far = now_ms() + 600_000;
    let good = crafted(&mut c, b"owner", [2, 77, far, 1]);
    assert_eq!(restore(&mut c, "ok", &good, &[]).unwrap(), "OK", "a value a command could make loads");
    assert_eq!(owner_of(&mut c, "ok").as_deref(), Some("owner"));
    assert_eq!(token_of(&mut c, "ok"), 77);

    let long_owner = vec![b'x'; 257];
    let cases: [(&str, &[u8], [u64; 4]); 9] = [
        ("token beyond i64::MAX", b"o", [1, MAX_TOKEN + 1, far, 0]),
        ("token u64::MAX", b"o", [1, u64::MAX, far, 0]),
        ("token 0", b"o", [1, 0, far, 0]),
        ("owner over 256 bytes", &long_owner, [1, 5, far, 0]),
        ("empty owner", b"", [1, 5, far, 0]),
        ("no holds", b"o", [0, 5, far, 0]),
        ("holds beyond u32::MAX", b"o", [1 << 32, 5, far, 0]),
        ("deadline past 2^41 ms from now", b"o", [1, 5, now_ms() + (1 << 42), 0]),
        ("session flag 2", b"o", [1, 5, far, 2]),
    ];
    for (what, owner, numbers) in cases {
        let payload = crafted(&mut c, owner, numbers);
        let e = restore(&mut c, "bad", &payload, &[]).expect_err(what);
        assert!(e.to_string().contains("Bad data format"), "{what}: {e}");
        assert_eq!(c.exists::<_, i64>("bad").unwrap(), 0, "{what}: nothing was created");
    }
    let next = acquire(&mut c, "fresh", "f", 10_000).unwrap().expect("granted");
    assert!(next > 77, "the refused tokens moved nothing: the next one ({next}) still rises");
}

#[test]
fn restore_checks_shared_and_semaphore_holders_against_the_key_mode() {
    let (_s, mut c) = lenient_server();
    let far = now_ms() + 600_000;
    let good = crafted_members(&mut c, 3, &[(b"a", [1, 80, far, 0, 2]), (b"b", [2, 81, far, 1, 1])]);
    assert_eq!(restore(&mut c, "sem", &good, &[]).unwrap(), "OK");
    assert_eq!(owner_of(&mut c, "sem").as_deref(), Some("a"), "the earliest grant first");
    assert_eq!(info_field(&mut c, "sem", "limit"), Some(Value::Int(3)));
    let full: Option<i64> = redis::cmd("FLOCK.ACQUIRE")
        .arg("sem")
        .arg("z")
        .arg(1000)
        .arg("PERMITS")
        .arg(1)
        .arg("LIMIT")
        .arg(3)
        .query(&mut c)
        .unwrap();
    assert_eq!(full, None, "the restored holders use all 3 permits");

    let cases: [(&str, u64, [u64; 5]); 5] = [
        ("permits beyond the limit", 3, [1, 5, far, 0, 4]),
        ("no permits on a semaphore", 3, [1, 5, far, 0, 0]),
        ("permits on a shared holder", 0, [1, 5, far, 0, 1]),
        ("limit beyond 2^32-1", 1 << 32, [1, 5, far, 0, 1]),
        ("a token beyond i64::MAX", 0, [1, MAX_TOKEN + 1, far, 0, 0]),
    ];
    let over = crafted_members(&mut c, 3, &[(b"a", [1, 5, far, 0, 2]), (b"b", [1, 6, far, 0, 2])]);
    assert!(restore(&mut c, "bad", &over, &[]).is_err(), "4 permits in use of 3");
    let twice = crafted_members(&mut c, 0, &[(b"a", [1, 5, far, 0, 0]), (b"a", [1, 6, far, 0, 0])]);
    assert!(restore(&mut c, "bad", &twice, &[]).is_err(), "one owner twice");
    let same = crafted_members(&mut c, 0, &[(b"a", [1, 5, far, 0, 0]), (b"b", [1, 5, far, 0, 0])]);
    assert!(restore(&mut c, "bad", &same, &[]).is_err(), "one token twice");
    for (what, limit, numbers) in cases {
        let payload = crafted_members(&mut c, limit, &[(b"o", numbers)]);
        let e = restore(&mut c, "bad", &payload, &[]).expect_err(what);
        assert!(e.to_string().contains("Bad data format"), "{what}: {e}");
        assert_eq!(c.exists::<_, i64>("bad").unwrap(), 0, "{what}: nothing was created");
    }
}

#[test]
fn a_restored_token_at_the_largest_value_saturates_later_grants_instead_of_wrapping() {
    let (_s, mut c) = lenient_server();
    let payload = crafted(&mut c, b"o", [1, MAX_TOKEN, now_ms() + 600_000, 0]);
    restore(&mut c, "top", &payload, &[]).unwrap();
    assert_eq!(token_of(&mut c, "top"), i64::MAX);
    force_release(&mut c, "top").unwrap();
    let next = acquire(&mut c, "top", "p", 10_000).unwrap().expect("granted");
    assert_eq!(next, i64::MAX, "a token never wraps to a smaller or negative number");
}

#[test]
fn restore_with_a_ttl_already_passed_leaves_no_lease_behind() {
    let (s, mut c) = lenient_server();
    let hour = now_ms() + 3_600_000;
    let payload = crafted(&mut c, b"o", [1, 9, hour, 0]);
    assert_eq!(restore(&mut c, "gone", &payload, &["1", "ABSTTL"]).unwrap(), "OK");
    assert_eq!(c.exists::<_, i64>("gone").unwrap(), 0, "Redis dropped the value at once");
    wait_until("no lease filed for the dropped lock", 5 * SECOND, || s.stat("leases") == 0);
    assert_eq!(s.stat("locks"), 0);

    assert_eq!(restore(&mut c, "kept", &payload, &[]).unwrap(), "OK");
    wait_until("the kept lock's lease filed", 5 * SECOND, || s.stat("leases") == 1);
    assert_eq!(owner_of(&mut c, "kept").as_deref(), Some("o"), "its lease of an hour still runs");
}

#[test]
fn a_restored_lock_whose_lease_ran_out_ends_at_once() {
    let (_s, mut c) = lenient_server();
    let payload = crafted(&mut c, b"old", [1, 9, now_ms() - 1_000, 0]);
    restore(&mut c, "L", &payload, &[]).unwrap();
    wait_until("the expired lease to end", 5 * SECOND, || info(&mut c, "L").is_none());
}

#[test]
fn an_aof_holder_with_a_token_beyond_i64_max_is_refused_and_tokens_stay_positive() {
    let dir = temp_dir("aoftoken");
    let far = (now_ms() + 600_000).to_string();
    let aof = resp(&["SELECT", "0"])
        + &resp(&["FLOCK.STATE", "L", "a", "1", "18446744073709551615", &far, "0"])
        + &resp(&["FLOCK.STATE", "M", "b", "1", "5", &far, "0"]);
    std::fs::write(dir.path().join("appendonly.aof"), aof).unwrap();
    let s = Server::start_in(dir, &["--appendonly", "yes"]);
    let mut c = s.conn();
    assert_eq!(info(&mut c, "L"), None, "the out-of-range holder was refused");
    assert_eq!(owner_of(&mut c, "M").as_deref(), Some("b"), "the valid one loaded");
    let token = acquire(&mut c, "L", "a", 10_000).unwrap().expect("granted");
    assert!(token > 5, "tokens stay positive and rising: {token}");
}
