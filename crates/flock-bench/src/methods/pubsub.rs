//! The pub/sub connection on which a Redisson-style waiter hears its
//! wake-ups, and the way it waits. A plain socket read with the `redis` parser, so that a wait
//! that times out leaves the connection usable.

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use redis::{Cmd, Parser, RedisResult, Value};

use crate::client::Client;
use crate::stop::Stop;

pub struct Subscriber {
    reader: BufReader<TcpStream>,
    parser: Parser,
}

impl Subscriber {
    pub fn connect(port: u16) -> RedisResult<Subscriber> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        Ok(Subscriber { reader: BufReader::new(stream), parser: Parser::new() })
    }

    fn write(&mut self, cmd: &mut Cmd, channel: &str) -> RedisResult<()> {
        Ok(self.reader.get_mut().write_all(&cmd.arg(channel).get_packed_command())?)
    }

    /// Subscribes to `channel` and waits for the confirmation, skipping what
    /// earlier waits left unread (late wake-ups, unsubscribe replies): as a
    /// Redisson entry, a new subscription starts with no wake-up pending.
    pub fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        self.reader.get_ref().set_read_timeout(None)?;
        self.write(&mut redis::cmd("SUBSCRIBE"), channel)?;
        while !is_subscribed(&self.parser.parse_value(&mut self.reader)?, channel) {}
        Ok(())
    }

    /// Redisson does not wait for the unsubscription either.
    pub fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        self.write(&mut redis::cmd("UNSUBSCRIBE"), channel)
    }

    /// Waits for a wake-up or `timeout`, whichever comes first: the
    /// message's payload, `None` on timeout.
    pub fn wait(&mut self, timeout: Duration) -> RedisResult<Option<Vec<u8>>> {
        self.reader.get_ref().set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        match self.parser.parse_value(&mut self.reader) {
            Err(e) if e.is_timeout() => Ok(None),
            Err(e) => Err(e),
            Ok(Value::Array(items)) => match items.into_iter().nth(2) {
                Some(Value::BulkString(payload)) => Ok(Some(payload)),
                _ => Ok(Some(Vec::new())),
            },
            Ok(_) => Ok(Some(Vec::new())),
        }
    }
}

/// The reply `subscribe <channel> <count>`.
fn is_subscribed(reply: &Value, channel: &str) -> bool {
    let Value::Array(items) = reply else { return false };
    matches!(items.as_slice(), [Value::BulkString(kind), Value::BulkString(name), _]
        if kind == b"subscribe" && name == channel.as_bytes())
}

/// What one Redisson try answered.
pub enum Try {
    Granted,
    /// Refused: wait at most this many ms (`None`: until a wake-up) and try again.
    Wait(Option<u64>),
}

/// How a Redisson client waits for a lock or permits: try; if refused,
/// subscribe to `channel`, then try again before every wait, so that a
/// wake-up published before the subscription is not missed; wait for a
/// message or the time the try returned, whichever comes first; unsubscribe
/// once granted. False if the run ended first.
pub fn acquire_as_redisson(
    wakeups: &mut Subscriber,
    c: &mut Client,
    channel: &str,
    stop: &Stop,
    mut attempt: impl FnMut(&mut Client) -> RedisResult<Try>,
) -> RedisResult<bool> {
    if let Try::Granted = attempt(c)? {
        return Ok(true);
    }
    wakeups.subscribe(channel)?;
    let held = loop {
        let wait = match attempt(c)? {
            Try::Granted => break true,
            Try::Wait(ms) => ms,
        };
        if stop.is_set() {
            break false;
        }
        let left = stop.remaining();
        wakeups.wait(wait.map_or(left, |ms| Duration::from_millis(ms).min(left)))?;
    };
    wakeups.unsubscribe(channel)?;
    c.count_elsewhere(2);
    Ok(held)
}
