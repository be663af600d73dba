//! Running another command of the server from inside one of ours
//! (`FLOCK.FENCED`), and naming its keys when Redis asks where they are.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::{raw, Context, RedisString};

/// Runs command `name` with `args` as the calling client
/// would: its ACL rules (`C`), as in a script (`S`, so nothing that scripts
/// may not run), refused out of memory when it is a `deny-oom` command
/// (`M`), propagated to replicas and the AOF as its own effects (`!`), its
/// reply in the caller's protocol (`0`). That reply becomes this command's.
/// On `Err` nothing ran and nothing was replied: it holds the `errno` of
/// `RedisModule_Call` (EACCES: ACL; ENOSPC: out of memory; EPERM, ENETDOWN,
/// EROFS: Cluster; ESPIPE: not allowed in scripts; ENOENT, EINVAL: unknown
/// command, wrong arity).
pub fn call_replying(ctx: &Context, name: &CStr, args: &[RedisString]) -> Result<(), i32> {
    let mut argv: Vec<*mut raw::RedisModuleString> = args.iter().map(|a| a.inner).collect();
    // SAFETY: `ctx` is the running command's; the name is NUL-terminated;
    // the format's `v` takes the array of `argc` strings that `argv` holds,
    // each alive in `args` for the call (Redis takes its own references).
    let reply =
        unsafe { api!(RedisModule_Call)(ctx.ctx, name.as_ptr(), c"!CSM0v".as_ptr(), argv.as_mut_ptr(), argv.len()) };
    if reply.is_null() {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    // SAFETY: `reply` is the live reply above, replied once and then freed
    // once; nothing else holds it.
    unsafe {
        api!(RedisModule_ReplyWithCallReply)(ctx.ctx, reply);
        api!(RedisModule_FreeCallReply)(reply);
    }
    Ok(())
}

/// Whether the calling client's user may run `command` (its name, then its
/// arguments) on its keys, by its ACL rules. Asked before the call, not
/// left to the call's own check (`C`): Valkey 9.1 crashes in that check
/// when it denies. A denial goes into `ACL LOG` as the command's (`object`,
/// its name in lower case): the server checked the keys already, as the
/// outer command's (`report_keys`), and logged any it denied.
pub fn permitted(ctx: &Context, command: &[RedisString]) -> bool {
    // SAFETY: `ctx` is the running command's; the name it returns is ours
    // to free, once, below.
    let name = unsafe { api!(RedisModule_GetCurrentUserName)(ctx.ctx) };
    if name.is_null() {
        return false;
    }
    // SAFETY: `name` is the live string above; the user it returns, if
    // any, is ours to free, once, below.
    let user = unsafe { api!(RedisModule_GetModuleUserFromUserName)(name) };
    // SAFETY: `name` is freed once, with no context (it was made without one).
    unsafe { api!(RedisModule_FreeString)(std::ptr::null_mut(), name) };
    if user.is_null() {
        return false;
    }
    let mut argv: Vec<*mut raw::RedisModuleString> = command.iter().map(|a| a.inner).collect();
    // SAFETY: `user` is live until freed below; `argv` holds `argc` live
    // strings for the call.
    let allowed = unsafe { api!(RedisModule_ACLCheckCommandPermissions)(user, argv.as_mut_ptr(), argv.len() as c_int) }
        == raw::REDISMODULE_OK as c_int;
    if !allowed {
        let object = RedisString::create_from_slice(ctx.ctx, &command[0].as_slice().to_ascii_lowercase());
        let reason = raw::RedisModuleACLLogEntryReason_REDISMODULE_ACL_LOG_CMD;
        // SAFETY: `ctx` is the running command's, `user` live until freed
        // below; Redis copies what it logs.
        unsafe { api!(RedisModule_ACLAddLogEntry)(ctx.ctx, user, object.inner, reason) };
    }
    // SAFETY: the user above, freed once.
    unsafe { api!(RedisModule_FreeModuleUser)(user) };
    allowed
}

/// Answers Redis's question where the keys are (Cluster routing, ACLs):
/// `lock_pos` read-only, then the keys of the command that starts at
/// `command_pos`, with the access that command declares for each. A
/// command the server does not know, or of the wrong arity, has none.
pub fn report_keys(ctx: &Context, args: &[RedisString], lock_pos: usize, command_pos: usize) {
    let ro = (raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS) as c_int;
    // SAFETY: `ctx` is the keys-position request's context; the position
    // is one of its arguments.
    unsafe { api!(RedisModule_KeyAtPosWithFlags)(ctx.ctx, lock_pos as c_int, ro) };
    let Some(command) = args.get(command_pos..).filter(|c| !c.is_empty()) else { return };
    let mut argv: Vec<*mut raw::RedisModuleString> = command.iter().map(|a| a.inner).collect();
    let (mut count, mut flags): (c_int, *mut c_int) = (0, std::ptr::null_mut());
    // SAFETY: `argv` holds `argc` live strings for the call; Redis writes
    // the count and a flags array (ours to free) and returns the positions
    // (ours to free), or NULL with nothing to free.
    let positions = unsafe {
        api!(RedisModule_GetCommandKeysWithFlags)(
            ctx.ctx,
            argv.as_mut_ptr(),
            argv.len() as c_int,
            &mut count,
            &mut flags,
        )
    };
    if positions.is_null() {
        return;
    }
    for i in 0..usize::try_from(count).unwrap_or(0) {
        // SAFETY: both arrays hold `count` entries; each position indexes
        // `command`, which starts at `command_pos` of this command.
        unsafe {
            let at = *positions.add(i) + command_pos as c_int;
            api!(RedisModule_KeyAtPosWithFlags)(ctx.ctx, at, *flags.add(i));
        }
    }
    // SAFETY: the two arrays Redis allocated for this call, freed once.
    unsafe {
        api!(RedisModule_Free)(positions.cast());
        api!(RedisModule_Free)(flags.cast());
    }
}
