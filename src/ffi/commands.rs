//! The module's commands as Redis learns of them: each created from one
//! declaration (`Command`: name, handler, flags, keys, ACL categories and
//! what `COMMAND DOCS` and `COMMAND INFO` say), in a loop at load.

use std::mem::ManuallyDrop;
use std::os::raw::{c_char, c_int};

use redis_module::{raw, Context, RedisResult, RedisString};

/// A command's handler: its arguments are borrowed for the call (`run`).
pub type Handler = fn(&Context, &[RedisString]) -> RedisResult;

/// One argument of a command as `COMMAND DOCS` shows it.
pub struct ArgDoc {
    pub name: &'static str,
    pub kind: raw::RedisModuleCommandArgType,
    pub token: Option<&'static str>,
    pub optional: bool,
    /// It may be given any number of times (its command's last argument).
    pub multiple: bool,
    pub subargs: &'static [ArgDoc],
}

/// Everything Redis is told of one command.
pub struct Command {
    pub name: &'static str,
    pub run: Handler,
    /// `RedisModule_CreateCommand`'s flags.
    pub flags: &'static str,
    /// First key, last key, step (0 0 0: none, or found by the command).
    pub keys: (i32, i32, i32),
    pub summary: &'static str,
    pub complexity: &'static str,
    pub arity: i32,
    /// The flags of its key spec (the first argument), or 0: no key.
    pub key_flags: u32,
    /// ACL categories (space-separated) on servers that let modules set them.
    pub acl: &'static str,
    pub args: &'static [ArgDoc],
}

/// The module's commands, as one static table.
pub trait CommandTable {
    const ALL: &'static [Command];
}

/// What Redis calls for command `I` of `T`: Redis 7 passes a command no
/// datum of its own, so each gets its own function, made from its index.
extern "C" fn run<T: CommandTable, const I: usize>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let reply = with_args(ctx, argv, argc, |args| (T::ALL[I].run)(&context, args));
    context.reply(reply) as c_int
}

/// Runs `f` on a command's arguments as the crate's strings, borrowed from
/// Redis: made without `RedisModule_RetainString` and never freed. The
/// crate's `decode_args` retains each and frees it after the command, about
/// 60 instructions an argument, on every command (a tenth of what a client's
/// acquire costs the module beside the server's own work).
fn with_args<R>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    f: impl FnOnce(&[RedisString]) -> R,
) -> R {
    let len = usize::try_from(argc).unwrap_or(0);
    let raw: &[*mut raw::RedisModuleString] = if argv.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: Redis hands a command `argc` strings in `argv`, which it
        // owns and keeps alive until the command returns; `f` can only
        // borrow them (a handler that keeps one copies it: `RedisString`'s
        // `clone` makes a new string).
        unsafe { std::slice::from_raw_parts(argv, len) }
    };
    let args: Vec<ManuallyDrop<RedisString>> =
        raw.iter().map(|&s| ManuallyDrop::new(RedisString::from_redis_module_string(ctx, s))).collect();
    // SAFETY: `ManuallyDrop<T>` is `repr(transparent)` over `T`, so the
    // slice has the layout of `[RedisString]`; dropping the vector then
    // frees its buffer and none of Redis's strings.
    let args: &[RedisString] = unsafe { &*(std::ptr::from_ref(args.as_slice()) as *const [RedisString]) };
    f(args)
}

type CmdFunc = unsafe extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

macro_rules! runners {
    ($($i:literal)*) => {
        /// The most commands a table may have.
        const MAX_COMMANDS: usize = [$($i),*].len();
        fn runner<T: CommandTable>(i: usize) -> Option<CmdFunc> {
            match i {
                $($i => Some(run::<T, $i>),)*
                _ => None,
            }
        }
    };
}
runners!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23);

/// Creates every command of `T`, with its documentation and ACL categories
/// (plus `extra`, the module's own category, where it was added). An
/// error names the command Redis refused; missing documentation or
/// categories are only logged, as older servers lack those APIs.
pub fn create_commands<T: CommandTable>(ctx: &Context, extra: Option<&str>, since: &str) -> Result<(), String> {
    const { assert!(T::ALL.len() <= MAX_COMMANDS, "add runners for the new commands") };
    for (i, command) in T::ALL.iter().enumerate() {
        let (first, last, step) = command.keys;
        let (Ok(name), Ok(flags)) = (std::ffi::CString::new(command.name), std::ffi::CString::new(command.flags))
        else {
            return Err(format!("{} has a NUL in its name or flags", command.name));
        };
        // SAFETY: `ctx` is the load context; both strings are NUL-terminated
        // and Redis copies them; the function lives as long as the module.
        let created = unsafe {
            api!(RedisModule_CreateCommand)(ctx.ctx, name.as_ptr(), runner::<T>(i), flags.as_ptr(), first, last, step)
        };
        if created != raw::REDISMODULE_OK as c_int {
            return Err(format!("could not create {}", command.name));
        }
        if !set_command_info(ctx, command, since) {
            ctx.log_warning(&format!("could not set COMMAND DOCS for {}", command.name));
        }
        let categories = match extra {
            Some(extra) => format!("{} {extra}", command.acl),
            None => command.acl.to_string(),
        };
        if !set_acl_categories(ctx, command.name, &categories) {
            ctx.log_warning(&format!("could not put {} into the ACL categories {categories}", command.name));
        }
    }
    Ok(())
}

/// Registers `doc` for an already created command. Redis copies everything
/// it is given, so the C strings and arrays only live for this call.
fn set_command_info(ctx: &Context, doc: &Command, since: &str) -> bool {
    let mut strings: Vec<std::ffi::CString> = Vec::new();
    let mut cstr = |s: &str| -> *const c_char {
        strings.push(std::ffi::CString::new(s).unwrap_or_default());
        strings.last().map_or(std::ptr::null(), |c| c.as_ptr())
    };
    // Arrays are terminated by a zeroed entry.
    // A command whose first argument is numkeys takes that many keys after
    // it (as LMPOP): its key argument repeats, and its key spec counts them.
    let counted = doc.args.first().is_some_and(|a| a.name == "numkeys");
    fn args(
        docs: &[ArgDoc],
        counted: bool,
        cstr: &mut dyn FnMut(&str) -> *const c_char,
        keep: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
    ) -> *mut raw::RedisModuleCommandArg {
        let mut out: Vec<raw::RedisModuleCommandArg> = docs
            .iter()
            .map(|d| {
                // SAFETY: a C struct of pointers and integers: all zeroes is
                // its documented "unset" value.
                let mut arg: raw::RedisModuleCommandArg = unsafe { std::mem::zeroed() };
                arg.name = cstr(d.name);
                arg.type_ = d.kind;
                arg.key_spec_index =
                    if d.kind == raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY { 0 } else { -1 };
                arg.token = d.token.map_or(std::ptr::null(), &mut *cstr);
                arg.flags = if d.optional { raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int } else { 0 };
                if d.multiple || (counted && arg.key_spec_index == 0) {
                    arg.flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE as c_int;
                }
                if !d.subargs.is_empty() {
                    arg.subargs = args(d.subargs, counted, cstr, keep);
                }
                arg
            })
            .collect();
        // SAFETY: as above; a zeroed entry ends the array.
        out.push(unsafe { std::mem::zeroed() });
        let ptr = out.as_mut_ptr();
        keep.push(out);
        ptr
    }
    let mut keep = Vec::new();
    let args_ptr = args(doc.args, counted, &mut cstr, &mut keep);
    // SAFETY: C structs of integers, pointers and unions of them: all zeroes
    // is their "unset" value, and the second spec ends the array.
    let mut key_specs: [raw::RedisModuleCommandKeySpec; 2] = unsafe { std::mem::zeroed() };
    key_specs[0].flags = u64::from(doc.key_flags);
    key_specs[0].begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    key_specs[0].bs.index.pos = 1;
    if counted {
        key_specs[0].find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
        key_specs[0].fk.keynum.keynumidx = 0;
        key_specs[0].fk.keynum.firstkey = 1;
        key_specs[0].fk.keynum.keystep = 1;
    } else {
        key_specs[0].find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
        key_specs[0].fk.range.lastkey = 0;
        key_specs[0].fk.range.keystep = 1;
        key_specs[0].fk.range.limit = 0;
    }
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: cstr(doc.summary),
        complexity: cstr(doc.complexity),
        since: cstr(since),
        history: std::ptr::null_mut(),
        tips: std::ptr::null(),
        arity: doc.arity,
        // A command without a key (flags 0) has no key spec.
        key_specs: if doc.key_flags == 0 { std::ptr::null_mut() } else { key_specs.as_mut_ptr() },
        args: args_ptr,
    };
    let name = std::ffi::CString::new(doc.name).unwrap_or_default();
    // SAFETY: `ctx` is the load context; the name is NUL-terminated.
    let command = unsafe { api!(RedisModule_GetCommand)(ctx.ctx, name.as_ptr()) };
    // SAFETY: `command` is a live command; every pointer in `info` points
    // into `strings`, `keep`, `key_specs` or `version`, all alive until the
    // end of this function, and Redis copies what it keeps.
    !command.is_null() && unsafe { api!(RedisModule_SetCommandInfo)(command, &info) } == raw::REDISMODULE_OK as c_int
}

// Optional APIs: absent on Redis 7.0, so deliberately not in `required_apis!`;
// each checks for its function and, where it is missing, leaves Redis 7.0's
// behaviour (module commands in no ACL category) in place.

/// Registers the ACL category `name` so that rules such as `-@flock` work
/// (Redis 8.0+; only allowed while the module loads). False where the server
/// lacks the API or refuses the name.
pub fn add_acl_category(ctx: &Context, name: &std::ffi::CStr) -> bool {
    // SAFETY: reading a function pointer Redis filled in once, at load.
    match unsafe { raw::RedisModule_AddACLCategory } {
        // SAFETY: `ctx` is the loading context and `name` a NUL-terminated
        // string that Redis copies.
        Some(add) => (unsafe { add(ctx.ctx, name.as_ptr()) }) == raw::REDISMODULE_OK as c_int,
        None => false,
    }
}

/// Puts the already created command `name` into the ACL `categories`
/// (space-separated; Redis 7.2+ and Valkey, only while the module loads).
/// True where the server lacks the API (nothing to do); false if it refuses.
fn set_acl_categories(ctx: &Context, name: &str, categories: &str) -> bool {
    // SAFETY: reading a function pointer Redis filled in once, at load.
    let Some(set) = (unsafe { raw::RedisModule_SetCommandACLCategories }) else { return true };
    let (Ok(name), Ok(categories)) = (std::ffi::CString::new(name), std::ffi::CString::new(categories)) else {
        return false;
    };
    // SAFETY: `ctx` is the loading context; the name is NUL-terminated.
    let command = unsafe { api!(RedisModule_GetCommand)(ctx.ctx, name.as_ptr()) };
    // SAFETY: `command` is a live command; both strings outlive the call and
    // Redis copies what it keeps.
    !command.is_null() && unsafe { set(command, categories.as_ptr()) } == raw::REDISMODULE_OK as c_int
}
