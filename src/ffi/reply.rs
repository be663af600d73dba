//! Replies the crate does not make: ordered maps, raw byte strings and an
//! INFO section named after the module alone.

use std::os::raw::c_char;

use redis_module::{Context, InfoContext};

/// Starts a map reply that keeps field order (RESP3 map, RESP2 flat array).
pub fn reply_map(ctx: &Context, fields: usize) {
    // SAFETY: `ctx` is the running command's context; the caller sends
    // `fields` pairs after this.
    unsafe { api!(RedisModule_ReplyWithMap)(ctx.ctx, fields as _) };
}

pub fn reply_array(ctx: &Context, len: usize) {
    // SAFETY: as `reply_map`, with `len` elements.
    unsafe { api!(RedisModule_ReplyWithArray)(ctx.ctx, len as _) };
}

pub fn reply_bytes(ctx: &Context, bytes: &[u8]) {
    // SAFETY: Redis copies `len` bytes from the pointer during the call.
    unsafe { api!(RedisModule_ReplyWithStringBuffer)(ctx.ctx, bytes.as_ptr().cast::<c_char>(), bytes.len()) };
}

/// The module's `INFO` section: the crate's builder would name it
/// `flock_flock`; Redis prefixes each field with `flock_`. The numbers
/// first, then the texts.
pub fn info_section(ctx: &InfoContext, numbers: &[(&str, u64)], texts: &[(String, String)]) {
    // SAFETY: `ctx` is the INFO callback's context; a null name is the
    // module's default section.
    unsafe { api!(RedisModule_InfoAddSection)(ctx.ctx, std::ptr::null_mut()) };
    for &(name, value) in numbers {
        let name = std::ffi::CString::new(name).unwrap_or_default();
        // SAFETY: Redis copies the NUL-terminated name during the call.
        unsafe { api!(RedisModule_InfoAddFieldLongLong)(ctx.ctx, name.as_ptr(), value as i64) };
    }
    for (name, value) in texts {
        let name = std::ffi::CString::new(name.as_str()).unwrap_or_default();
        let value = std::ffi::CString::new(value.as_str()).unwrap_or_default();
        // SAFETY: Redis copies both NUL-terminated strings during the call.
        unsafe { api!(RedisModule_InfoAddFieldCString)(ctx.ctx, name.as_ptr(), value.as_ptr()) };
    }
}
