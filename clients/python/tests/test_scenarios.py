"""The shared client scenarios (clients/scenarios.json, clients/SCENARIOS.md),
played through redis_flock's public API: every scenario twice, once with
threads (``redis_flock``) and once with asyncio tasks
(``redis_flock.asyncio``).

- A process is one redis-py client (a pool of its own, so a session of its
  own), connected through a proxy of its own (tests/helpers.py's
  ReplyDropper): ``drop_next_reply`` arms it, ``kill_process`` kills it (no
  connection gets through any more, as from a dead process), ``CLIENT KILL``s
  the process's connections (found by their client name) and closes the
  client, which ends its actors' waits.
- An actor is one thread (a worker thread that runs the actor's calls in
  order) or one task (a task that runs them in order), with lock objects of
  its own, made reentrant: an owner of its own that reenters. Per key, a
  ``ReadWriteLock`` (``write_lock()`` exclusive, ``read_lock()`` shared, one
  owner) or, for ``permits``, a ``Semaphore``.
- ``cancel``: threads, the CancelToken given to the started ``acquire``;
  asyncio, ``Task.cancel()`` of the actor's task.
- ``session_timeout_ms``: every lock object gets ``session_timeout=``.
  ``partition``/``heal`` cut the process's proxy off and heal it. A loss's
  time is when ``on_lost`` was called, a grant's when ``acquire()`` returned
  True, both on time.monotonic(): ``expect_lost_before`` compares them.
- FLOCK.INFO, FLOCK.FORCERELEASE, CLIENT KILL, DUMP/RESTORE and CONFIG SET
  go on a raw connection of the runner's own. Awaits poll with a deadline;
  nothing sleeps a fixed time.
"""

import asyncio
import inspect
import json
import os
import queue
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
import redis
import redis.asyncio
from redis.exceptions import LockNotOwnedError, ResponseError

import redis_flock
import redis_flock.asyncio
from helpers import ReplyDropper, holding, info

DEADLINE = 10.0


def scenarios_file() -> Path:
    """clients/scenarios.json: FLOCK_SCENARIOS if set, else found upwards from
    this file (clients/python/tests -> clients)."""
    if os.environ.get("FLOCK_SCENARIOS"):
        return Path(os.environ["FLOCK_SCENARIOS"])
    here = Path(__file__).resolve().parent
    for directory in (here, *here.parents):
        for candidate in (directory / "scenarios.json", directory / "clients" / "scenarios.json"):
            if candidate.is_file():
                return candidate
    raise FileNotFoundError(f"clients/scenarios.json not found above {here} (set FLOCK_SCENARIOS)")


SCENARIOS = json.loads(scenarios_file().read_text())["scenarios"]
NAMES = [scenario["name"] for scenario in SCENARIOS]
assert len(set(NAMES)) == len(NAMES), "scenario names must be unique"


# --- Outcomes ------------------------------------------------------------------

CANCELLED = ("cancelled", None)


def error_code(error: BaseException) -> str:
    """The server's error code the client raised (NOTOWNER, UPGRADE, ...)."""
    if isinstance(error, LockNotOwnedError):
        return "NOTOWNER"
    if isinstance(error, redis_flock.UpgradeError):
        return "UPGRADE"
    if isinstance(error, redis_flock.WrongModeError):
        return "WRONGMODE"
    return str(error).split(" ", 1)[0]


def acquire_outcome(result) -> str:
    kind, value = result
    if kind == "cancelled" or isinstance(value, redis_flock.AcquireCancelled):
        return "cancelled"
    if kind == "ok":
        return "granted" if value else "busy"
    if isinstance(value, (ResponseError, LockNotOwnedError)):
        return f"error:{error_code(value)}"
    raise value


# --- Actors: a thread or a task that runs its calls in order -------------------


class ThreadActor:
    def __init__(self, name: str):
        self.name = name
        self.calls: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=f"actor {name}", daemon=True)
        self.thread.start()

    def run(self, fn):
        """``fn()`` on the actor's thread: an asyncio future of ("ok", result)
        or ("error", exception)."""
        future: Future = Future()
        self.calls.put((fn, future))
        return asyncio.wrap_future(future)

    def _run(self) -> None:
        while True:
            item = self.calls.get()
            if item is None:
                return
            fn, future = item
            try:
                future.set_result(("ok", fn()))
            except BaseException as e:
                future.set_result(("error", e))

    def stop(self) -> None:
        self.calls.put(None)


class TaskActor:
    def __init__(self, name: str):
        self.name = name
        self.calls: asyncio.Queue = asyncio.Queue()
        self.cancelling = False
        self.stopping = False
        self.task = asyncio.create_task(self._run(), name=f"actor {name}")

    def run(self, fn):
        """``fn()`` (awaited if it returns an awaitable) in the actor's task."""
        future = asyncio.get_running_loop().create_future()
        self.calls.put_nowait((fn, future))
        return future

    def cancel(self) -> None:
        self.cancelling = True
        self.task.cancel()

    async def _run(self) -> None:
        while True:
            fn, future = await self.calls.get()
            try:
                result = fn()
                if inspect.isawaitable(result):
                    result = await result
                future.set_result(("ok", result))
            except asyncio.CancelledError:
                if self.stopping or not self.cancelling:
                    future.cancel()
                    raise
                # The runner's cancel: the actor's call ends cancelled, the
                # actor goes on.
                self.cancelling = False
                if hasattr(self.task, "uncancel"):
                    self.task.uncancel()
                future.set_result(CANCELLED)
            except BaseException as e:
                future.set_result(("error", e))

    def stop(self) -> None:
        self.stopping = True
        self.task.cancel()


class Actor:
    """One actor: its worker (thread or task), its lock objects, its started
    acquire."""

    def __init__(self, name, process, worker):
        self.name = name
        self.process = process
        self.worker = worker
        self.locks: dict = {}
        # The lock object last acquired per key: its owner, holds and loss.
        self.last: dict = {}
        self.started = None
        self.cancel_token = None
        # When its last acquire returned True (time.monotonic()).
        self.granted_at = None
        # The owner of each lock object's last grant (timed).
        self.owners: dict = {}


class Process:
    def __init__(self, name, client, proxy):
        self.name = name
        self.client = client
        self.proxy = proxy
        self.actors: list = []
        self.killed = False


# --- The flavours --------------------------------------------------------------


class Threads:
    module = redis_flock

    def client(self, port, name):
        return redis.Redis(host="127.0.0.1", port=port, client_name=name)

    def actor(self, name):
        return ThreadActor(name)

    def acquire_call(self, actor, lock, wait_ms, started):
        """What the actor calls to acquire: a try, or a wait of ``wait_ms``
        (with a CancelToken when it is started, for ``cancel``)."""
        if wait_ms == 0:
            return lambda: lock.acquire(blocking=False)
        token = None
        if started:
            token = actor.cancel_token = redis_flock.CancelToken()
        return lambda: lock.acquire(blocking=True, blocking_timeout=wait_ms / 1000, cancel=token)

    def cancel(self, actor):
        assert actor.cancel_token is not None, f"{actor.name} started no acquire to cancel"
        actor.cancel_token.cancel()

    async def close(self, client):
        client.close()


class Tasks:
    module = redis_flock.asyncio

    def client(self, port, name):
        return redis.asyncio.Redis(host="127.0.0.1", port=port, client_name=name)

    def actor(self, name):
        return TaskActor(name)

    def acquire_call(self, actor, lock, wait_ms, started):
        if wait_ms == 0:
            return lambda: lock.acquire(blocking=False)
        return lambda: lock.acquire(blocking=True, blocking_timeout=wait_ms / 1000)

    def cancel(self, actor):
        actor.worker.cancel()

    async def close(self, client):
        await client.aclose()


# --- The runner ----------------------------------------------------------------


class Runner:
    def __init__(self, scenario, flavour, server_port):
        self.scenario = scenario
        self.name = scenario["name"]
        self.flavour = flavour
        self.server_port = server_port
        self.raw = redis.Redis(host="127.0.0.1", port=server_port)
        self.processes: dict = {}
        self.actors: dict = {}
        self.armed: list = []
        timeout = scenario.get("session_timeout_ms")
        self.session_timeout = None if timeout is None else timeout / 1000
        # When each lock object's grant was last reported lost (on_lost).
        self.lost_at: dict = {}
        # save_key's DUMP per key, for restore_key.
        self.saved: dict = {}

    def on_lost(self, lock, reason) -> None:
        self.lost_at[lock] = time.monotonic()

    def key(self, step) -> str:
        return f"{self.name}:{step['key']}"

    def process(self, name) -> Process:
        process = self.processes.get(name)
        if process is None:
            proxy = ReplyDropper(self.server_port)
            client = self.flavour.client(proxy.port, f"{self.name}:{name}")
            process = self.processes[name] = Process(name, client, proxy)
        return process

    def actor(self, step) -> Actor:
        name = step["actor"]
        actor = self.actors.get(name)
        if actor is None:
            process = self.process(step.get("process", "main"))
            actor = self.actors[name] = Actor(name, process, self.flavour.actor(f"{self.name}:{name}"))
            process.actors.append(actor)
        elif "process" in step:
            assert actor.process.name == step["process"], f"actor {name} is in process {actor.process.name}"
        return actor

    def lock(self, actor: Actor, step):
        """The actor's lock object for the step's key and mode (made reentrant:
        the actor is one owner), its lease set from ``lease_ms``."""
        key, mode = self.key(step), step.get("mode", "exclusive")
        module = self.flavour.module
        if mode == "permits":
            ident = (key, "permits", step["permits"], step["limit"])
            lock = actor.locks.get(ident)
            if lock is None:
                lock = actor.locks[ident] = module.Semaphore(
                    actor.process.client, key, step["limit"], permits=step["permits"], reentrant=True,
                    session_timeout=self.session_timeout, on_lost=self.on_lost,
                )
        else:
            assert mode in ("exclusive", "shared"), f"unknown mode {mode}"
            both = actor.locks.get((key, "rw"))
            if both is None:
                both = actor.locks[(key, "rw")] = module.ReadWriteLock(
                    actor.process.client, key, reentrant=True, session_timeout=self.session_timeout,
                    on_lost=self.on_lost,
                )
            lock = both.read_lock() if mode == "shared" else both.write_lock()
        return lock

    def held(self, actor: Actor, step):
        lock = actor.last.get(self.key(step))
        assert lock is not None, f"{actor.name} never acquired {step['key']}"
        return lock

    # Reading the server.

    def info(self, step):
        return info(self.raw, self.key(step))

    async def until(self, condition, what, within_ms=None):
        timeout = DEADLINE if within_ms is None else within_ms / 1000
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return
            assert time.monotonic() < deadline, f"{self.name}: no {what} within {timeout} s"
            await asyncio.sleep(0.01)

    async def on_actor(self, actor: Actor, fn, what):
        """``fn()`` on the actor, its ("ok", value) or ("error", e)."""
        try:
            return await asyncio.wait_for(asyncio.shield(actor.worker.run(fn)), DEADLINE)
        except asyncio.TimeoutError:
            raise AssertionError(f"{self.name}: {actor.name} did not {what} within {DEADLINE} s") from None

    async def value_on_actor(self, actor, fn, what):
        kind, value = await self.on_actor(actor, fn, what)
        if kind != "ok":
            raise value
        return value

    @staticmethod
    def timed(actor: Actor, lock, call):
        """``call`` (an acquire of ``lock``), noting when it returned True and
        the owner it was granted to."""

        def granted(value):
            if value is True:
                actor.granted_at = time.monotonic()
                # Kept past the release: expect_holds reads the server's
                # count of the owner after it, when the lock has forgotten it.
                actor.owners[lock] = lock.local.token
            return value

        def run():
            result = call()
            if inspect.isawaitable(result):

                async def finish():
                    return granted(await result)

                return finish()
            return granted(result)

        return run

    # Steps.

    async def play(self) -> None:
        self.raw.flushall()
        try:
            for index, step in enumerate(self.scenario["steps"]):
                try:
                    await getattr(self, f"op_{step['op']}")(step)
                except AssertionError as e:
                    raise AssertionError(f"{self.name}, step {index} {json.dumps(step)}: {e}") from None
            for process in self.processes.values():
                armed = self.armed.count(process.proxy)
                assert process.proxy.drops == armed, (
                    f"{self.name}: {armed} drop_next_reply, {process.proxy.drops} replies dropped"
                )
        finally:
            await self.cleanup()

    async def cleanup(self) -> None:
        # First: the server is every later test's too, and refuses even the
        # FLUSHALL below while min-replicas-to-write is set.
        self.raw.config_set("min-replicas-to-write", 0)
        for actor in self.actors.values():
            if actor.cancel_token is not None:
                actor.cancel_token.cancel()
        for process in self.processes.values():
            if not process.killed:
                await self.flavour.close(process.client)
                process.proxy.kill()
        for actor in self.actors.values():
            actor.worker.stop()
        self.raw.flushall()
        self.raw.close()

    async def op_acquire(self, step):
        actor = self.actor(step)
        lock = self.lock(actor, step)
        lock.timeout = step["lease_ms"] / 1000 if "lease_ms" in step else None
        actor.last[self.key(step)] = lock
        call = self.timed(actor, lock, self.flavour.acquire_call(actor, lock, step.get("wait_ms", 0), started=False))
        outcome = acquire_outcome(await self.on_actor(actor, call, "acquire"))
        assert outcome == step["expect"], f"{actor.name} acquiring: {outcome}, expected {step['expect']}"

    async def op_start_acquire(self, step):
        actor = self.actor(step)
        assert actor.started is None or actor.started.done(), f"{actor.name} is acquiring already"
        lock = self.lock(actor, step)
        lock.timeout = step["lease_ms"] / 1000 if "lease_ms" in step else None
        actor.last[self.key(step)] = lock
        call = self.timed(actor, lock, self.flavour.acquire_call(actor, lock, step.get("wait_ms", 20000), started=True))
        actor.started = actor.worker.run(call)

    async def op_await_result(self, step):
        actor = self.actor(step)
        assert actor.started is not None, f"{actor.name} started no acquire"
        within = step.get("within_ms", DEADLINE * 1000) / 1000
        try:
            result = await asyncio.wait_for(asyncio.shield(actor.started), within)
        except asyncio.TimeoutError:
            raise AssertionError(f"{actor.name}'s acquire has no outcome within {within} s") from None
        outcome = acquire_outcome(result)
        assert outcome == step["expect"], f"{actor.name}'s acquire: {outcome}, expected {step['expect']}"

    async def op_expect_pending(self, step):
        actor = self.actor(step)
        assert actor.started is not None, f"{actor.name} started no acquire"
        if actor.started.done():
            raise AssertionError(f"{actor.name}'s acquire has an outcome already: {acquire_outcome(actor.started.result())}")

    async def op_release(self, step):
        actor = self.actor(step)
        lock = self.lock(actor, step)
        kind, value = await self.on_actor(actor, lambda: lock.release(), "release")
        expect = step.get("expect")
        if kind == "ok":
            assert expect is None, f"{actor.name} released, expected {expect}"
            return
        if expect is None or not isinstance(value, (ResponseError, LockNotOwnedError)):
            raise value
        assert f"error:{error_code(value)}" == expect, f"{actor.name} releasing: {value!r}, expected {expect}"

    async def op_cancel(self, step):
        actor = self.actor(step)
        assert actor.started is not None and not actor.started.done(), f"{actor.name} has no acquire in progress"
        self.flavour.cancel(actor)

    async def op_expect_holds(self, step):
        actor = self.actor(step)
        owner = actor.owners.get(self.held(actor, step))
        assert owner is not None, f"{actor.name} was never granted {step['key']}"
        mine = holding(self.raw, self.key(step), owner)
        holds = mine["holds"] if mine else 0
        assert holds == step["holds"], f"FLOCK.INFO shows {actor.name} holding {holds}, expected {step['holds']}"

    async def op_await_waiters(self, step):
        def waiters():
            fields = self.info(step)
            return 0 if fields is None else fields["waiters"]

        await self.until(lambda: waiters() == step["count"], f"{step['count']} waiters (last {waiters()})",
                         step.get("within_ms"))

    async def op_expect_free(self, step):
        fields = self.info(step)
        assert fields is None, f"FLOCK.INFO {self.key(step)} is {fields}, expected nil"

    async def op_force_release(self, step):
        self.raw.execute_command("FLOCK.FORCERELEASE", self.key(step))

    async def op_await_lost(self, step):
        actor = self.actor(step)
        lock = self.held(actor, step)

        async def lost():
            return await self.value_on_actor(actor, lambda: lock.lost, "read lost")

        await self.until(lost, f"loss of {actor.name}'s {step['key']}", step.get("within_ms"))
        if "reason" in step:
            reason = await self.value_on_actor(actor, lambda: lock.lost_reason, "read lost_reason")
            assert reason == step["reason"], f"lost_reason {reason!r}, expected {step['reason']!r}"

    async def op_expect_not_lost(self, step):
        actor = self.actor(step)
        lock = self.held(actor, step)
        until = time.monotonic() + step.get("for_ms", 0) / 1000
        while True:
            lost = await self.value_on_actor(actor, lambda: lock.lost, "read lost")
            assert not lost, f"{actor.name}'s {step['key']} is reported lost ({lock.lost_reason})"
            if time.monotonic() >= until:
                return
            await asyncio.sleep(0.01)

    async def op_expect_lost_before(self, step):
        actor = self.actor(step)
        lock = self.held(actor, step)
        other = self.actors[step["granted"]]
        lost_at = self.lost_at.get(lock)
        assert lost_at is not None, f"{actor.name}'s {step['key']} was never reported lost through on_lost"
        assert other.granted_at is not None, f"{other.name} was never granted"
        assert lost_at < other.granted_at, (
            f"{actor.name}'s {step['key']} was reported lost {1000 * (lost_at - other.granted_at):.1f} ms after"
            f" {other.name}'s acquire returned granted"
        )

    async def op_partition(self, step):
        process = self.process(step.get("process", "main"))
        process.proxy.partition()
        if "for_ms" in step:
            await asyncio.sleep(step["for_ms"] / 1000)
            process.proxy.heal()

    async def op_heal(self, step):
        self.process(step.get("process", "main")).proxy.heal()

    async def op_drop_next_reply(self, step):
        process = self.process(step.get("process", "main"))
        assert process.proxy.marker is None, "the previous drop_next_reply dropped nothing yet"
        process.proxy.drop_reply_to(step["command"].encode())
        self.armed.append(process.proxy)

    async def op_kill_process(self, step):
        process = self.process(step["process"])
        # Dead: nothing of it reaches the server any more ...
        process.proxy.kill()
        name = f"{self.name}:{process.name}".encode()
        for entry in self.raw.client_list():
            if _bytes(entry.get("name")) == name:
                self.raw.client_kill_filter(_id=entry["id"])
        process.killed = True
        # ... and its actors stop: closing the client ends their waits.
        await self.flavour.close(process.client)
        for actor in process.actors:
            actor.worker.stop()

    async def op_save_key(self, step):
        self.saved[self.key(step)] = self.raw.dump(self.key(step))

    async def op_restore_key(self, step):
        key = self.key(step)
        assert key in self.saved, f"no save_key of {step['key']} before"
        self.raw.restore(key, 0, self.saved[key], replace=True)

    async def op_refuse_writes(self, step):
        self.raw.config_set("min-replicas-to-write", 1)

    async def op_accept_writes(self, step):
        self.raw.config_set("min-replicas-to-write", 0)


def _bytes(value):
    return value.encode() if isinstance(value, str) else value


@pytest.mark.parametrize("scenario", SCENARIOS, ids=NAMES)
def test_scenario_threads(server, scenario):
    asyncio.run(Runner(scenario, Threads(), server.port).play())


@pytest.mark.parametrize("scenario", SCENARIOS, ids=NAMES)
async def test_scenario_asyncio(server, scenario):
    await Runner(scenario, Tasks(), server.port).play()
