//! One benchmark client: the synchronous connection through which every
//! method sends its requests, counting them and timing their writes.

use std::sync::OnceLock;
use std::time::Instant;

use redis::{Cmd, Connection, Pipeline, RedisResult, Value};

use crate::server::Server;

/// Nanoseconds since the first call: one clock for every thread, so that
/// events seen by different clients can be put in order.
pub fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// When a request was written: from just before the write to just after.
/// Of two requests written well apart (see `contended::ORDER_MARGIN_NS`),
/// the server reads the earlier one first.
#[derive(Clone, Copy, Debug, Default)]
pub struct Span {
    pub start: u64,
    pub end: u64,
}

/// What a client sent since its last `mark`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sent {
    pub requests: u64,
    /// The write of the first request.
    pub first: Option<Span>,
}

pub struct Client {
    conn: Connection,
    sent: Sent,
    /// Replies of `request_later` requests not read yet.
    unread: usize,
}

impl Client {
    pub fn open(server: &Server) -> RedisResult<Client> {
        Ok(Client { conn: server.connect()?, sent: Sent::default(), unread: 0 })
    }

    /// Starts counting afresh (one acquire, one pair, ...).
    pub fn mark(&mut self) {
        self.sent = Sent::default();
    }

    pub fn sent(&self) -> Sent {
        self.sent
    }

    /// Counts requests that went out on another connection of this client
    /// (redisson's pub/sub one).
    pub fn count_elsewhere(&mut self, requests: u64) {
        self.sent.requests += requests;
    }

    /// Sends `cmd` and waits for its reply; an error reply is an `Err`.
    pub fn request(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.send(cmd)?;
        self.read_unread()?;
        self.conn.recv_response()?.extract_error()
    }

    fn read_unread(&mut self) -> RedisResult<()> {
        while self.unread > 0 {
            self.conn.recv_response()?.extract_error()?;
            self.unread -= 1;
        }
        Ok(())
    }

    /// Sends `cmd` without waiting for its reply, as a client fires an
    /// asynchronous request and goes on; the next `request` reads it first.
    pub fn request_later(&mut self, cmd: &Cmd) -> RedisResult<()> {
        self.send(cmd)?;
        self.unread += 1;
        Ok(())
    }

    /// Reads the reply of a command `send` left unread.
    pub fn reply(&mut self) -> RedisResult<Value> {
        self.conn.recv_response()?.extract_error()
    }

    /// Sends `cmd` and leaves its reply unread.
    pub fn send(&mut self, cmd: &Cmd) -> RedisResult<()> {
        let packed = cmd.get_packed_command();
        let start = now_ns();
        self.conn.send_packed_command(&packed)?;
        let span = Span { start, end: now_ns() };
        self.sent.first.get_or_insert(span);
        self.sent.requests += 1;
        Ok(())
    }

    /// Sends all of `pipe` at once and reads every reply.
    pub fn pipeline(&mut self, pipe: &Pipeline) -> RedisResult<()> {
        self.read_unread()?;
        self.sent.requests += pipe.len() as u64;
        pipe.query(&mut self.conn)
    }
}
