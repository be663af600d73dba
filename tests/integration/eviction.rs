//! Locks under memory pressure. An `allkeys-*` maxmemory policy evicts lock
//! keys like cache entries (a held lock would vanish and be granted again),
//! so FLOCK.ACQUIRE is refused with `EVICTION` while such a policy is in
//! force, unless `flock.allow-eviction` is on; `volatile-*` policies (lock
//! keys have no TTL) and `noeviction` are safe. Locks held before the policy
//! turned unsafe carry on and can be evicted: these tests show both sides.
use crate::common::*;

const MB: u64 = 1024 * 1024;

/// A server whose log goes to a file in its directory; `extra` as for
/// `Server::start_with`.
fn start_logged(extra: &[&str]) -> Server {
    let dir = temp_dir("evict");
    let log = dir.path().join("redis.log").display().to_string();
    let args: Vec<&str> = ["--logfile", log.as_str()].into_iter().chain(extra.iter().copied()).collect();
    Server::start_in(dir, &args)
}

fn server_log(s: &Server) -> String {
    std::fs::read_to_string(s.dir.path().join("redis.log")).expect("server log")
}

/// Asserts that `r` is the EVICTION refusal naming `policy`, its safe
/// counterpart and the opt-in.
fn assert_eviction_refused<T: std::fmt::Debug>(r: RedisResult<T>, policy: &str) {
    let e = r.expect_err("ACQUIRE refused under an allkeys policy");
    assert_eq!(error_code(&e), "EVICTION", "{e}");
    let detail = e.detail().unwrap_or_default();
    let safe = policy.replace("allkeys-", "volatile-");
    for part in [policy, &format!("CONFIG SET maxmemory-policy {safe}"), "CONFIG SET flock.allow-eviction yes"] {
        assert!(detail.contains(part), "error does not say {part:?}: {e}");
    }
}

fn memory_stat(s: &Server, section: &str, field: &str) -> u64 {
    s.info_section(section)[field].parse().expect("a number")
}

/// Sets maxmemory to `headroom` bytes above what the server uses now.
fn leave_headroom(s: &Server, c: &mut Connection, headroom: u64) {
    let limit = memory_stat(s, "memory", "used_memory") + headroom;
    config_set(c, &[("maxmemory", &limit.to_string())]);
}

/// Writes 10 kB cache entries `cache:{first}..` in batches of 100 until
/// `done` holds after a batch; false if `max_batches` pass first.
fn fill_cache_until(c: &mut Connection, first: u64, max_batches: u64, mut done: impl FnMut() -> bool) -> bool {
    let value = vec![b'x'; 10 * 1024];
    for batch in 0..max_batches {
        let mut pipe = redis::pipe();
        for i in 0..100 {
            pipe.cmd("SET").arg(format!("cache:{}", first + batch * 100 + i)).arg(&value).ignore();
        }
        let _: () = pipe.query(c).expect("cache writes");
        if done() {
            return true;
        }
    }
    false
}

#[test]
fn allkeys_policies_refuse_acquire_and_create_nothing() {
    let s = Server::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]);
    let mut c = s.conn();
    assert_eq!(s.stat("eviction_unsafe"), 1, "read at load");
    let mut refused = 0;
    for policy in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
        config_set(&mut c, &[("maxmemory-policy", policy)]);
        assert_eviction_refused(acquire(&mut c, "L", "a", 10_000), policy);
        assert_eviction_refused(acquire_wait(&mut c, "L", "a", 10_000, 0), policy);
        assert_eviction_refused(
            redis::cmd("FLOCK.ACQUIRE").arg("L").arg("a").arg(10_000).arg("SESSION").query::<Value>(&mut c),
            policy,
        );
        refused += 3;
        assert!(!exists(&mut c, "L"), "{policy}: a refused ACQUIRE created the key");
        assert_eq!(s.stat("eviction_refused_acquires"), refused);
    }
    assert_eq!(s.blocked_clients(), 0, "a refused WAIT does not block");
    let stats = s.stats();
    assert_eq!((stats["locks"], stats["grants"], stats["waiters"]), (0, 0, 0));
    // Bad input is still reported as such, not as EVICTION.
    let e = acquire(&mut c, "L", "", 10_000).unwrap_err();
    assert_eq!(error_code(&e), "ERR", "{e}");
}

#[test]
fn volatile_and_noeviction_policies_and_no_maxmemory_grant() {
    let s = Server::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"]);
    let mut c = s.conn();
    let cases: [&[(&str, &str)]; 5] = [
        &[],
        &[("maxmemory-policy", "volatile-lfu")],
        &[("maxmemory-policy", "volatile-ttl")],
        &[("maxmemory-policy", "noeviction")],
        // allkeys without a memory limit never evicts.
        &[("maxmemory-policy", "allkeys-lru"), ("maxmemory", "0")],
    ];
    for (i, settings) in cases.iter().enumerate() {
        if !settings.is_empty() {
            config_set(&mut c, settings);
        }
        let key = format!("L{i}");
        assert!(acquire(&mut c, &key, "a", 10_000).unwrap().is_some(), "{settings:?}: granted");
        assert_eq!(s.stat("eviction_unsafe"), 0, "{settings:?}");
    }
    assert_eq!(s.stat("eviction_refused_acquires"), 0);
}

#[test]
fn turning_unsafe_at_run_time_refuses_new_acquires_but_lets_holders_and_waiters_finish() {
    let s = start_logged(&[]);
    let mut c = s.conn();
    let token_a = acquire(&mut c, "L", "a", 10_000).unwrap().expect("granted while safe");
    let b = spawn_waiter(&s, "L", "b", 10_000, 0);
    wait_queue(&mut c, "L", &["b"]);

    config_set(&mut c, &[("maxmemory", "64mb"), ("maxmemory-policy", "allkeys-lru")]);
    assert_eq!(s.stat("eviction_unsafe"), 1);
    assert_eviction_refused(acquire(&mut c, "other", "c", 10_000), "allkeys-lru");
    assert_eviction_refused(acquire_wait(&mut c, "L", "c", 10_000, 0), "allkeys-lru");
    assert_eviction_refused(acquire(&mut c, "L", "a", 10_000), "allkeys-lru");
    assert_eq!(queue_of(&mut c, "L"), ["b"], "the refused WAIT did not queue");
    let log = server_log(&s);
    assert!(
        log.contains("maxmemory-policy allkeys-lru with maxmemory 67108864 can evict lock keys")
            && log.contains("locks held now (1) and the waiters queued now (1) carry on"),
        "warning in the log:\n{log}"
    );

    // The holder renews and releases as before; the queued waiter gets the lock.
    assert_eq!(renew(&mut c, "L", "a", 10_000).unwrap(), token_a);
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    let token_b = b.join().unwrap().unwrap().expect("the waiter was handed the lock");
    assert!(token_b > token_a);
    assert_eq!(release(&mut c, "L", "b").unwrap(), 0);

    config_set(&mut c, &[("maxmemory-policy", "volatile-lru")]);
    assert_eq!(s.stat("eviction_unsafe"), 0);
    assert!(acquire(&mut c, "L", "c", 10_000).unwrap().is_some(), "granted again once safe");
    assert!(server_log(&s).contains("FLOCK.ACQUIRE grants locks again"));
    assert_eq!(s.stat("eviction_refused_acquires"), 3);
}

#[test]
fn allow_eviction_grants_under_allkeys_policies() {
    // Set at startup (config-file form) and changeable at run time.
    let s =
        start_logged(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru", "--flock.allow-eviction", "yes"]);
    let mut c = s.conn();
    let get: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("flock.allow-eviction").query(&mut c).unwrap();
    assert_eq!(get, ["flock.allow-eviction", "yes"]);
    assert!(acquire(&mut c, "L", "a", 10_000).unwrap().is_some());
    assert_eq!(s.stat("eviction_unsafe"), 1, "still reported: the risk is real");
    assert!(server_log(&s).contains("flock.allow-eviction is yes: FLOCK keeps granting"));

    config_set(&mut c, &[("flock.allow-eviction", "no")]);
    assert_eviction_refused(acquire(&mut c, "M", "a", 10_000), "allkeys-lru");
    config_set(&mut c, &[("flock.allow-eviction", "yes")]);
    assert!(acquire(&mut c, "M", "a", 10_000).unwrap().is_some());
    assert_eq!(s.stat("eviction_refused_acquires"), 1);
    let e = try_config_set(&mut c, "flock.allow-eviction", "maybe").unwrap_err();
    assert_eq!(error_code(&e), "ERR", "{e}");
}

/// The risk the opt-in accepts, as measured on Redis 7.0: the cache evicts a
/// held lock, its waiter gets LOCKDELETED, and a third client is granted the
/// lock while the first holder still believes it holds it.
#[test]
fn under_the_opt_in_a_cache_filling_memory_evicts_a_held_lock() {
    let s = Server::start_with(&["--maxmemory-policy", "allkeys-lru", "--flock.allow-eviction", "yes"]);
    let mut c = s.conn();
    leave_headroom(&s, &mut c, 4 * MB);
    let token_a = acquire(&mut c, "orders", "a", 60_000).unwrap().expect("granted");
    let b = spawn_waiter(&s, "orders", "b", 60_000, 0);
    wait_queue(&mut c, "orders", &["b"]);

    // INFO reads no key, so polling it does not refresh the lock's LRU clock.
    let evicted = fill_cache_until(&mut c, 0, 200, || s.stat("deletions") == 1);
    assert!(evicted, "200 MB of cache writes did not evict the held lock");
    let e = b.join().unwrap().expect_err("the waiter learns the lock is gone");
    assert_eq!(error_code(&e), "LOCKDELETED", "{e}");
    assert!(memory_stat(&s, "stats", "evicted_keys") > 0);

    let token_c = acquire(&mut c, "orders", "c", 60_000).unwrap().expect("granted at once to a third client");
    assert!(token_c > token_a, "the fencing token still tells the stale holder apart");
    let e = renew(&mut c, "orders", "a", 60_000).unwrap_err();
    assert_eq!(error_code(&e), "NOTOWNER", "the first holder finds out only when it renews: {e}");
}

/// Without the opt-in, a cache that fills memory and makes Redis evict under
/// allkeys-lru never gets a lock granted, so there is no lock to evict.
#[test]
fn without_the_opt_in_a_cache_filling_memory_never_gets_a_lock() {
    let s = Server::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let mut c = s.conn();
    let mut probe = s.conn();
    leave_headroom(&s, &mut c, 4 * MB);
    let mut tries = 0;
    // 10 MB in all, an ACQUIRE try and WAIT after every 1 MB.
    let stopped = fill_cache_until(&mut c, 0, 10, || {
        assert_eviction_refused(acquire(&mut probe, &format!("L{tries}"), "a", 60_000), "allkeys-lru");
        assert_eviction_refused(acquire_wait(&mut probe, "L", "a", 60_000, 0), "allkeys-lru");
        tries += 1;
        false
    });
    assert!(!stopped);
    assert!(memory_stat(&s, "stats", "evicted_keys") > 0, "10 MB of cache into 4 MB of headroom evicts");
    let stats = s.stats();
    assert_eq!((stats["locks"], stats["grants"], stats["deletions"]), (0, 0, 0));
    assert_eq!(stats["eviction_refused_acquires"], 2 * tries);
}

/// What the refusal does not cover: a lock granted before the policy turned
/// unsafe can still be evicted. While the policy stays unsafe nobody else is
/// granted it, so no second holder appears; once it is safe again the next
/// grant carries a larger fencing token.
#[test]
fn a_lock_granted_before_the_policy_turned_unsafe_can_be_evicted_but_not_granted_again() {
    let s = Server::start();
    let mut c = s.conn();
    let token_a = acquire(&mut c, "orders", "a", 60_000).unwrap().expect("granted while safe");
    let b = spawn_waiter(&s, "orders", "b", 60_000, 0);
    wait_queue(&mut c, "orders", &["b"]);
    config_set(&mut c, &[("maxmemory-policy", "allkeys-lru")]);
    leave_headroom(&s, &mut c, 4 * MB);

    assert!(fill_cache_until(&mut c, 0, 200, || s.stat("deletions") == 1), "the held lock was not evicted");
    let e = b.join().unwrap().expect_err("the waiter learns the lock is gone");
    assert_eq!(error_code(&e), "LOCKDELETED", "{e}");
    assert_eviction_refused(acquire(&mut c, "orders", "c", 60_000), "allkeys-lru");
    assert!(!exists(&mut c, "orders"));
    assert_eq!(renew(&mut c, "orders", "a", 60_000).map_err(|e| error_code(&e)), Err("NOTOWNER".into()));

    config_set(&mut c, &[("maxmemory-policy", "volatile-lru")]);
    let token_c = acquire(&mut c, "orders", "c", 60_000).unwrap().expect("granted once safe");
    assert!(token_c > token_a);
}
