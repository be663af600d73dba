"""A PostgreSQL server of a test's own (Debian's package), in a temporary
directory on a free loopback port with trust authentication, started as the
tests start redis-server. As root (CI) it runs as the package's `postgres`
user, which the server requires."""

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import free_port


class Postgres:
    def __init__(self):
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            pytest.fail("PostgreSQL is not installed: `make deps-python` installs Debian's postgresql")
        bin_dir = Path(found[-1]).parent
        self.dir = tempfile.mkdtemp(prefix="flock-pg-")
        as_user = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            as_user = ["runuser", "-u", "postgres", "--"]
        data = os.path.join(self.dir, "data")
        subprocess.run(
            [*as_user, bin_dir / "initdb", "-D", data, "--auth=trust", "-U", "flock"],
            check=True, capture_output=True,
        )
        self.port = free_port()
        self.server = subprocess.Popen(
            [*as_user, bin_dir / "postgres", "-D", data, "-p", str(self.port), "-k", self.dir,
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.db = self.connect(deadline=time.monotonic() + 30)

    def connect(self, deadline=None):
        """A new autocommit connection (psycopg), waiting until `deadline`
        (time.monotonic()) for the server to take it."""
        import psycopg

        while True:
            try:
                return psycopg.connect(host="127.0.0.1", port=self.port, user="flock", dbname="postgres", autocommit=True)
            except psycopg.OperationalError:
                if deadline is None or time.monotonic() > deadline or self.server.poll() is not None:
                    raise
                time.sleep(0.05)

    def close(self):
        self.db.close()
        self.server.terminate()
        self.server.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)
