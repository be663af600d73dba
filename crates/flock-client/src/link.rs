//! The connection a lock's commands go over ([`Link`]): each command with a
//! fresh request ID, sent again with the same ID while its reply is lost,
//! over a new connection from the lock's client once the first one broke.

use redis::{Client, Cmd, Connection, ConnectionLike, FromRedisValue, RedisResult};

/// How many times a command whose reply was lost is sent again, with the
/// same request ID.
pub const RESENDS: usize = 3;

/// The connection a lock's commands go over, and where another comes from
/// when it breaks.
pub(crate) struct Link<C> {
    pub(crate) conn: C,
    pub(crate) client: Option<Client>,
    /// From `client`, once `conn` broke.
    pub(crate) spare: Option<Connection>,
}

impl<C: ConnectionLike> Link<C> {
    /// Sends `cmd` with a fresh request ID, and again with the same ID (up
    /// to [`RESENDS`] times) while its reply is lost.
    pub(crate) fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<T> {
        let mut cmd = cmd.clone();
        cmd.arg("ID").arg(uuid::Uuid::new_v4().to_string());
        self.send(&cmd)
    }

    /// Sends `cmd` as it is, again while its reply is lost.
    pub(crate) fn send<T: FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<T> {
        let mut resends = 0;
        loop {
            match self.current().and_then(|conn| cmd.query(conn)) {
                Err(e) if e.is_io_error() && resends < RESENDS => resends += 1,
                result => return result,
            }
        }
    }

    /// `conn`, or a connection from `client` while `conn` is broken and
    /// there is a client to reconnect with.
    pub(crate) fn current(&mut self) -> RedisResult<&mut dyn ConnectionLike> {
        let Some(client) = self.client.as_ref().filter(|_| !self.conn.is_open()) else { return Ok(&mut self.conn) };
        let spare = match self.spare.take().filter(ConnectionLike::is_open) {
            Some(spare) => spare,
            None => client.get_connection()?,
        };
        Ok(self.spare.insert(spare))
    }
}
