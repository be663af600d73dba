//! The session reader's connection ([`ReaderConnection`]): a socket of its
//! own under the redis crate's command API, because a read with a socket
//! timeout fails with EINTR once its process is stopped and continued
//! (SIGSTOP, a frozen VM: signal(7), "Interruption of system calls by stop
//! signals"), and the crate's own connection then counts the reply still on
//! its way as one to skip. The reader would end its session at any pause,
//! however short. Here an interrupted read is taken up again for the time
//! left to its deadline.

use std::io::{self, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
#[cfg(unix)]
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ConnectionInfo, ConnectionLike, ErrorKind, Parser, RedisError, RedisResult, Value};

enum Socket {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

impl Socket {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_read_timeout(timeout),
            #[cfg(unix)]
            Socket::Unix(s) => s.set_read_timeout(timeout),
        }
    }

    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_write_timeout(timeout),
            #[cfg(unix)]
            Socket::Unix(s) => s.set_write_timeout(timeout),
        }
    }
}

/// Reads until a deadline, an interrupted read (EINTR) taken up again with
/// the time left.
struct Patient {
    socket: Socket,
    deadline: Instant,
}

impl Read for Patient {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.socket.set_read_timeout(Some(left))?;
            let read = match &mut self.socket {
                Socket::Tcp(s) => s.read(buf),
                #[cfg(unix)]
                Socket::Unix(s) => s.read(buf),
            };
            match read {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                read => return read,
            }
        }
    }
}

impl Write for Patient {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.socket {
            Socket::Tcp(s) => s.write(buf),
            #[cfg(unix)]
            Socket::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// RESP2 over a socket of its own; any I/O error leaves it closed.
pub(crate) struct ReaderConnection {
    io: BufReader<Patient>,
    parser: Parser,
    db: i64,
    open: bool,
}

impl ReaderConnection {
    /// Connects as the redis crate would to `info` (its address, user,
    /// password and database), every step within `timeout`, which is also
    /// each read's until [`ReaderConnection::read_until`] sets a deadline.
    pub(crate) fn open(info: &ConnectionInfo, timeout: Duration) -> RedisResult<Self> {
        let socket = match &info.addr {
            ConnectionAddr::Tcp(host, port) => Socket::Tcp(connect_tcp(host, *port, timeout)?),
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => Socket::Unix(UnixStream::connect(path)?),
            other => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "no FLOCK session over",
                    other.to_string(),
                )))
            }
        };
        socket.set_write_timeout(Some(timeout))?;
        let mut conn = ReaderConnection {
            io: BufReader::new(Patient { socket, deadline: Instant::now() + timeout }),
            parser: Parser::new(),
            db: info.redis.db,
            open: true,
        };
        let redis = &info.redis;
        if let Some(password) = &redis.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(username) = &redis.username {
                auth.arg(username);
            }
            auth.arg(password).query::<()>(&mut conn)?;
        }
        if redis.db != 0 {
            redis::cmd("SELECT").arg(redis.db).query::<()>(&mut conn)?;
        }
        Ok(conn)
    }

    /// The deadline of the reads from now on.
    pub(crate) fn read_until(&mut self, deadline: Instant) {
        self.io.get_mut().deadline = deadline;
    }

    fn closing<T>(&mut self, result: RedisResult<T>) -> RedisResult<T> {
        if result.as_ref().is_err_and(RedisError::is_io_error) {
            self.open = false;
        }
        result
    }

    fn send(&mut self, bytes: &[u8]) -> RedisResult<()> {
        let sent = self.io.get_mut().write_all(bytes).map_err(RedisError::from);
        self.closing(sent)
    }

    fn reply(&mut self) -> RedisResult<Value> {
        let value = self.parser.parse_value(&mut self.io);
        self.closing(value)
    }
}

fn connect_tcp(host: &str, port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host}:{port} resolves to no address"));
    for addr in (host, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

impl ConnectionLike for ReaderConnection {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.send(cmd)?;
        self.reply()
    }

    fn req_packed_commands(&mut self, cmd: &[u8], offset: usize, count: usize) -> RedisResult<Vec<Value>> {
        self.send(cmd)?;
        let mut replies = Vec::with_capacity(count);
        for i in 0..offset + count {
            let reply = self.reply()?;
            if i >= offset {
                replies.push(reply);
            }
        }
        Ok(replies)
    }

    fn get_db(&self) -> i64 {
        self.db
    }

    fn check_connection(&mut self) -> bool {
        redis::cmd("PING").query::<()>(self).is_ok()
    }

    fn is_open(&self) -> bool {
        self.open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_gives_up_at_its_deadline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let info: ConnectionInfo = format!("redis://{}/", listener.local_addr().unwrap()).parse().unwrap();
        let mut conn = ReaderConnection::open(&info, Duration::from_secs(5)).unwrap();
        let start = Instant::now();
        conn.read_until(start + Duration::from_millis(200));
        let err = redis::cmd("PING").query::<()>(&mut conn).unwrap_err();
        assert!(err.is_io_error() && !conn.is_open());
    }
}
