//! Every FLOCK command, each declared once: its handler, flags and keys for
//! Redis, its ACL categories, and what `COMMAND DOCS` and `COMMAND INFO` say
//! of it (so that redis-cli shows hints and Cluster and ACLs see the key).
//! The module creates them from this table in a loop at load. Redis 7.0
//! allows one of INSERT, UPDATE, DELETE per key spec: writes say UPDATE.
//! The ACL categories are those of the nearest core commands (SET, GET,
//! BLPOP); the internal commands are @admin @dangerous like REPLCONF, so that
//! `-@admin` keeps clients away from them as well.

use redis_module::raw::{
    RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK as BLOCK,
    RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER as INTEGER,
    RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY as KEY,
    RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF as ONEOF,
    RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PATTERN as PATTERN,
    RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN as PURE_TOKEN,
    RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING as STRING, REDISMODULE_CMD_KEY_ACCESS as ACCESS,
    REDISMODULE_CMD_KEY_INCOMPLETE as INCOMPLETE, REDISMODULE_CMD_KEY_RO as RO, REDISMODULE_CMD_KEY_RW as RW,
    REDISMODULE_CMD_KEY_UPDATE as UPDATE,
};

use crate::ffi::{ArgDoc, Command, CommandTable};
use crate::{commands, fenced, inspect, multi};

const fn arg(name: &'static str, kind: u32) -> ArgDoc {
    ArgDoc { name, kind, token: None, optional: false, multiple: false, subargs: &[] }
}

/// An argument that follows its token (`WAIT timeout-ms`), or a pure token.
const fn token(name: &'static str, kind: u32, token: &'static str) -> ArgDoc {
    ArgDoc { token: Some(token), ..arg(name, kind) }
}

const fn optional(arg: ArgDoc) -> ArgDoc {
    ArgDoc { optional: true, ..arg }
}

/// A block or a choice (`ONEOF`) of the arguments `subargs`.
const fn with_args(arg: ArgDoc, subargs: &'static [ArgDoc]) -> ArgDoc {
    ArgDoc { subargs, ..arg }
}

const LOCK: ArgDoc = arg("key", KEY);
const OWNER: ArgDoc = arg("owner", STRING);
const LEASE: ArgDoc = arg("lease-ms", INTEGER);
const ID: ArgDoc = optional(token("request-id", STRING, "ID"));
/// `numkeys key [key ...]`: `ffi::set_command_info` makes the key repeat.
const NUMKEYS: ArgDoc = arg("numkeys", INTEGER);
const WAIT: ArgDoc = optional(token("timeout-ms", INTEGER, "WAIT"));
const LOCKDELAY: ArgDoc = optional(token("lock-delay-ms", INTEGER, "LOCKDELAY"));
const SESSION: ArgDoc = optional(token("session", PURE_TOKEN, "SESSION"));

/// A remembered request ID, as the internal commands carry it.
const RECORD: &[ArgDoc] =
    &[arg("request-id", STRING), arg("command", INTEGER), arg("reply", INTEGER), arg("expires-unix-ms", INTEGER)];
/// One riding on an internal command, after its own words.
const REQUEST: ArgDoc = with_args(optional(token("request", BLOCK, "ID")), RECORD);

pub struct Commands;

impl CommandTable for Commands {
    const ALL: &'static [Command] = &COMMANDS;
}

const COMMANDS: [Command; 18] = [
    Command {
        name: "flock.acquire",
        run: commands::acquire,
        flags: "write deny-oom blocking",
        keys: (1, 1, 1),
        summary: "Takes a fair lock (exclusive, or SHARED for the read side) or PERMITS of a fair semaphore: granted at once if it fits and nobody waits, or with WAIT queued FIFO and blocked until granted",
        complexity: "O(1)",
        arity: -4,
        key_flags: RW | UPDATE,
        acl: "write slow blocking",
        args: &[
            LOCK,
            OWNER,
            LEASE,
            WAIT,
            SESSION,
            optional(token("session-id", STRING, "INBOX")),
            ID,
            LOCKDELAY,
            with_args(optional(arg("kind", ONEOF)), &[
                token("shared", PURE_TOKEN, "SHARED"),
                with_args(arg("semaphore", BLOCK), &[
                    token("n", INTEGER, "PERMITS"),
                    token("m", INTEGER, "LIMIT"),
                ]),
            ]),
        ],
    },
    Command {
        name: "flock.release",
        run: commands::release,
        flags: "write fast",
        keys: (1, 1, 1),
        summary: "Releases one hold of the owner's grant; at zero its share passes to the next waiters in the queue",
        complexity: "O(1)",
        arity: -3,
        key_flags: RW | UPDATE,
        acl: "write fast",
        args: &[LOCK, OWNER, ID],
    },
    Command {
        name: "flock.acquireall",
        // Its keys follow numkeys: the command names them when Redis asks
        // (Cluster), and the key spec gives them (ACLs).
        run: multi::acquire_all,
        flags: "write deny-oom blocking getkeys-api",
        keys: (0, 0, 0),
        summary: "Takes several locks of one owner at once, all or none: each key's fencing token in order, or nil; with WAIT one waiter holds its place in every key's queue and is granted all when the last comes free to it",
        complexity: "O(N) where N is the number of keys",
        arity: -5,
        key_flags: RW | UPDATE,
        acl: "write slow blocking",
        args: &[
            NUMKEYS,
            LOCK,
            OWNER,
            LEASE,
            WAIT,
            SESSION,
            ID,
            LOCKDELAY,
            optional(token("shared", PURE_TOKEN, "SHARED")),
        ],
    },
    Command {
        name: "flock.releaseall",
        run: multi::release_all,
        flags: "write getkeys-api",
        keys: (0, 0, 0),
        summary: "Releases one hold of each of several locks of one owner in one step, or none (NOTOWNER): each key's holds left",
        complexity: "O(N) where N is the number of keys",
        arity: -4,
        key_flags: RW | UPDATE,
        acl: "write slow",
        args: &[NUMKEYS, LOCK, OWNER, ID],
    },
    Command {
        name: "flock.renew",
        run: commands::renew,
        flags: "write fast",
        keys: (1, 1, 1),
        summary: "Resets the owner's lease; an error means its grant was lost",
        complexity: "O(1)",
        arity: -4,
        key_flags: RW | UPDATE,
        acl: "write fast",
        args: &[LOCK, OWNER, LEASE, ID],
    },
    Command {
        name: "flock.forcerelease",
        // No category singles it out: administrators deny it by name
        // (`-flock.forcerelease`), on every server.
        run: commands::force_release,
        flags: "write fast",
        keys: (1, 1, 1),
        summary: "Removes every holder whatever its holds (administrative) and answers how many; the queue is granted",
        complexity: "O(N) where N is the number of holders",
        arity: -2,
        key_flags: RW | UPDATE,
        acl: "write fast",
        args: &[LOCK, ID],
    },
    Command {
        name: "flock.info",
        run: commands::info,
        flags: "readonly fast",
        keys: (1, 1, 1),
        summary: "Shows owner, holds, token, ttl-ms, session, waiters, queue, mode, limit and holders of a lock or semaphore",
        complexity: "O(N + H log H) where N is the number of waiters and H of holders listed",
        arity: 2,
        key_flags: RO | ACCESS,
        acl: "read fast",
        args: &[LOCK],
    },
    Command {
        name: "flock.top",
        run: inspect::top,
        flags: "readonly",
        keys: (0, 0, 0),
        summary: "Lists the contended locks of the database (those with waiters now), most contended first, each with its holders, waiters and oldest wait, from an index: never a pass over the keys",
        complexity: "O(C log C) where C is the number of contended locks",
        arity: -1,
        key_flags: 0,
        acl: "keyspace read slow",
        args: &[
            optional(token("count", INTEGER, "COUNT")),
            optional(token("pattern", PATTERN, "MATCH")),
            with_args(optional(token("order", ONEOF, "BY")), &[
                token("waiters", PURE_TOKEN, "WAITERS"),
                token("wait", PURE_TOKEN, "WAIT"),
                token("hold", PURE_TOKEN, "HOLD"),
            ]),
        ],
    },
    Command {
        name: "flock.owner",
        run: inspect::owner,
        flags: "readonly",
        keys: (0, 0, 0),
        summary: "Shows who an owner blocks and who blocks it: the contended locks it holds, and each lock it waits for with its place in the queue and the owners ahead of it",
        complexity: "O(H + W*(h + q)) where H is the number of contended locks, W the waits of the owner, h and q the holders and waiters ahead at each",
        arity: 2,
        key_flags: 0,
        acl: "keyspace read slow",
        args: &[OWNER],
    },
    Command {
        name: "flock.longlog",
        run: inspect::longlog,
        flags: "admin",
        keys: (0, 0, 0),
        summary: "Shows (GET), counts (LEN) or empties (RESET) the record of grants held and waits that lasted longer than flock.longlog-hold-ms and flock.longlog-wait-ms",
        complexity: "O(N) where N is the number of entries answered",
        arity: -2,
        key_flags: 0,
        acl: "admin slow dangerous",
        args: &[with_args(arg("subcommand", ONEOF), &[
            with_args(token("get", BLOCK, "GET"), &[optional(arg("count", INTEGER))]),
            token("len", PURE_TOKEN, "LEN"),
            token("reset", PURE_TOKEN, "RESET"),
        ])],
    },
    Command {
        name: "flock.fenced",
        // Its keys are the lock's and the command's: it names them when Redis
        // asks (Cluster, ACLs). The command it runs decides about memory
        // (deny-oom) as if it were called directly.
        run: fenced::fenced,
        flags: "write getkeys-api",
        keys: (0, 0, 0),
        summary: "Runs a command of the server only while the fencing token holds the lock (in any mode), in one step: the command's own reply, or STALE and nothing run",
        complexity: "O(1) and the command's own",
        arity: -4,
        key_flags: RO | ACCESS | INCOMPLETE,
        acl: "write",
        args: &[
            LOCK,
            arg("token", INTEGER),
            arg("command", STRING),
            ArgDoc { multiple: true, ..optional(arg("arg", STRING)) },
        ],
    },
    Command {
        name: "flock.cancel",
        run: commands::cancel,
        flags: "write fast",
        keys: (1, 1, 1),
        summary: "Ends the owner's wait for the lock, from any connection: 1 if it was waiting, 0 if not",
        complexity: "O(1)",
        arity: 3,
        key_flags: RW | UPDATE,
        acl: "write fast",
        args: &[LOCK, OWNER],
    },
    Command {
        name: "flock.session",
        run: commands::session,
        flags: "fast deny-script",
        keys: (0, 0, 0),
        summary: "Opens the connection's session (or names it, setting its timeout): waits sent with INBOX session-id from any connection are answered in its inbox; it lives while its connection sends FLOCK commands",
        complexity: "O(1)",
        arity: -1,
        key_flags: 0,
        acl: "connection fast",
        args: &[
            optional(token("ms", INTEGER, "TIMEOUT")),
            optional(token("withtimeout", PURE_TOKEN, "WITHTIMEOUT")),
        ],
    },
    Command {
        name: "flock.inbox",
        run: commands::inbox,
        flags: "blocking deny-script",
        keys: (0, 0, 0),
        summary: "Reads the connection's session inbox: grants, timeouts, cancellations, errors and losses, blocking until one comes",
        complexity: "O(N) where N is the number of events answered",
        arity: 2,
        key_flags: 0,
        acl: "connection slow blocking",
        args: &[arg("timeout-ms", INTEGER)],
    },
    Command {
        name: "flock.state",
        run: commands::state,
        flags: "write fast",
        keys: (1, 1, 1),
        summary: "Internal, kept for AOFs written before FLOCK.HOLDER carried every holder: sets a lock's exclusive holder",
        complexity: "O(1)",
        arity: -2,
        key_flags: RW | UPDATE,
        acl: "write fast admin dangerous",
        args: &[
            LOCK,
            with_args(optional(arg("holder", BLOCK)), &[
                OWNER,
                arg("holds", INTEGER),
                arg("token", INTEGER),
                arg("deadline-unix-ms", INTEGER),
                arg("session", INTEGER),
            ]),
        ],
    },
    Command {
        name: "flock.id",
        run: commands::request_id,
        flags: "write fast",
        keys: (1, 1, 1),
        summary: "Internal: remembers a request ID of a lock as its master or the AOF recorded it",
        complexity: "O(1)",
        arity: 6,
        key_flags: RW | UPDATE,
        acl: "write fast admin dangerous",
        args: &[LOCK, with_args(arg("request", BLOCK), RECORD)],
    },
    Command {
        name: "flock.free",
        run: commands::free,
        flags: "write fast",
        keys: (1, 1, 1),
        summary: "Internal: deletes a lock its master or the AOF left free, as DEL does, after the request ID it carries",
        complexity: "O(1)",
        arity: -2,
        key_flags: RW | UPDATE,
        acl: "write fast admin dangerous",
        args: &[LOCK, REQUEST],
    },
    Command {
        name: "flock.holder",
        run: commands::holder,
        flags: "write fast",
        keys: (1, 1, 1),
        summary: "Internal: sets a key's mode and one owner's grant of any kind (or that it holds none) as its master or the AOF recorded it",
        complexity: "O(1)",
        arity: -4,
        key_flags: RW | UPDATE,
        acl: "write fast admin dangerous",
        args: &[
            LOCK,
            arg("mode", STRING),
            arg("limit", INTEGER),
            with_args(optional(arg("grant", BLOCK)), &[
                OWNER,
                with_args(optional(arg("holder", BLOCK)), &[
                    arg("holds", INTEGER),
                    arg("token", INTEGER),
                    arg("deadline-unix-ms", INTEGER),
                    arg("session", INTEGER),
                    arg("permits", INTEGER),
                ]),
            ]),
            REQUEST,
        ],
    },
];
