"""The asyncio flavour's session: one per connection pool and event loop,
opened on the first acquire. Its reader is a task on that loop looping
FLOCK.INBOX on a connection of its own; every task's waits go out as one
``FLOCK.ACQUIRE ... WAIT t INBOX sid ID rid`` on the pool's ordinary
connections and await their event. See redis_flock._session."""

import asyncio
import time
import uuid
from typing import Optional

import redis.asyncio
from redis.exceptions import AskError, ConnectionError, MovedError, ResponseError

from ._core import (
    ASK_PAUSE,
    CANCEL_GRACE,
    CANCELLED,
    ERROR,
    GRANTED,
    INBOX_MS,
    LOST_PREFIXES,
    LOST_REPLY,
    REDIRECTS,
    RELEASE,
    RESENDS,
    REOPEN_MAX_DELAY,
    SEND_CONCURRENCY,
    SESSION_SOCKET_MARGIN,
    TIMEOUT,
    SessionState,
    Wait,
    _text,
    is_demotion,
    is_key_gone,
    is_nosession,
    is_waiting,
    lock_error,
    logger,
    wait_left,
)


async def send(call, args):
    """``await call(*args)``, sent again at once with the same arguments
    (request ID included) when the reply is lost, up to RESENDS times."""
    for _ in range(RESENDS):
        try:
            return await call(*args)
        except LOST_REPLY:
            pass
    return await call(*args)


async def release_extra(call, grant) -> None:
    """See redis_flock._session.release_extra."""
    try:
        await send(call, grant.extra_release)
    except ResponseError:
        pass
    grant.extra_release = None


async def confirm_durable(lock, node, owner: bytes, token: Optional[int] = None) -> None:
    """See redis_flock._session.confirm_durable. A cancelled task gives the
    hold back too."""
    if not lock.durable_replicas:
        return
    renew, wait, release = lock._durable_commands(owner)

    async def round_trip():
        async with node.pipeline(transaction=False) as pipe:
            pipe.execute_command(*renew())
            pipe.execute_command(*wait)
            return await pipe.execute(raise_on_error=False)

    try:
        replies = await send(round_trip, ())
    except BaseException as e:
        replies = e
    error = lock._not_durable(replies)
    if error is None:
        return
    try:
        await send(lock.redis.execute_command, release)
    except Exception as e:
        lock._give_back_failed(owner, token, e)
    if not isinstance(replies, Exception) and isinstance(replies, BaseException):
        raise replies
    raise error


class TaskWait(Wait):
    def __init__(self, *args):
        super().__init__(*args)
        self.future = asyncio.get_running_loop().create_future()
        self.sending = asyncio.Lock()

    def wake(self) -> None:
        if not self.future.done():
            self.future.set_result(self.outcome)


async def node_client(client, key: bytes):
    """The client of the server that holds ``key`` (see
    redis_flock._session.node_client). A redis.asyncio RedisCluster learns
    its slots on its first command (initialize() here), and its nodes have
    no Redis of their own: one is made per node, with the node's connection
    settings, kept on the cluster client and closed by its aclose()."""
    if not hasattr(client, "get_node_from_key"):
        return client
    await client.initialize()
    node = client.get_node_from_key(key)
    nodes = client.__dict__.get("_flock_nodes")
    if nodes is None:
        nodes = client._flock_nodes = {}
        original = client.aclose

        async def aclose(*args, **kwargs):
            for redis_client in list(nodes.values()):
                # The pool's disconnect() also closes its sessions.
                await redis_client.connection_pool.disconnect()
            nodes.clear()
            return await original(*args, **kwargs)

        client.aclose = aclose
    redis_client = nodes.get(node.name)
    if redis_client is None:
        pool = redis.asyncio.ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
        redis_client = nodes[node.name] = redis.asyncio.Redis(connection_pool=pool)
    return redis_client


async def redirected(client, error: AskError, attempt: int) -> None:
    """See redis_flock._session.redirected."""
    if isinstance(error, MovedError):
        await client.nodes_manager.move_slot(error)
    else:
        await asyncio.sleep(ASK_PAUSE * attempt)


async def routed(client, key: bytes, name, action: str, attempt, rid: Optional[str] = None,
                 wait_ms: Optional[int] = None, lost: Optional[str] = None):
    """``await attempt(node, rid, wait_ms)`` on the key's node, following
    Cluster redirections (see redis_flock._session.routed)."""
    started = time.monotonic()
    for attempts in range(REDIRECTS + 1):
        node = await node_client(client, key)
        try:
            return await attempt(node, rid, wait_ms)
        except ResponseError as e:
            redirect = e
            if node is not client and is_key_gone(e):
                redirect, rid = await moved_away(node, key), str(uuid.uuid4())
            elif node is not client and is_demotion(e):
                redirect = await moved_away(node, key)
            if node is client or not isinstance(redirect, AskError) or attempts == REDIRECTS:
                raise lock_error(e, action, name, lost) from e
            await redirected(client, redirect, attempts + 1)
            wait_ms = wait_left(wait_ms, started)


async def moved_away(node, key: bytes) -> Optional[AskError]:
    """See redis_flock._session.moved_away."""
    try:
        await node.execute_command("FLOCK.INFO", key)
    except AskError as e:
        return e
    return None


async def rewatch_moved(old, key: bytes, entries) -> None:
    """See redis_flock._session.rewatch_moved."""
    for lock, grant in entries:
        if not hasattr(lock.redis, "get_node_from_key"):
            continue
        try:
            for attempt in range(1, REDIRECTS + 1):
                redirect = await moved_away(old, key)
                if isinstance(redirect, MovedError):
                    await redirected(lock.redis, redirect, attempt)
                    break
                if redirect is None:
                    raise ResponseError("the old node answers for the key itself")
                await asyncio.sleep(ASK_PAUSE * attempt)
            else:
                raise ResponseError("the slot's migration did not end")
            session = session_of(await node_client(lock.redis, key))
            sid = await session.open()
            session.state.watch(key, grant.owner, grant.token, lock, grant, None)
            if not await session._rewatch_one(lock, grant, sid):
                session.state.stale = True
                session._start_reopening()
        except Exception as e:
            logger.info("FLOCK: watching a moved grant of %r again failed (%s)", lock.name, e)


def session_of(client) -> "Session":
    """The session of ``client``'s pool on the running loop, made on first
    use. The pool's disconnect() (what Redis.aclose() calls) also closes it."""
    pool = client.connection_pool
    loop = asyncio.get_running_loop()
    sessions = pool.__dict__.get("_flock_sessions")
    if sessions is None:
        sessions = pool._flock_sessions = {}
        original = pool.disconnect

        async def disconnect(*args, **kwargs):
            if args[0] if args else kwargs.get("inuse_connections", True):
                running = asyncio.get_running_loop()
                for loop, session in list(sessions.items()):
                    # A session of another loop cannot be awaited here.
                    if loop is running:
                        await session.close()
                    else:
                        sessions.pop(loop, None)
            return await original(*args, **kwargs)

        pool.disconnect = disconnect
    for other in [other for other in sessions if other.is_closed()]:
        del sessions[other]
    session = sessions.get(loop)
    if session is None:
        session = sessions[loop] = Session(pool, loop)
    return session


class Session:
    def __init__(self, pool, loop):
        self.pool = pool
        self.loop = loop
        self.state = SessionState()
        self.opening = asyncio.Lock()
        self.connection = None
        self.sid: Optional[str] = None
        self.reader: Optional[asyncio.Task] = None
        self.reopening: Optional[asyncio.Task] = None
        self.limiter = asyncio.Semaphore(SEND_CONCURRENCY)
        self.client = redis.asyncio.Redis(connection_pool=pool)
        # Tasks the reader started (releases): kept until done.
        self.tasks: set = set()
        # The session whose grants were all re-watched.
        self.rewatched: Optional[str] = None

    async def open(self) -> str:
        """The session ID, opening the session (connection, FLOCK.SESSION,
        reader task) if it is not open."""
        if self.sid is not None:
            return self.sid
        async with self.opening:
            if self.sid is not None:
                return self.sid
            kwargs = dict(
                self.pool.connection_kwargs,
                socket_timeout=INBOX_MS / 1000 + SESSION_SOCKET_MARGIN,
                decode_responses=False,
            )
            connection = self.pool.connection_class(**kwargs)
            try:
                # connect() first (see redis_flock._session.Session.open).
                await connection.connect()
                await connection.send_command("FLOCK.SESSION")
                sid = _text(await connection.read_response())
            except BaseException:
                await _disconnect(connection)
                raise
            self.connection, self.sid = connection, sid
            self.state.current_sid = sid
            self.reader = self.loop.create_task(self._read(connection), name="flock-session")
            return sid

    async def close(self) -> None:
        """Closes the session's connection; waits in progress raise
        ConnectionError. A later acquire opens a new session."""
        connection, self.connection, self.sid = self.connection, None, None
        for task in (self.reader, self.reopening):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self.reader = self.reopening = None
        if connection is not None:
            await _disconnect(connection)
        self.state.fail_all(ConnectionError("the FLOCK session was closed (the client was closed)"))

    async def _read(self, connection) -> None:
        """Reads the inbox of ``connection``'s session until it breaks."""
        try:
            while True:
                try:
                    await connection.send_command("FLOCK.INBOX", INBOX_MS)
                    events = await connection.read_response()
                    # A cancel (close()) that the write lost: the reader read
                    # on for ever (and the loop's close waited on it).
                    _raise_lost_cancel()
                except ResponseError as e:
                    if is_nosession(e):
                        break
                    logger.warning("FLOCK session: FLOCK.INBOX answered %s", e)
                    if is_demotion(e):
                        self.state.demoted(e)
                    await asyncio.sleep(0.05)
                    continue
                for event in events or ():
                    try:
                        action = self.state.dispatch(event)
                        if action is not None and action[0] == RELEASE:
                            self._spawn(self._release(*action[1:]))
                        elif action is not None:
                            self._spawn(rewatch_moved(self.client, *action[1:]))
                    except Exception:
                        logger.exception("FLOCK session: event %r", event)
                if self.state.stale:
                    # A grant watched by an earlier session: re-watched here.
                    self._start_reopening()
        except asyncio.CancelledError:
            await _disconnect(connection)
            raise
        except Exception as e:
            logger.info("FLOCK session connection lost (%s): reopening", e)
        self._broken(connection)
        await _disconnect(connection)

    def _broken(self, connection) -> None:
        if self.connection is not connection:
            return
        self.connection = self.sid = None
        self.state.session_ended()
        if self.state.has_pending() or self.state.has_watched():
            self._start_reopening()

    def _start_reopening(self) -> None:
        if self.reopening is None or self.reopening.done():
            self.reopening = self.loop.create_task(self._reopen(), name="flock-session-reopen")

    def _gone(self, sid: str) -> None:
        """The server said NOSESSION for ``sid``: drop that connection and
        reopen (the waits are sent again)."""
        if self.sid != sid:
            return
        connection, reader = self.connection, self.reader
        self.reader = None
        if reader is not None:
            reader.cancel()
        self._broken(connection)

    async def _reopen(self) -> None:
        """Opens a new session, checks the grants held that another session
        watched and moves their watch there, and sends the live waits there
        again, until each is there (or ended); pauses doubling up to
        REOPEN_MAX_DELAY between failed attempts."""
        delay = 0.0
        while self.state.has_pending() or self.state.has_watched():
            try:
                sid = await self.open()
                rewatched = await self._rewatch(sid)
                todo = [wait for wait in self.state.pending() if wait.sent_to != sid]
                if rewatched and not todo:
                    return
                for wait in todo:
                    await self.send_wait(wait)
                if not rewatched:
                    raise ConnectionError("a grant could not be re-watched")
                delay = 0.0
                continue  # check again: the session may have broken meanwhile
            except asyncio.CancelledError:
                raise
            except Exception as e:
                logger.debug("FLOCK session: reopening failed: %s", e)
                delay = min(max(delay * 2, 0.05), REOPEN_MAX_DELAY)
            await asyncio.sleep(delay)

    async def _rewatch(self, sid: str) -> bool:
        """Checks every grant held that another session watched and moves its
        watch to session ``sid`` (see redis_flock._session.Session._rewatch);
        False when that could not be done now."""
        for lock, grant in self.state.to_rewatch(sid):
            try:
                if not await self._rewatch_one(lock, grant, sid):
                    self.state.stale = True
                    return False
            except asyncio.CancelledError:
                self.state.stale = True
                raise
            except Exception as e:
                logger.info("FLOCK session: re-watching a grant of %r failed (%s)", lock.name, e)
                self.state.stale = True
                return False
        self.rewatched = sid
        return True

    async def _rewatch_one(self, lock, grant, sid: str) -> bool:
        """See redis_flock._session.Session._rewatch_one."""
        call = lock.redis.execute_command
        async with grant.mutex:
            if grant.stopped or grant.lost:
                return True
            if grant.extra_release is not None:
                await release_extra(call, grant)
            if grant.watched_sid == sid:
                return True
            commands = lock._rewatch_commands(grant, sid)
            if commands is None:
                grant.watched_sid = sid
                lock._grant_lost(grant, "expired")
                return True
            renew, acquire, release = commands
            try:
                await send(call, renew)
            except ResponseError as e:
                grant.watched_sid = sid
                if str(e).startswith(LOST_PREFIXES):
                    lock._grant_lost(grant, str(e))
                else:
                    logger.warning("FLOCK session: checking a grant of %r answered %s", lock.name, e)
                return True
            try:
                # On the session's own server (see redis_flock._session).
                token = await send(self.client.execute_command, acquire)
            except ResponseError as e:
                if is_nosession(e):
                    self._gone(sid)
                    return False
                grant.watched_sid = sid
                logger.warning("FLOCK session: re-watching a grant of %r answered %s", lock.name, e)
                return True
            grant.watched_sid = sid
            if token is None:
                lock._grant_lost(grant, "NOTOWNER the grant ended while the session was replaced")
                return True
            grant.extra_release = release
            await release_extra(call, grant)
            if token != grant.token:
                lock._grant_lost(grant, "NOTOWNER the grant ended while the session was replaced")
            return True

    def _spawn(self, coroutine) -> None:
        task = self.loop.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _release(self, key: bytes, owner: bytes) -> None:
        """A grant for a wait its task gave up on: give it back."""
        try:
            await send(self.client.execute_command, ("FLOCK.RELEASE", key, owner, "ID", str(uuid.uuid4())))
        except Exception as e:
            logger.warning("FLOCK: could not release an abandoned grant of %r: %s", key, e)

    # Acquiring.

    async def try_acquire(self, client, command: list, rid: str):
        for attempt in range(RESENDS + 1):
            sid = await self.open()
            try:
                reply = await send(client.execute_command, (*command, "INBOX", sid, "ID", rid))
                return reply, sid, time.monotonic()
            except ResponseError as e:
                if not is_nosession(e) or attempt == RESENDS:
                    raise
                self._gone(sid)

    async def send_wait(self, wait: TaskWait) -> None:
        async with wait.sending:
            while True:
                if wait.outcome is not None or not wait.live():
                    return
                sid = await self.open()
                if wait.sent_to == sid:
                    return
                if wait.expired():
                    self.state.settle(wait, (TIMEOUT, 0, ""))
                    return
                wait.sent_to = sid  # being sent: _reopen leaves it alone
                try:
                    async with self.limiter:
                        reply = await send(wait.client.execute_command, wait.args(sid))
                except ResponseError as e:
                    wait.sent_to = None
                    if is_nosession(e):
                        self._gone(sid)
                        if self.sid is not None and self.sid != sid:
                            continue
                        return  # reopened by _reopen, which sends it
                    self.state.settle(wait, (ERROR, 0, e))
                    return
                self.state.queued(wait, sid)
                if isinstance(reply, int):
                    self.state.settle(wait, (GRANTED, reply, ""))
                elif reply is None:
                    self.state.settle(wait, (TIMEOUT, 0, ""))
                elif not is_waiting(reply):
                    self.state.settle(wait, (ERROR, 0, ResponseError(f"unexpected reply {reply!r}")))
                return

    async def wait(self, client, key: bytes, owner: bytes, command: list, wait_ms: int, rid: str):
        """Queues ``command`` with WAIT ``wait_ms`` through the session and
        awaits its outcome: ((kind, token, detail), the wait; see
        redis_flock._session.Session.wait). Cancelling the task sends
        FLOCK.CANCEL; a grant that won the race is released."""
        wait = TaskWait(client, key, owner, command, wait_ms, rid)
        self.state.register(wait)
        return await self._outcome(client, wait), wait

    async def _outcome(self, client, wait: TaskWait):
        try:
            await self.send_wait(wait)
            _raise_lost_cancel()
            deadline = wait.local_deadline()
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(asyncio.shield(wait.future), timeout)
            except asyncio.TimeoutError:
                # The server's timeout event is late (or the session is down).
                return await self.cancel(client, wait, keep=True)
            _raise_lost_cancel()
        except BaseException:
            await self.cancel(client, wait, keep=False)
            raise
        return wait.outcome

    async def cancel(self, client, wait: TaskWait, keep: bool):
        """Sends FLOCK.CANCEL for ``wait``, and its event decides: the
        outcome, whose grant is kept (``keep``) or released. No event within
        CANCEL_GRACE (or cancelled again): TIMEOUT, and a grant coming later
        is the reader's to release. With ``keep``, a failed CANCEL raises."""
        outcome = self.state.cancelling(wait)
        if outcome is None and wait.sent_to is None:
            # Never sent (the session could not be opened): nothing to cancel.
            self.state.settle(wait, (CANCELLED, 0, ""))
            return wait.outcome
        if outcome is None:
            try:
                await client.execute_command("FLOCK.CANCEL", wait.key, wait.owner)
                await asyncio.wait_for(asyncio.shield(wait.future), CANCEL_GRACE)
            except asyncio.TimeoutError:
                pass
            except (Exception, asyncio.CancelledError) as e:
                if keep and isinstance(e, LOST_REPLY):
                    # The server cannot be reached past the wait's deadline: a
                    # timeout (see redis_flock._session.Session.cancel).
                    outcome = self.state.abandon(wait)
                    if outcome is None:
                        return (TIMEOUT, 0, "")
                    return outcome
                if keep:
                    self.state.abandon(wait)
                    raise
                logger.debug("FLOCK: cancelling a wait: %r", e)
            outcome = self.state.abandon(wait)
            if outcome is None:
                return (TIMEOUT, 0, "")
        if outcome[0] == GRANTED and not keep:
            # In a task of its own: a second cancel does not stop it.
            release = self.loop.create_task(self._release(wait.key, wait.owner))
            self.tasks.add(release)
            release.add_done_callback(self.tasks.discard)
            try:
                await asyncio.shield(release)
            except asyncio.CancelledError:
                pass
        return outcome


def _raise_lost_cancel() -> None:
    """Raises the cancel of the current task that an asyncio.wait_for lost:
    before Python 3.12 it returns the result of what it awaited when the
    cancel comes as that completes (redis-py writes each command through
    one, and the wait's outcome is awaited through one), and the task went
    on waiting. The task still counts the cancel (Task.cancelling(), Python
    3.11; before that, such a cancel stays lost)."""
    task = asyncio.current_task()
    if task is not None and getattr(task, "cancelling", lambda: 0)():
        raise asyncio.CancelledError()


async def _disconnect(connection) -> None:
    try:
        await connection.disconnect()
    except Exception:
        pass
