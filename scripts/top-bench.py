#!/usr/bin/env python3
"""The operator's view at scale (issue 32's targets): a server holding LOCKS
idle locks, of which CONTENDED have a waiter each.

1. FLOCK.TOP's server time (INFO commandstats, usec_per_call) over 1,000
   calls each of the default (COUNT 10), COUNT 0 (all of them), BY hold and
   MATCH, beside FLOCK.OWNER and INFO flock.
2. What `redis-flock top` refreshing once a second costs the server: its CPU
   (used_cpu_user + used_cpu_sys) over SECONDS with the view running in tmux,
   against the same time with nothing but the waiters connected.

Usage: top-bench.py MODULE [LOCKS] [CONTENDED] [SECONDS]; `make bench-top`.
FLOCK_SERVER picks the server; PYTHON the interpreter that has redis_flock."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import redis


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(module, port, workdir):
    server = subprocess.Popen(
        [os.environ.get("FLOCK_SERVER") or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--dir", workdir, "--loadmodule", module],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port)
    for _ in range(200):
        try:
            r.ping()
            return server, r
        except redis.ConnectionError:
            time.sleep(0.05)
    server.kill()
    sys.exit("the server did not start")


def load(r, locks, contended, port):
    pipe = r.pipeline(transaction=False)
    for i in range(locks):
        pipe.execute_command("FLOCK.ACQUIRE", f"idle:{i:07}", f"o{i}", 3_600_000)
        if len(pipe) == 10_000:
            pipe.execute()
    pipe.execute()
    # One blocked client per contended lock: raw sockets, no reply awaited.
    waiters = []
    for i in range(contended):
        s = socket.create_connection(("127.0.0.1", port))
        words = [b"FLOCK.ACQUIRE", f"idle:{i * (locks // contended):07}".encode(), f"w{i}".encode(), b"3600000",
                 b"WAIT", b"0"]
        s.sendall(b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words))
        waiters.append(s)
    while int(r.info("flock")["flock_contended_locks"]) < contended:
        time.sleep(0.05)
    return waiters


def usec_per_call(r, command, args, calls=1000):
    r.config_resetstat()
    for _ in range(calls):
        r.execute_command(command, *args)
    stats = r.info("commandstats").get(f"cmdstat_{command.lower()}", {})
    return float(stats.get("usec_per_call", "nan"))


def cpu_seconds(r):
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def cpu_share(r, seconds):
    before, start = cpu_seconds(r), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(r) - before) / (time.monotonic() - start)


def main():
    module = os.path.abspath(sys.argv[1])
    locks = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    contended = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 30
    python = os.environ.get("PYTHON") or sys.executable
    tmux = shutil.which("tmux") or sys.exit("tmux is missing: `make deps-python`")
    with tempfile.TemporaryDirectory() as workdir:
        port = free_port()
        server, r = start(module, port, workdir)
        try:
            began = time.monotonic()
            waiters = load(r, locks, contended, port)
            print(f"{locks:,} locks, {contended} with a waiter, loaded in {time.monotonic() - began:.0f} s "
                  f"({r.info('server')['redis_version']})")
            print("server time per call (INFO commandstats usec_per_call, 1,000 calls each):")
            for label, command, args in [
                ("FLOCK.TOP", "FLOCK.TOP", []),
                ("FLOCK.TOP COUNT 0 (all)", "FLOCK.TOP", ["COUNT", 0]),
                ("FLOCK.TOP BY hold", "FLOCK.TOP", ["BY", "hold"]),
                ("FLOCK.TOP MATCH idle:00*", "FLOCK.TOP", ["MATCH", "idle:00*"]),
                ("FLOCK.OWNER w7", "FLOCK.OWNER", ["w7"]),
                ("INFO flock", "INFO", ["flock"]),
            ]:
                print(f"  {label:<28} {usec_per_call(r, command, args):8.1f} us")
            idle = cpu_share(r, seconds)
            session = f"flock-top-bench-{os.getpid()}"
            view = f"{python} -m redis_flock.cli top --url redis://127.0.0.1:{port} --interval 1"
            subprocess.run([tmux, "-L", session, "new-session", "-d", "-x", "160", "-y", "50", view], check=True)
            try:
                time.sleep(2)
                watched = cpu_share(r, seconds)
            finally:
                subprocess.run([tmux, "-L", session, "kill-server"], check=False)
            print(f"server CPU over {seconds:.0f} s: {idle * 100:.2f}% of a core with the waiters alone, "
                  f"{watched * 100:.2f}% with redis-flock top refreshing every second: "
                  f"{(watched - idle) * 100:+.2f} points")
            for s in waiters:
                s.close()
        finally:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
