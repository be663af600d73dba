//! FLOCK.FENCED (issue 31): a command run only while a fencing token holds
//! its lock, in one step; refused (STALE, nothing run) once the lock moved
//! on; what it will not run refused before anything runs; its effects, not
//! itself, replicated and persisted; ACLs as if the command were called
//! directly. Cluster routing is tested in cluster.rs, on that file's cluster.
use crate::common::*;

fn fenced(c: &mut Connection, key: &str, token: impl redis::ToRedisArgs, command: &[&str]) -> RedisResult<Value> {
    redis::cmd("FLOCK.FENCED").arg(key).arg(token).arg(command).query(c)
}

fn get(c: &mut Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(c).unwrap()
}

/// The text of a STALE refusal, after checking its code.
fn stale(r: RedisResult<Value>, what: &str) -> String {
    let e = expect_err(r, what);
    assert_eq!(error_code(&e), "STALE", "{what}: {e}");
    e.to_string()
}

#[test]
fn a_fenced_write_runs_while_its_token_holds_and_is_refused_once_the_lock_moved_on() {
    let s = Server::start();
    let mut c = s.conn();
    // Held long while it writes (a loaded machine may be slow to send it),
    // then its lease cut to 300 ms.
    let a = acquire(&mut c, "lock", "a", 60_000).unwrap().expect("a is granted");
    assert_eq!(fenced(&mut c, "lock", a, &["SET", "data", "from-a"]).unwrap(), Value::Okay, "the holder writes");
    assert_eq!(get(&mut c, "data").as_deref(), Some("from-a"));
    assert_eq!(renew(&mut c, "lock", "a", 300).unwrap(), a);

    // a pauses past its lease; b, queued behind it, is granted.
    let b = granted(waiter(&s, "lock", "b", 60_000), "b");
    let refused = stale(fenced(&mut c, "lock", a, &["SET", "data", "late-a"]), "a writes after its lease ended");
    assert!(refused.contains(&format!("token {b} holds it now")), "names the holder's token: {refused}");
    assert_eq!(get(&mut c, "data").as_deref(), Some("from-a"), "the stale write did not run");
    assert_eq!(fenced(&mut c, "lock", b, &["SET", "data", "from-b"]).unwrap(), Value::Okay);

    release(&mut c, "lock", "b").unwrap();
    let refused = stale(fenced(&mut c, "lock", b, &["SET", "data", "late-b"]), "b writes after its release");
    assert!(refused.contains("the lock is free"), "{refused}");
    let never = stale(fenced(&mut c, "no-such-lock", 1, &["SET", "data", "x"]), "a lock that never was");
    assert!(never.contains("the lock is free"), "{never}");
    assert_eq!(get(&mut c, "data").as_deref(), Some("from-b"));
    let e = expect_err(fenced(&mut c, "data", 1, &["SET", "data", "x"]), "a key that holds no lock");
    assert_eq!(error_code(&e), "WRONGTYPE");
}

#[test]
fn readers_permit_holders_and_session_grants_each_write_with_their_own_token() {
    let s = Server::start();
    let mut c = s.conn();
    let shared = |c: &mut Connection, owner: &str| -> i64 {
        redis::cmd("FLOCK.ACQUIRE")
            .arg("rw")
            .arg(owner)
            .arg(60_000)
            .arg("SHARED")
            .query::<Option<i64>>(c)
            .unwrap()
            .unwrap()
    };
    let (r1, r2) = (shared(&mut c, "r1"), shared(&mut c, "r2"));
    assert_eq!(fenced(&mut c, "rw", r1, &["INCR", "n"]).unwrap(), Value::Int(1));
    assert_eq!(fenced(&mut c, "rw", r2, &["INCR", "n"]).unwrap(), Value::Int(2));
    release(&mut c, "rw", "r1").unwrap();
    let refused = stale(fenced(&mut c, "rw", r1, &["INCR", "n"]), "a reader that left");
    assert!(refused.contains("another holder holds it now"), "{refused}");

    let permit: i64 = redis::cmd("FLOCK.ACQUIRE")
        .arg("sem")
        .arg("p")
        .arg(60_000)
        .arg(&["PERMITS", "2", "LIMIT", "3"][..])
        .query::<Option<i64>>(&mut c)
        .unwrap()
        .unwrap();
    assert_eq!(fenced(&mut c, "sem", permit, &["INCR", "n"]).unwrap(), Value::Int(3));

    // A grant that lives with its session (lease 0) has no lease to run out.
    let sid: String = redis::cmd("FLOCK.SESSION").query(&mut c).unwrap();
    let bound: i64 = redis::cmd("FLOCK.ACQUIRE")
        .arg("bound")
        .arg("s")
        .arg(0)
        .arg("INBOX")
        .arg(&sid)
        .query::<Option<i64>>(&mut c)
        .unwrap()
        .unwrap();
    assert_eq!(fenced(&mut c, "bound", bound, &["INCR", "n"]).unwrap(), Value::Int(4));
}

#[test]
fn the_reply_is_the_commands_own_in_either_protocol_errors_included() {
    let s = Server::start();
    let mut c = s.conn();
    let t = acquire(&mut c, "lock", "a", 60_000).unwrap().unwrap();
    fenced(&mut c, "lock", t, &["HSET", "h", "f", "v"]).unwrap();
    let flat = fenced(&mut c, "lock", t, &["HGETALL", "h"]).unwrap();
    assert!(matches!(&flat, Value::Array(a) if a.len() == 2), "RESP2: a flat array, {flat:?}");
    let mut c3 = s.conn3();
    let map = fenced(&mut c3, "lock", t, &["HGETALL", "h"]).unwrap();
    assert!(matches!(&map, Value::Map(m) if m.len() == 1), "RESP3: a map, {map:?}");
    assert_eq!(fenced(&mut c, "lock", t, &["GET", "nothing"]).unwrap(), Value::Nil);
    let e = expect_err(fenced(&mut c, "lock", t, &["INCR", "h"]), "the command's own error");
    assert_eq!(error_code(&e), "WRONGTYPE", "{e}");
    // The lock's own key is the caller's to write too: deleting it ends the grant.
    assert_eq!(fenced(&mut c, "lock", t, &["DEL", "lock"]).unwrap(), Value::Int(1));
    assert!(!exists(&mut c, "lock"));
    assert!(stale(fenced(&mut c, "lock", t, &["DEL", "lock"]), "after the DEL").contains("free"));
}

#[test]
fn what_it_will_not_run_is_refused_before_anything_runs() {
    let s = Server::start();
    let mut c = s.conn();
    let t = acquire(&mut c, "lock", "a", 60_000).unwrap().unwrap();
    let t = t.to_string();
    let before = (dbsize(&mut c), owner_of(&mut c, "lock"), token_of(&mut c, "lock"));
    let cases: &[(&[&str], &str, &str)] = &[
        (&["BLPOP", "q", "0"], "ERR", "blocking"),
        (&["XREAD", "BLOCK", "0", "STREAMS", "s", "$"], "ERR", "blocking"),
        (&["MULTI"], "ERR", "MULTI"),
        (&["EXEC"], "ERR", "EXEC"),
        (&["WATCH", "data"], "ERR", "WATCH"),
        (&["EVAL", "return redis.call('set', 'data', 1)", "0"], "ERR", "EVAL"),
        (&["FLOCK.RELEASE", "lock", "a"], "ERR", "FLOCK commands"),
        (&["flock.forcerelease", "lock"], "ERR", "FLOCK commands"),
        (&["NO-SUCH-COMMAND", "data"], "ERR", "unknown command"),
        (&["CONFIG", "NO-SUCH-SUBCOMMAND"], "ERR", "unknown command"),
        (&["SET", "data"], "ERR", "wrong number of arguments"),
        (&["GET", "data", "extra"], "ERR", "wrong number of arguments"),
    ];
    for &(command, code, says) in cases {
        let e = expect_err(fenced(&mut c, "lock", &t, command), &format!("{command:?}"));
        assert_eq!(error_code(&e), code, "{command:?}: {e}");
        assert!(e.to_string().contains(says), "{command:?}: {e}");
    }
    for token in ["x", "0", "-1", "1.5", "18446744073709551616"] {
        let e = expect_err(fenced(&mut c, "lock", token, &["SET", "data", "x"]), &format!("token {token}"));
        assert!(e.to_string().contains("invalid token"), "token {token}: {e}");
    }
    for args in [&["lock"][..], &["lock", t.as_str()][..]] {
        let e = expect_err(redis::cmd("FLOCK.FENCED").arg(args).query::<Value>(&mut c), "too few arguments");
        assert!(e.to_string().contains("wrong number of arguments"), "{e}");
    }
    assert_eq!(
        (dbsize(&mut c), owner_of(&mut c, "lock"), token_of(&mut c, "lock")),
        before,
        "nothing ran, nothing changed"
    );
    assert_eq!(s.blocked_clients(), 0, "nothing blocked");
}

#[test]
fn it_runs_inside_multi_scripts_and_functions() {
    let s = Server::start();
    let mut c = s.conn();
    let t = acquire(&mut c, "lock", "a", 60_000).unwrap().unwrap();
    let _: () = redis::cmd("MULTI").query(&mut c).unwrap();
    for (token, value) in [(t, "multi"), (t + 1, "stale")] {
        let queued: String =
            redis::cmd("FLOCK.FENCED").arg("lock").arg(token).arg(&["SET", "data", value][..]).query(&mut c).unwrap();
        assert_eq!(queued, "QUEUED");
    }
    // The client reports the second reply, STALE, as the error of the whole EXEC; the first ran.
    let e = expect_err(redis::cmd("EXEC").query::<Value>(&mut c), "EXEC with a stale FLOCK.FENCED");
    assert_eq!(error_code(&e), "STALE", "{e}");
    assert_eq!(get(&mut c, "data").as_deref(), Some("multi"));

    let script = "return redis.call('FLOCK.FENCED', KEYS[1], ARGV[1], 'SET', KEYS[2], ARGV[2])";
    let r: Value =
        redis::cmd("EVAL").arg(script).arg(2).arg("lock").arg("data").arg(t).arg("lua").query(&mut c).unwrap();
    assert_eq!(r, Value::Okay);
    let e = expect_err(
        redis::cmd("EVAL").arg(script).arg(2).arg("lock").arg("data").arg(t + 1).arg("late").query::<Value>(&mut c),
        "a stale token in a script",
    );
    assert!(e.to_string().contains("STALE"), "{e}");

    let library = "#!lua name=fencing\nredis.register_function('fenced_set', function(keys, args) return redis.call('FLOCK.FENCED', keys[1], args[1], 'SET', keys[2], args[2]) end)";
    let _: String = redis::cmd("FUNCTION").arg("LOAD").arg(library).query(&mut c).unwrap();
    let r: Value = redis::cmd("FCALL")
        .arg("fenced_set")
        .arg(2)
        .arg("lock")
        .arg("data")
        .arg(t)
        .arg("function")
        .query(&mut c)
        .unwrap();
    assert_eq!(r, Value::Okay);
    assert_eq!(get(&mut c, "data").as_deref(), Some("function"));
}

#[test]
fn replicas_and_the_aof_get_the_commands_effects_never_the_fenced_command() {
    let mut s = Server::start_aof("no");
    let replica = Server::replica_of(&s);
    let (mut c, mut r) = (s.conn(), replica.conn());
    let t = acquire(&mut c, "lock", "a", 60_000).unwrap().unwrap();
    fenced(&mut c, "lock", t, &["SET", "data", "v"]).unwrap();
    fenced(&mut c, "lock", t, &["GET", "data"]).unwrap();
    stale(fenced(&mut c, "lock", t + 1, &["SET", "data", "stale"]), "a stale write");
    wait_replica_applied(&mut c, &mut r);
    assert_eq!(get(&mut r, "data").as_deref(), Some("v"), "the replica has the write");
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut r).unwrap();
    assert!(stats.contains("cmdstat_set:calls=1,"), "the replica ran the SET once: {stats}");
    assert!(!stats.contains("flock.fenced"), "the replica never ran FLOCK.FENCED: {stats}");

    s.restart(Stop::ShutdownNoSave);
    let mut c = s.conn();
    assert_eq!(get(&mut c, "data").as_deref(), Some("v"), "the AOF has the write");
    let aof = std::fs::read_dir(s.dir.path().join("appendonlydir"))
        .map(|files| files.map(|f| std::fs::read(f.unwrap().path()).unwrap()).collect::<Vec<_>>().concat())
        .unwrap_or_else(|_| std::fs::read(s.dir.path().join("appendonly.aof")).expect("the AOF"));
    let aof = String::from_utf8_lossy(&aof).to_ascii_lowercase();
    assert!(aof.contains("data") && !aof.contains("flock.fenced"), "the AOF has the SET, not FLOCK.FENCED");
}

#[test]
fn acls_check_the_command_and_its_keys_as_if_it_were_called_directly() {
    let s = Server::start();
    let mut admin = s.conn();
    let t = acquire(&mut admin, "lock:1", "a", 60_000).unwrap().unwrap();
    // `keys` may run SET, but not on the data's key; `nocmd` may touch every key, but not run SET.
    for (name, rules) in [("keys", ["+set", "~lock:*"]), ("nocmd", ["+get", "~*"])] {
        let setuser = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(name)
            .arg(&["reset", "on", ">pw", "+flock.fenced"][..])
            .arg(&rules[..])
            .clone();
        let _: () = setuser.query(&mut admin).unwrap();
    }
    for (name, command, allowed) in [
        ("keys", &["SET", "lock:data", "v"][..], true),
        ("keys", &["SET", "data", "v"][..], false),
        ("nocmd", &["SET", "data", "v"][..], false),
        ("nocmd", &["GET", "data"][..], true),
    ] {
        let mut c = s.conn();
        let _: () = redis::cmd("AUTH").arg(name).arg("pw").query(&mut c).unwrap();
        let r = fenced(&mut c, "lock:1", t, command);
        match allowed {
            true => assert!(r.is_ok(), "{name} {command:?}: {r:?}"),
            false => assert_eq!(error_code(&expect_err(r, name)), "NOPERM", "{name} {command:?}"),
        }
    }
    assert_eq!(get(&mut admin, "data"), None, "no refused write ran");
    // Each denial is in ACL LOG as a direct call's would be: the key by the
    // server (FLOCK.FENCED's own keys), the command by FLOCK.
    let log: Vec<Value> = redis::cmd("ACL").arg("LOG").query(&mut admin).unwrap();
    let entries: Vec<(String, String, String)> = log
        .iter()
        .map(|entry| {
            let fields = fields_of(entry);
            let text = |name: &str| {
                fields.iter().find(|(k, _)| k == name).map(|(_, v)| redis::from_redis_value(v).unwrap()).unwrap()
            };
            (text("username"), text("reason"), text("object"))
        })
        .collect();
    for expected in [("keys", "key", "data"), ("nocmd", "command", "set")] {
        let expected = (expected.0.to_string(), expected.1.to_string(), expected.2.to_string());
        assert!(entries.contains(&expected), "{expected:?} in ACL LOG: {entries:?}");
    }
}

#[test]
fn command_getkeys_and_info_name_the_lock_and_the_commands_own_keys() {
    let s = Server::start();
    let mut c = s.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg(&["FLOCK.FENCED", "{u}:lock", "7", "MSET", "{u}:a", "1", "{u}:b", "2"][..])
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["{u}:lock", "{u}:a", "{u}:b"]);
    let keys: Vec<String> =
        redis::cmd("COMMAND").arg("GETKEYS").arg(&["FLOCK.FENCED", "{u}:lock", "7", "PING"][..]).query(&mut c).unwrap();
    assert_eq!(keys, ["{u}:lock"], "a command without keys adds none");
    let info: Vec<Value> = redis::cmd("COMMAND").arg("INFO").arg("flock.fenced").query(&mut c).unwrap();
    let Some(Value::Array(info)) = info.first() else { panic!("COMMAND INFO flock.fenced: {info:?}") };
    let flags: Vec<String> = redis::from_redis_value(&info[2]).unwrap();
    assert!(flags.contains(&"write".into()) && flags.contains(&"movablekeys".into()), "{flags:?}");
    assert!(!flags.contains(&"denyoom".into()), "the command it runs decides about memory: {flags:?}");
}
