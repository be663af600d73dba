//! Files written by an earlier FLOCK load unchanged: an RDB file of
//! encoding version 2 and a multi-part AOF without RDB preamble (FLOCK.STATE
//! and FLOCK.ID, both as propagated and as rewritten), kept in
//! tests/fixtures/. Both were made with leases and request-ID windows of
//! 2^40 ms, so their locks are still held when the tests run.
//!
//! How they were made (module of commit 9da2252, `retry-window-ms 2^40`):
//! `held2` acquired twice by alice; `bin\0\xffkey` by carol; `ids` by dave
//! with `ID acq-1`, again with `ID acq-2`, released once with `ID rel-1`;
//! `linger` acquired by erin with `ID lin-a`, released with `ID lin-r` (free,
//! kept by its IDs); `sess` by bob with SESSION, connection open at the save.
//! The AOF also has `old` (zed), acquired before a BGREWRITEAOF.
mod common;
use common::*;

use std::path::Path;

const FAR: i64 = 1 << 39;

struct Expected {
    /// (key, owner, holds, token, session)
    held: Vec<(&'static [u8], &'static str, i64, i64, i64)>,
}

fn rdb_expected() -> Expected {
    Expected {
        held: vec![
            (b"held2", "alice", 2, 1882724538994655232, 0),
            (b"sess", "bob", 1, 1882724539036598272, 1),
            (b"ids", "dave", 1, 1882724539010383872, 0),
            (b"bin\x00\xffkey", "carol", 1, 1882724539006189568, 0),
        ],
    }
}

fn aof_expected() -> Expected {
    Expected {
        held: vec![
            (b"held2", "alice", 2, 1882724541197713408, 0),
            (b"sess", "bob", 1, 1882724541242802176, 1),
            (b"ids", "dave", 1, 1882724541215539200, 0),
            (b"bin\x00\xffkey", "carol", 1, 1882724541211344896, 0),
            (b"old", "zed", 1, 1882724540134457344, 0),
        ],
    }
}

/// Copies the fixture directory `from` (files and one level of folders) into a fresh server directory.
fn copy_fixture(from: &str) -> TempDir {
    let dir = temp_dir("fixture");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(from);
    for entry in std::fs::read_dir(&src).expect("fixture dir") {
        let entry = entry.expect("entry");
        let to = dir.path().join(entry.file_name());
        if entry.path().is_dir() {
            std::fs::create_dir(&to).expect("mkdir");
            for file in std::fs::read_dir(entry.path()).expect("fixture subdir") {
                let file = file.expect("entry");
                std::fs::copy(file.path(), to.join(file.file_name())).expect("copy");
            }
        } else {
            std::fs::copy(entry.path(), &to).expect("copy");
        }
    }
    dir
}

fn check(s: &Server, expected: &Expected, how: &str) {
    let mut c = s.conn();
    for (key, owner, holds, token, session) in &expected.held {
        let shown = shown(key);
        assert_eq!(owner_of(&mut c, *key).as_deref(), Some(*owner), "{how}: owner of {shown}");
        assert_eq!(int_field(&mut c, *key, "holds"), *holds, "{how}: holds of {shown}");
        assert_eq!(int_field(&mut c, *key, "token"), *token, "{how}: token of {shown}");
        assert_eq!(int_field(&mut c, *key, "session"), *session, "{how}: session of {shown}");
        assert_eq!(int_field(&mut c, *key, "waiters"), 0, "{how}: waiters of {shown}");
        assert!(ttl_ms(&mut c, *key) > FAR, "{how}: the lease of {shown} still runs");
    }
    // The remembered request IDs answer resends as the first time, and change nothing.
    let dave = expected.held.iter().find(|h| h.0 == b"ids").expect("ids").3;
    let resend_release: i64 =
        redis::cmd("FLOCK.RELEASE").arg("ids").arg("dave").arg("ID").arg("rel-1").query(&mut c).unwrap();
    assert_eq!(resend_release, 1, "{how}: RELEASE rel-1 answered as the first time");
    assert_eq!(holds(&mut c, "ids"), 1, "{how}: the resent RELEASE changed nothing");
    let resend_acquire: Option<i64> =
        redis::cmd("FLOCK.ACQUIRE").arg("ids").arg("dave").arg(1000).arg("ID").arg("acq-1").query(&mut c).unwrap();
    assert_eq!(resend_acquire, Some(dave), "{how}: ACQUIRE acq-1 answered its token");
    assert_eq!(holds(&mut c, "ids"), 1, "{how}: the resent ACQUIRE changed nothing");
    let reused = redis::cmd("FLOCK.RENEW").arg("ids").arg("dave").arg(1000).arg("ID").arg("acq-2").query::<i64>(&mut c);
    assert_eq!(error_code(&expect_err(reused, "acq-2 reused by RENEW")), "IDREUSED", "{how}");
    // `linger` is free, kept by its request IDs under a TTL.
    assert_eq!(info(&mut c, "linger"), None, "{how}: linger is free");
    assert!(exists(&mut c, "linger"), "{how}: linger is kept by its request IDs");
    let pttl: i64 = redis::cmd("PTTL").arg("linger").query(&mut c).unwrap();
    assert!(pttl > FAR, "{how}: linger's TTL follows its IDs: {pttl}");
    let resend: i64 =
        redis::cmd("FLOCK.RELEASE").arg("linger").arg("erin").arg("ID").arg("lin-r").query(&mut c).unwrap();
    assert_eq!(resend, 0, "{how}: RELEASE lin-r answered as the first time");
    // Tokens keep rising above everything loaded.
    let highest = expected.held.iter().map(|h| h.3).max().unwrap_or(0);
    let fresh = acquire(&mut c, "fresh", "n", 10_000).unwrap().expect("granted");
    assert!(fresh > highest, "{how}: a new grant's token {fresh} is above the loaded {highest}");
    assert_eq!(acquire(&mut c, "held2", "other", 1000).unwrap(), None, "{how}: held2 is still held");
}

#[test]
fn an_encoding_version_2_rdb_file_loads_every_lock_exactly() {
    let s = Server::start_in(copy_fixture("v2-rdb"), &[]);
    check(&s, &rdb_expected(), "RDB v2");
}

#[test]
fn an_aof_without_preamble_of_state_and_id_commands_loads_every_lock_exactly() {
    let s = Server::start_in(copy_fixture("v2-aof"), &["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    check(&s, &aof_expected(), "AOF");
}
