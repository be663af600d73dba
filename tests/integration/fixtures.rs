//! Files written by earlier FLOCK builds, and by this one, load unchanged:
//! each fixture in tests/fixtures/ is loaded into a fresh server, and every
//! key must come back exactly as it was made (mode, limit, and each holder's
//! owner, holds, token, session flag and permits; waiters are not persisted),
//! its request IDs still answering resends. All were made with leases and
//! request-ID windows of 2^40 ms, so their locks are still held when the
//! tests run. `NAME-rdb/dump.rdb` is an RDB file; `NAME-aof/appendonlydir` a
//! multi-part AOF without RDB preamble whose base part is an AOF rewrite and
//! whose incr part holds the records propagated after it.
//!
//! - `v2-rdb` (RDB encoding 2), `v2-aof` (FLOCK.STATE and FLOCK.ID): made by
//!   hand with the module of commit 9da2252 (`retry-window-ms 2^40`), exclusive
//!   locks only: `held2` acquired twice by alice; `bin\0\xffkey` by carol;
//!   `ids` by dave with `ID acq-1`, again with `ID acq-2`, released once with
//!   `ID rel-1`; `linger` acquired by erin with `ID lin-a`, released with
//!   `ID lin-r` (free, kept by its IDs); `sess` by bob with SESSION, connection
//!   open at the save. The AOF also has `old` (zed), acquired before a
//!   BGREWRITEAOF.
//! - `v3-rdb` (RDB encoding 3), `v3-aof` (FLOCK.STATE, both FLOCK.HOLDER
//!   layouts of then, FLOCK.ID): made by `scripts/make-fixtures.sh` with the
//!   module of commit ee21794.
//! - `v4-rdb` (RDB encoding 4), `v4-aof` (FLOCK.HOLDER with every mode,
//!   FLOCK.ID): made by `scripts/make-fixtures.sh` with the module of the
//!   persistence rewrite that followed ee21794.
//!
//! The script's locks (its header says which are made before the AOF rewrite):
//! the v2 ones (`held2`, `bin\0\xffkey`, `ids`, `linger`, `sess`) with the
//! same IDs, and `rw`, a read-write lock held shared by frank (SESSION) and
//! grace (twice), after mallory's shared hold was released; `sem`, a semaphore
//! `LIMIT 5` held by heidi (`PERMITS 2`) and ivan (`PERMITS 1`); `handoff`,
//! held exclusively by quinn until its release granted nina and omar, who
//! waited SHARED, together; `semids`, a semaphore of 3 whose holders judy and
//! ken released with IDs `sj-r` (before the rewrite) and `sk-r` (after it),
//! and `semold`, a semaphore of 4 that pat released with ID `so-r` before it:
//! both kept by their IDs (free: their keys go once loaded, and their IDs
//! stay).
//! The tests' token tables are what the script printed when it made each file.
use crate::common::*;

use std::path::Path;

const FAR: i64 = 1 << 39;

/// One holder as FLOCK.INFO's `holders` lists it.
struct Holder {
    owner: &'static str,
    holds: i64,
    token: i64,
    session: i64,
    permits: i64,
}

/// A held key: FLOCK.INFO's mode, limit and holders, earliest grant first.
struct Lock {
    key: &'static [u8],
    mode: &'static str,
    limit: i64,
    holders: Vec<Holder>,
}

/// A free lock kept by its request IDs: `owner`'s RELEASE resent with `id`
/// answers `reply` again.
struct Kept {
    key: &'static [u8],
    owner: &'static str,
    id: &'static str,
    reply: i64,
}

struct Expected {
    locks: Vec<Lock>,
    kept: Vec<Kept>,
}

fn holder(owner: &'static str, holds: i64, token: i64, session: i64, permits: i64) -> Holder {
    Holder { owner, holds, token, session, permits }
}

fn lock(key: &'static [u8], mode: &'static str, limit: i64, holders: Vec<Holder>) -> Lock {
    Lock { key, mode, limit, holders }
}

/// An exclusive lock of one holder (everything version 2 could hold).
fn exclusive(key: &'static [u8], owner: &'static str, holds: i64, token: i64, session: i64) -> Lock {
    lock(key, "exclusive", 0, vec![holder(owner, holds, token, session, 0)])
}

/// `linger`: erin's lock, released with ID lin-r (in every fixture).
fn linger() -> Kept {
    Kept { key: b"linger", owner: "erin", id: "lin-r", reply: 0 }
}

/// The v2 files (made by hand, see the top of this file); `old` is only in the AOF.
fn v2_expected(tokens: [i64; 4], old: Option<i64>) -> Expected {
    let [held2, sess, ids, bin] = tokens;
    let mut locks = vec![
        exclusive(b"held2", "alice", 2, held2, 0),
        exclusive(b"sess", "bob", 1, sess, 1),
        exclusive(b"ids", "dave", 1, ids, 0),
        exclusive(b"bin\x00\xffkey", "carol", 1, bin, 0),
    ];
    locks.extend(old.map(|token| exclusive(b"old", "zed", 1, token, 0)));
    Expected { locks, kept: vec![linger()] }
}

/// The locks of scripts/make-fixtures.sh; `tokens` in the order it prints them.
fn script_expected(tokens: [i64; 10]) -> Expected {
    let [alice, carol, dave, frank, grace, heidi, ivan, nina, omar, bob] = tokens;
    Expected {
        locks: vec![
            exclusive(b"held2", "alice", 2, alice, 0),
            exclusive(b"bin\x00\xffkey", "carol", 1, carol, 0),
            exclusive(b"ids", "dave", 1, dave, 0),
            lock(b"rw", "shared", 0, vec![holder("frank", 1, frank, 1, 0), holder("grace", 2, grace, 0, 0)]),
            lock(b"sem", "semaphore", 5, vec![holder("heidi", 1, heidi, 0, 2), holder("ivan", 1, ivan, 0, 1)]),
            lock(b"handoff", "shared", 0, vec![holder("nina", 1, nina, 0, 0), holder("omar", 1, omar, 0, 0)]),
            exclusive(b"sess", "bob", 1, bob, 1),
        ],
        kept: vec![
            linger(),
            Kept { key: b"semids", owner: "judy", id: "sj-r", reply: 0 },
            Kept { key: b"semids", owner: "ken", id: "sk-r", reply: 0 },
            Kept { key: b"semold", owner: "pat", id: "so-r", reply: 0 },
        ],
    }
}

// Tokens as scripts/make-fixtures.sh printed them when it made each fixture.
const V3_RDB: [i64; 10] = [
    1882772453384519680,
    1882772453637226496,
    1882772453642469376,
    1882772453688606720,
    1882772453748375552,
    1882772453764104192,
    1882772454469795840,
    1882772454503350272,
    1882772454503350273,
    1882772454124814336,
];
const V3_AOF: [i64; 10] = [
    1882772454885031936,
    1882772455136690176,
    1882772455141933056,
    1882772455174438912,
    1882772455183876096,
    1882772455204847616,
    1882772456055242752,
    1882772456087748608,
    1882772456087748609,
    1882772455689289728,
];
const V4_RDB: [i64; 10] = [
    1882772466759106560,
    1882772466873401344,
    1882772466878644224,
    1882772466902761472,
    1882772466957287424,
    1882772466971967488,
    1882772467431243776,
    1882772467452215296,
    1882772467452215297,
    1882772467238305792,
];
const V4_AOF: [i64; 10] = [
    1882772467748962304,
    1882772467901005824,
    1882772467910443008,
    1882772467940851712,
    1882772467994329088,
    1882772468004814848,
    1882772468637106176,
    1882772468661223424,
    1882772468661223425,
    1882772468412710912,
];

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

fn str_of(v: &Value) -> String {
    redis::from_redis_value(v).unwrap_or_else(|e| panic!("{v:?} is not a string: {e}"))
}

/// Checks one held key field by field; FLOCK.INFO's first fields show its first holder.
fn check_lock(c: &mut Connection, lock: &Lock, how: &str) {
    let shown = shown(lock.key);
    let fields = info(c, lock.key).unwrap_or_else(|| panic!("{how}: {shown} is not held"));
    let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).expect(name);
    assert_eq!(str_of(&field("mode")), lock.mode, "{how}: mode of {shown}");
    assert_eq!(int(&field("limit")), lock.limit, "{how}: limit of {shown}");
    assert_eq!(int(&field("waiters")), 0, "{how}: waiters of {shown}");
    let Value::Array(listed) = field("holders") else { panic!("{how}: holders of {shown}") };
    let owners: Vec<String> = listed.iter().map(|h| str_of(&fields_of(h)[0].1)).collect();
    let want: Vec<&str> = lock.holders.iter().map(|h| h.owner).collect();
    assert_eq!(owners, want, "{how}: holders of {shown}");
    for (listed, h) in listed.iter().zip(&lock.holders) {
        let got: std::collections::HashMap<String, Value> = fields_of(listed).into_iter().collect();
        let num = |name: &str| int(&got[name]);
        let what = format!("{how}: {shown} held by {}", h.owner);
        assert_eq!(num("holds"), h.holds, "{what}: holds");
        assert_eq!(num("token"), h.token, "{what}: token");
        assert_eq!(num("session"), h.session, "{what}: session");
        assert_eq!(num("permits"), h.permits, "{what}: permits");
        assert!(num("ttl-ms") > FAR, "{what}: the lease still runs");
    }
    let first = &lock.holders[0];
    assert_eq!(str_of(&field("owner")), first.owner, "{how}: owner of {shown}");
    assert_eq!(int(&field("holds")), first.holds, "{how}: holds of {shown}");
    assert_eq!(int(&field("token")), first.token, "{how}: token of {shown}");
    assert_eq!(int(&field("session")), first.session, "{how}: session of {shown}");
}

/// Checks a free lock kept by request IDs: it has no key (free means gone:
/// an RDB of an earlier version has the key, which goes once loaded; an AOF
/// replayed now keeps its IDs without a key), and its resent RELEASE is
/// answered as the first time.
fn check_kept(c: &mut Connection, kept: &Kept, how: &str) {
    let shown = shown(kept.key);
    assert_eq!(info(c, kept.key), None, "{how}: {shown} is free");
    assert!(!exists(c, kept.key), "{how}: {shown} has no key once loaded");
    for time in ["first", "second"] {
        let resend: i64 =
            redis::cmd("FLOCK.RELEASE").arg(kept.key).arg(kept.owner).arg("ID").arg(kept.id).query(c).unwrap();
        assert_eq!(
            resend, kept.reply,
            "{how}: RELEASE {} on {shown} answered as the first time ({time} resend)",
            kept.id
        );
        assert!(!exists(c, kept.key), "{how}: {shown} has no key after a command");
    }
}

fn check(s: &Server, expected: &Expected, how: &str) {
    let mut c = s.conn();
    // Free locks kept by their IDs have no key: an RDB of then has theirs,
    // which go once loaded (from a timer due at once).
    let keys = expected.locks.len() as i64;
    wait_until(&format!("{how}: the fixture's held keys and no others"), 5 * SECOND, || dbsize(&mut c) == keys);
    for lock in &expected.locks {
        check_lock(&mut c, lock, how);
    }
    // The remembered request IDs answer resends as the first time, and change nothing.
    let dave = expected.locks.iter().find(|l| l.key == b"ids").expect("ids").holders[0].token;
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
    for kept in &expected.kept {
        check_kept(&mut c, kept, how);
    }
    // Tokens keep rising above everything loaded.
    let highest = expected.locks.iter().flat_map(|l| &l.holders).map(|h| h.token).max().unwrap_or(0);
    let fresh = acquire(&mut c, "fresh", "n", 10_000).unwrap().expect("granted");
    assert!(fresh > highest, "{how}: a new grant's token {fresh} is above the loaded {highest}");
    assert_eq!(acquire(&mut c, "held2", "other", 1000).unwrap(), None, "{how}: held2 is still held");
}

/// Starts a fresh server on a copy of the fixture `name` and checks it; a
/// failed check shows the server's log.
fn load_and_check(name: &str, expected: Expected) {
    let aof = name.ends_with("-aof");
    let mut args = vec!["--logfile", "server.log"];
    if aof {
        args.extend(["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    }
    let s = Server::start_in(copy_fixture(name), &args);
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&s, &expected, name)));
    if let Err(failure) = checked {
        eprintln!("{name}: server log:\n{}", s.log_excerpt("server.log"));
        std::panic::resume_unwind(failure);
    }
}

#[test]
fn an_encoding_version_2_rdb_file_loads_every_lock_exactly() {
    load_and_check(
        "v2-rdb",
        v2_expected([1882724538994655232, 1882724539036598272, 1882724539010383872, 1882724539006189568], None),
    );
}

#[test]
fn an_aof_without_preamble_of_state_and_id_commands_loads_every_lock_exactly() {
    let tokens = [1882724541197713408, 1882724541242802176, 1882724541215539200, 1882724541211344896];
    load_and_check("v2-aof", v2_expected(tokens, Some(1882724540134457344)));
}

#[test]
fn an_encoding_version_3_rdb_file_with_shared_and_semaphore_holders_loads_exactly() {
    load_and_check("v3-rdb", script_expected(V3_RDB));
}

#[test]
fn an_aof_of_state_holder_and_id_commands_loads_every_holder_exactly() {
    load_and_check("v3-aof", script_expected(V3_AOF));
}

#[test]
fn an_encoding_version_4_rdb_file_loads_every_holder_exactly() {
    load_and_check("v4-rdb", script_expected(V4_RDB));
}

#[test]
fn an_aof_of_holder_and_id_commands_loads_every_holder_exactly() {
    load_and_check("v4-aof", script_expected(V4_AOF));
}
