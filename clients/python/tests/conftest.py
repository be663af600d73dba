"""A redis-server with the FLOCK module for the whole session, on a free
loopback port, and redis-py clients to it (RESP2 and RESP3)."""

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
import redis

from helpers import wait_until

REPO = Path(__file__).resolve().parents[3]
MODULE = os.environ.get("FLOCK_MODULE") or str(REPO / "target/release/libredis_flock.so")
SERVER = os.environ.get("FLOCK_SERVER") or "redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One redis-server process with the module; ``stop()`` kills it."""

    def __init__(self):
        if not Path(MODULE).is_file():
            pytest.exit(f"FLOCK module not found at {MODULE} (build it, or set FLOCK_MODULE)", 2)
        self.dir = tempfile.mkdtemp(prefix="flock-py-")
        self.port = free_port()
        self.log = open(Path(self.dir) / "server.log", "wb")
        self.start()

    def start(self):
        self.process = subprocess.Popen(
            [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--loadmodule", MODULE],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            wait_until(lambda: self._answers(client), timeout=10, what=f"redis-server on port {self.port}")
        except AssertionError:
            self.stop()
            raise
        finally:
            client.close()

    def kill(self):
        """Kills the server (no persistence: a new one starts empty)."""
        self.process.kill()
        self.process.wait()

    def _answers(self, client) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"redis-server exited: {(Path(self.dir) / 'server.log').read_text()}")
        try:
            return client.ping()
        except redis.ConnectionError:
            return False

    def stop(self):
        self.process.kill()
        self.process.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def protocol(request):
    return request.param


def client(server, protocol, **kwargs):
    return redis.Redis(port=server.port, protocol=protocol, **kwargs)


@pytest.fixture()
def r(server, protocol):
    c = client(server, protocol)
    yield c
    c.flushall()
    c.close()


@pytest.fixture()
def r_decoded(server, protocol):
    c = client(server, protocol, decode_responses=True)
    yield c
    c.flushall()
    c.close()
