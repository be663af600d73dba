//! A fault-injecting TCP proxy between a client and a test server: it
//! forwards each command and its reply, and when armed, it swallows the
//! server's reply to the Nth command of a given name and drops that client's
//! connection (and its server connection) instead. The command was applied,
//! but its reply is lost: the client sees a broken connection and resends,
//! as redis-py, ioredis, Lettuce and the Rust client do.
//!
//! It can also cut the client off ([`Proxy::partition`]): nothing is
//! carried either way (commands and replies read meanwhile are held back,
//! a close on one side is not passed on) and every socket stays open, as
//! under a network partition, a dead host or a frozen VM; [`Proxy::heal`]
//! carries what was held back, then goes on.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};

#[derive(Default)]
struct Trigger {
    /// Upper-case command name, and how many more of it pass before the one
    /// whose reply is dropped (0: the next one).
    armed: Option<(Vec<u8>, usize)>,
    /// Replies swallowed so far.
    dropped: usize,
    /// Commands forwarded so far, by upper-case name.
    seen: Vec<Vec<u8>>,
    /// Set by [`Proxy::kill`]: every connection closed, new ones refused.
    dead: bool,
    /// Upper-case command name whose first reply is swallowed as the
    /// process behind the proxy dies ([`Proxy::kill_at_reply_to`]).
    kill_at: Option<Vec<u8>>,
    /// Both ends of every connection so far, to close them on a kill.
    streams: Vec<TcpStream>,
    /// Client connections accepted so far, while cut too.
    accepted: usize,
}

impl Trigger {
    fn die(&mut self) {
        self.dead = true;
        for end in self.streams.drain(..) {
            let _ = end.shutdown(Shutdown::Both);
        }
    }
}

/// Whether bytes flow ([`Proxy::partition`], [`Proxy::heal`]).
#[derive(Default)]
struct Gate {
    cut: Mutex<bool>,
    healed: Condvar,
}

impl Gate {
    /// Returns once bytes flow.
    fn pass(&self) {
        let mut cut = self.cut.lock().expect("gate");
        while *cut {
            cut = self.healed.wait(cut).expect("gate");
        }
    }

    fn set(&self, cut: bool) {
        *self.cut.lock().expect("gate") = cut;
        self.healed.notify_all();
    }
}

pub struct Proxy {
    pub port: u16,
    trigger: Arc<Mutex<Trigger>>,
    gate: Arc<Gate>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to
    /// `127.0.0.1:server_port` (a thread per connection; they end with it).
    pub fn start(server_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let trigger = Arc::new(Mutex::new(Trigger::default()));
        let gate = Arc::new(Gate::default());
        let shared = Arc::clone(&trigger);
        let flow = Arc::clone(&gate);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                {
                    let mut t = shared.lock().expect("trigger");
                    if t.dead {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    }
                    t.accepted += 1;
                    if let Ok(end) = client.try_clone() {
                        t.streams.push(end);
                    }
                }
                let (trigger, gate) = (Arc::clone(&shared), Arc::clone(&flow));
                std::thread::spawn(move || {
                    let _ = forward(client, server_port, &trigger, &gate);
                });
            }
        });
        Proxy { port, trigger, gate }
    }

    /// Stops carrying bytes both ways, every socket kept open (a new
    /// connection is accepted and then carries nothing either).
    pub fn partition(&self) {
        self.gate.set(true);
    }

    /// Carries bytes again, those held back first.
    pub fn heal(&self) {
        self.gate.set(false);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The reply to the `nth` (1-based) `command` from now on, on any
    /// connection, is swallowed and that connection dropped. Once.
    pub fn drop_reply_to(&self, command: &str, nth: usize) {
        assert!(nth >= 1, "nth counts from 1");
        self.trigger.lock().expect("trigger").armed = Some((command.to_ascii_uppercase().into_bytes(), nth - 1));
    }

    /// The process behind this proxy dies: every connection through it is
    /// closed at both ends (the server sees its clients go, as when a
    /// process is killed) and every new one is closed at once, so the
    /// process cannot reconnect.
    pub fn kill(&self) {
        self.trigger.lock().expect("trigger").die();
        self.heal();
    }

    /// The process dies as the server answers the next `command`: that
    /// reply is lost with every connection, and no new one gets through.
    pub fn kill_at_reply_to(&self, command: &str) {
        self.trigger.lock().expect("trigger").kill_at = Some(command.to_ascii_uppercase().into_bytes());
    }

    /// Replies swallowed so far.
    pub fn dropped(&self) -> usize {
        self.trigger.lock().expect("trigger").dropped
    }

    /// How many client connections it accepted so far, while cut too: a
    /// client that opens a new one has given up an old one.
    pub fn accepted(&self) -> usize {
        self.trigger.lock().expect("trigger").accepted
    }

    /// How many `command`s went through so far (resends included).
    pub fn seen(&self, command: &str) -> usize {
        let name = command.to_ascii_uppercase().into_bytes();
        self.trigger.lock().expect("trigger").seen.iter().filter(|c| **c == name).count()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.heal();
    }
}

/// One client connection: command by command, so that each reply is known
/// to answer the command before it (pipelined commands queue up in the
/// client socket meanwhile). When one side closes, so does the other (once
/// bytes flow).
fn forward(client: TcpStream, server_port: u16, trigger: &Mutex<Trigger>, gate: &Gate) -> io::Result<()> {
    gate.pass();
    let server = TcpStream::connect(("127.0.0.1", server_port))?;
    let ends = (client.try_clone()?, server.try_clone()?);
    let relayed = relay(client, server, trigger, gate);
    gate.pass();
    let _ = ends.0.shutdown(Shutdown::Both);
    let _ = ends.1.shutdown(Shutdown::Both);
    relayed
}

fn relay(client: TcpStream, server: TcpStream, trigger: &Mutex<Trigger>, gate: &Gate) -> io::Result<()> {
    {
        let mut t = trigger.lock().expect("trigger");
        if t.dead {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
            return Ok(());
        }
        t.streams.push(server.try_clone()?);
    }
    let (mut to_client, mut to_server) = (client.try_clone()?, server.try_clone()?);
    let (mut from_client, mut from_server) = (BufReader::new(client), BufReader::new(server));
    loop {
        let mut command = Vec::new();
        let name = read_command(&mut from_client, &mut command)?;
        gate.pass();
        to_server.write_all(&command)?;
        let mut reply = Vec::new();
        read_value(&mut from_server, &mut reply)?;
        let swallow = {
            let mut t = trigger.lock().expect("trigger");
            t.seen.push(name.clone());
            let hit = match &mut t.armed {
                Some((armed, 0)) if *armed == name => true,
                Some((armed, left)) if *armed == name => {
                    *left -= 1;
                    false
                }
                _ => false,
            };
            if hit {
                t.armed = None;
                t.dropped += 1;
            }
            if t.kill_at.as_ref() == Some(&name) {
                t.kill_at = None;
                t.dropped += 1;
                t.die();
                return Ok(());
            }
            hit
        };
        if swallow {
            let _ = to_client.shutdown(Shutdown::Both);
            let _ = to_server.shutdown(Shutdown::Both);
            return Ok(());
        }
        gate.pass();
        to_client.write_all(&reply)?;
    }
}

fn read_line(r: &mut impl BufRead, out: &mut Vec<u8>) -> io::Result<Vec<u8>> {
    let start = out.len();
    if r.read_until(b'\n', out)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(out[start..].strip_suffix(b"\r\n").unwrap_or(&out[start..]).to_vec())
}

fn number(line: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(line).ok().and_then(|s| s.parse().ok()).ok_or_else(|| io::ErrorKind::InvalidData.into())
}

/// Copies one RESP command (an array of bulk strings, or an inline command)
/// into `out`; returns its name in upper case.
fn read_command(r: &mut impl BufRead, out: &mut Vec<u8>) -> io::Result<Vec<u8>> {
    let line = read_line(r, out)?;
    let Some(count) = line.strip_prefix(b"*") else {
        let name = line.split(|b| *b == b' ').next().unwrap_or_default();
        return Ok(name.to_ascii_uppercase());
    };
    let mut name = Vec::new();
    for i in 0..number(count)? {
        let start = out.len();
        read_value(r, out)?;
        if i == 0 {
            // `$len\r\nNAME\r\n`: the name sits after the first line.
            let arg = &out[start..];
            let body = arg.iter().position(|b| *b == b'\n').map_or(&arg[..0], |p| &arg[p + 1..]);
            name = body.strip_suffix(b"\r\n").unwrap_or(body).to_ascii_uppercase();
        }
    }
    Ok(name)
}

/// Copies one RESP2 or RESP3 value into `out`.
fn read_value(r: &mut impl BufRead, out: &mut Vec<u8>) -> io::Result<()> {
    let line = read_line(r, out)?;
    let (kind, rest) = line.split_first().ok_or(io::ErrorKind::InvalidData)?;
    match kind {
        b'$' | b'!' | b'=' => {
            let len = number(rest)?;
            if len >= 0 {
                let start = out.len();
                out.resize(start + len as usize + 2, 0);
                r.read_exact(&mut out[start..])?;
            }
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n = number(rest)?;
            let items = if matches!(kind, b'%' | b'|') { 2 * n } else { n };
            for _ in 0..items.max(0) {
                read_value(r, out)?;
            }
            if *kind == b'|' {
                // Attributes precede the value they describe.
                read_value(r, out)?;
            }
        }
        _ => {}
    }
    Ok(())
}
