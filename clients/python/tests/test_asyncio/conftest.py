"""redis.asyncio clients to the session's server (tests/conftest.py), RESP2
and RESP3, a blocking client (``inspect``) that reads the server's side, and
a redis.asyncio RedisCluster (``rc``) to the test Cluster."""

import pytest
import pytest_asyncio
import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from helpers import until


@pytest_asyncio.fixture()
async def r(server, protocol):
    c = redis.asyncio.Redis(port=server.port, protocol=protocol)
    yield c
    await c.flushall()
    await c.aclose()


@pytest_asyncio.fixture()
async def r_decoded(server, protocol):
    c = redis.asyncio.Redis(port=server.port, protocol=protocol, decode_responses=True)
    yield c
    await c.flushall()
    await c.aclose()


@pytest.fixture()
def inspect(server):
    c = redis.Redis(port=server.port)
    yield c
    c.flushall()
    c.close()


@pytest_asyncio.fixture()
async def rc(cluster):
    c = RedisCluster(host="127.0.0.1", port=cluster.ports()[0])
    yield c
    await c.aclose()
    # Sessions end with their connection: the next test starts with none.
    await until(lambda: cluster.sessions() == [0, 0, 0], what="the sessions of the last test to end")
    cluster.flushall()
