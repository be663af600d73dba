//! Clients blocked in `FLOCK.ACQUIRE ... WAIT`: blocking, the one unblock,
//! and the callbacks Redis calls around it.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::os::raw::c_int;
use std::ptr::NonNull;

use redis_module::{raw, Context, RedisResult};

use super::RawCtx;

/// What the module does when Redis calls a blocked client's callbacks.
pub trait BlockHandlers: 'static {
    /// What a client is unblocked with; the reply is made from it.
    type Answer;
    /// Replies to a client the module unblocked (`None`: no answer reached
    /// it, which the module never does).
    fn reply(ctx: &Context, answer: Option<&mut Self::Answer>) -> RedisResult;
    /// Runs once per unblock, after `reply` if the client was still there.
    /// `ctx` has no client: no key may be opened through it.
    fn free(answer: Self::Answer);
    /// The client closed its connection while blocked, or after it was
    /// unblocked (Redis calls this then too).
    fn disconnect(ctx: &Context, id: BlockedId);
    /// `CLIENT UNBLOCK` of a blocked client (Redis's timeout callback; its
    /// own timeout is never set): the reply to the unblocked client.
    fn unblock_command(ctx: &Context, id: Option<BlockedId>) -> RedisResult;
}

/// A client blocked with handlers whose answer is `A`. Not `Copy`: the one
/// value that can end the block, consumed by `unblock`, so that a client
/// is unblocked exactly once.
#[derive(Debug)]
pub struct BlockedClient<A> {
    bc: NonNull<raw::RedisModuleBlockedClient>,
    answer: PhantomData<fn(A)>,
}

/// Which blocked client: what queues and callbacks name it by. Only an
/// identity, never dereferenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockedId(NonNull<raw::RedisModuleBlockedClient>);

impl BlockedId {
    fn from_raw(bc: *mut raw::RedisModuleBlockedClient) -> Option<Self> {
        NonNull::new(bc).map(Self)
    }
}

/// Blocks the calling client, with `H`'s callbacks; `None` if the server
/// would not.
pub fn block<H: BlockHandlers>(ctx: &Context) -> Option<BlockedClient<H::Answer>> {
    // Redis-side timeout 0: WAIT limits are enforced by module timers, so a
    // grant, a timeout and a deletion all end in one UnblockClient call.
    // SAFETY: `ctx` is the running command's context; the callbacks match
    // the types Redis calls them with.
    let bc = unsafe {
        api!(RedisModule_BlockClient)(ctx.ctx, Some(on_reply::<H>), Some(on_timeout::<H>), Some(on_free::<H>), 0)
    };
    let bc = NonNull::new(bc)?;
    // SAFETY: `bc` was just returned by BlockClient and is not unblocked yet.
    unsafe { api!(RedisModule_SetDisconnectCallback)(bc.as_ptr(), Some(on_disconnect::<H>)) };
    Some(BlockedClient { bc, answer: PhantomData })
}

impl<A> BlockedClient<A> {
    pub fn id(&self) -> BlockedId {
        BlockedId(self.bc)
    }

    /// Ends the block; `answer` reaches the reply and free callbacks.
    pub fn unblock(self, answer: A) {
        let data = Box::into_raw(Box::new(answer)).cast::<c_void>();
        // SAFETY: `self` is consumed, so this runs once per handle, while
        // Redis still owns it. `data` is an `A` leaked here, the type `on_reply`
        // and `on_free` of the handlers this client was blocked with read.
        unsafe { api!(RedisModule_UnblockClient)(self.bc.as_ptr(), data) };
    }
}

unsafe extern "C" fn on_reply<H: BlockHandlers>(ctx: RawCtx, _: *mut *mut raw::RedisModuleString, _: c_int) -> c_int {
    // SAFETY: the private data is null or the `H::Answer` given to
    // `unblock` (see `BlockedClient::unblock`); Redis keeps it until `on_free`.
    let answer = unsafe { api!(RedisModule_GetBlockedClientPrivateData)(ctx).cast::<H::Answer>().as_mut() };
    let context = Context::new(ctx);
    context.reply(H::reply(&context, answer));
    raw::REDISMODULE_OK as c_int
}

unsafe extern "C" fn on_timeout<H: BlockHandlers>(ctx: RawCtx, _: *mut *mut raw::RedisModuleString, _: c_int) -> c_int {
    // SAFETY: `ctx` is the context of the client being timed out.
    let id = BlockedId::from_raw(unsafe { api!(RedisModule_GetBlockedClientHandle)(ctx) });
    let context = Context::new(ctx);
    context.reply(H::unblock_command(&context, id));
    raw::REDISMODULE_OK as c_int
}

unsafe extern "C" fn on_free<H: BlockHandlers>(_: RawCtx, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: `data` is the `H::Answer` leaked by `unblock`; Redis calls this
    // once per unblock, after the last use of it.
    H::free(*unsafe { Box::from_raw(data.cast::<H::Answer>()) });
}

unsafe extern "C" fn on_disconnect<H: BlockHandlers>(ctx: RawCtx, bc: *mut raw::RedisModuleBlockedClient) {
    if let Some(id) = BlockedId::from_raw(bc) {
        H::disconnect(&Context::new(ctx), id);
    }
}
