//! [`SharedConnection`]: the process's shared command connections to one
//! server, which any thread sends short commands over.

use std::sync::Arc;

use redis::{Client, ConnectionLike, RedisResult, Value};

use crate::session;

/// The process's shared command connections to the server of a
/// `redis::Client` (a pool of at most four per server, whatever the number
/// of handles and threads): a [`ConnectionLike`] for short commands from
/// any thread, which reconnects by itself. Each command gives up after a
/// quarter of the session timeout (an I/O error): not for blocking commands.
/// [`Lock::acquire_on`](crate::Lock::acquire_on) and its kin acquire over
/// it, so that any number of threads wait without a connection each.
#[derive(Clone)]
pub struct SharedConnection {
    server: Arc<session::Server>,
}

impl SharedConnection {
    pub fn new(client: &Client) -> SharedConnection {
        SharedConnection::of(session::server(client))
    }

    pub(crate) fn of(server: Arc<session::Server>) -> SharedConnection {
        SharedConnection { server }
    }
}

impl std::fmt::Debug for SharedConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedConnection").field("server", &self.server.client().get_connection_info().addr).finish()
    }
}

impl ConnectionLike for SharedConnection {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.server.with_conn(|c| c.req_packed_command(cmd))
    }

    fn req_packed_commands(&mut self, cmd: &[u8], offset: usize, count: usize) -> RedisResult<Vec<Value>> {
        self.server.with_conn(|c| c.req_packed_commands(cmd, offset, count))
    }

    fn get_db(&self) -> i64 {
        self.server.client().get_connection_info().redis.db
    }

    fn check_connection(&mut self) -> bool {
        self.server.with_conn(|c| Ok(c.check_connection())).unwrap_or(false)
    }

    fn is_open(&self) -> bool {
        true
    }
}
