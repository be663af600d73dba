"""redis.asyncio clients to the session's server (tests/conftest.py), RESP2
and RESP3, and a blocking client (``inspect``) that reads the server's side."""

import pytest
import pytest_asyncio
import redis
import redis.asyncio


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
