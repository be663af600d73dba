"""A FLOCK session: one per connection pool (one per Redis client and server)
in a process, and for asyncio per event loop too, opened on the first
acquire. Its reader (the backend's: a daemon thread, or a task on the loop)
reads its inbox (FLOCK.INBOX) on a connection of its own; every thread's or
task's waits go out as one ``FLOCK.ACQUIRE ... WAIT t INBOX sid ID rid`` on
the pool's ordinary connections and wait for their event. docs/commands.md,
"Sessions"; README.md, "Sessions".

The blocking flavour's module is generated from the asyncio flavour's
(scripts/unasync.py); what differs for real between them is in their
``backend`` module."""

import time
from typing import Optional

from redis.exceptions import AskError, MovedError, ResponseError, TimeoutError

from . import _asyncio_backend as backend
from ._asyncio_backend import node_client
from ._core import (
    ASK_PAUSE,
    CANCEL_GRACE,
    CANCELLED,
    DEFAULT_SESSION_TIMEOUT,
    ERROR,
    GRANTED,
    HEARTBEAT_FRACTION,
    LOST_REPLY,
    NOTOWNER,
    REDIRECTS,
    RELEASE,
    RESENDS,
    TIMEOUT,
    Wait,
    _text,
    is_demotion,
    is_key_gone,
    is_nosession,
    is_notowner,
    is_waiting,
    lock_error,
    logger,
    new_id,
    to_ms,
    wait_left,
)


async def send(call, args):
    """``call(*args)``, sent again at once with the same arguments (request
    ID included) when the reply is lost, up to RESENDS times."""
    for _ in range(RESENDS):
        try:
            return await call(*args)
        except LOST_REPLY:
            pass
    return await call(*args)


async def send_own(client, args, timeout):
    """send() of a command the client sends for itself (an acquire through
    the session, a release, a renewal, a re-watch) on ``client``: each
    attempt with a socket timeout of ``timeout`` seconds, or of what
    ``timeout()`` answers then (until the deadline the command serves)."""
    for attempt in range(RESENDS + 1):
        try:
            return await backend.call(client, args, timeout() if callable(timeout) else timeout)
        except LOST_REPLY:
            if attempt == RESENDS:
                raise


async def release_extra(client, timeout, grant) -> None:
    """Sends the RELEASE of a re-watch's extra hold (again, the same request
    ID, if its reply was lost before); kept for later when the server cannot
    be reached. A NOTOWNER: the grant ended, its holder's release says so."""
    try:
        await send_own(client, grant.extra_release, timeout)
    except ResponseError:
        pass
    grant.extra_release = None


async def confirm_durable(lock, node, owner: bytes, token: int) -> None:
    """A durable grant's check (docs/client-protocol.md, "Durable grants";
    the commands and the verdict are LockBase's): RENEW and WAIT in one
    round trip on a connection of ``node``, the key's server (sent again,
    with a new RENEW, when the reply is lost); too few replicas, or a
    RENEW that failed or found another grant of the owner: the hold is given
    back and LockNotDurableError raised.
    A cancelled task gives the hold back too."""
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
    error = lock._not_durable(replies, token)
    if error is None:
        return
    try:
        await send_own(lock.redis, release, lock._command_timeout())
    except Exception as e:
        lock._give_back_failed(owner, token, e)
    if not isinstance(replies, Exception) and isinstance(replies, BaseException):
        raise replies
    raise error


class SessionWait(Wait):
    """A wait of this flavour: its event wakes its waiter."""

    def __init__(self, *args):
        super().__init__(*args)
        self.event = backend.Event()
        # One sender at a time: its waiter, or the reader resending.
        self.sending = backend.mutex()

    def wake(self) -> None:
        self.event.set()


async def redirected(client, error: AskError, attempt: int) -> None:
    """A command sent to a cluster node's own Redis answered MOVED (the slot
    moved: the cluster client learns its new node) or ASK (the slot is being
    migrated and the key is already gone: a short pause until it is done)."""
    if isinstance(error, MovedError):
        await client.nodes_manager.move_slot(error)
    else:
        await backend.sleep(ASK_PAUSE * attempt)


async def routed(
    client, key: bytes, name, action: str, attempt, rid: Optional[str] = None, wait_ms: Optional[int] = None,
    lost: Optional[str] = None,
):
    """``attempt(node, rid, wait_ms)`` on ``node``, the client of ``key``'s
    server (node_client), and on the key's node again after a Cluster
    redirection (MOVED; ASK after a pause), with what is left of
    ``wait_ms``. A wait that a slot migration ended (LOCKDELETED) follows
    the key as a new request (a new ``rid``: the request IDs moved with the
    key); one that a CLUSTER FAILOVER ended (UNBLOCKED: the node is a
    replica of the key's new master now) keeps its ``rid``, so that a grant
    the old master made and replicated is recognised and a replicated
    waiter's place taken over. Other error replies raise as lock_error makes
    them (``action`` and ``lost`` for its text)."""
    if not hasattr(client, "get_node_from_key"):
        # A single server's client: nothing to follow.
        try:
            return await attempt(client, rid, wait_ms)
        except ResponseError as e:
            raise lock_error(e, action, name, lost) from e
    started = time.monotonic()
    for attempts in range(REDIRECTS + 1):
        node = await node_client(client, key)
        try:
            return await attempt(node, rid, wait_ms)
        except ResponseError as e:
            redirect = e
            if node is not client and is_key_gone(e):
                redirect, rid = await moved_away(node, key), new_id()
            elif node is not client and is_demotion(e):
                redirect = await moved_away(node, key)
            if node is client or not isinstance(redirect, AskError) or attempts == REDIRECTS:
                raise lock_error(e, action, name, lost) from e
            await redirected(client, redirect, attempts + 1)
            wait_ms = wait_left(wait_ms, started)


async def moved_away(node, key: bytes) -> Optional[AskError]:
    """After a wait on Cluster node ``node`` ended with LOCKDELETED: the
    MOVED or ASK the node answers for ``key`` now (its slot is migrating or
    migrated: MIGRATE deleted the key here), or None (the key was deleted)."""
    try:
        await node.execute_command("FLOCK.INFO", key)
    except AskError as e:
        return e
    return None


async def rewatch_moved(old, key: bytes, entries) -> None:
    """After a ``moved`` event on the session of ``old`` (a Cluster node's
    client: the key went, with its grants, to another node): each grant is
    watched again through the session of the key's new node (a RENEW, a
    reentrant ``ACQUIRE ... INBOX``, a RELEASE of that hold:
    Session._rewatch_one), so that its losses there are pushed. The new node
    is the one ``old`` names in its MOVED for the key (the event comes with
    MIGRATE, before the slot's owner changes: ASK until then, asked again
    after a pause). Not on a single server's client (MIGRATE to a server it
    does not know): such a grant stays unwatched, its watchdog finds a loss."""
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
                await backend.sleep(ASK_PAUSE * attempt)
            else:
                raise ResponseError("the slot's migration did not end")
            session = session_of(await node_client(lock.redis, key), lock.session_timeout)
            sid = await session.open()
            session.state.watch(key, grant.owner, grant.token, lock, grant, None)
            if not await session._rewatch_one(lock, grant, sid):
                session.state.stale = True
                session._start_reopening()
        except Exception as e:
            # Registered on the new node's session: its reader tries again;
            # not yet: the grant stays unwatched, as a single server's.
            logger.info("FLOCK: watching a moved grant of %r again failed (%s)", lock.name, e)


def session_of(client, timeout: Optional[float] = None) -> "Session":
    """The session of ``client``'s connection pool (for asyncio, on the
    running loop) with timeout ``timeout`` seconds (None: the server's),
    made on first use (see the backend's session_of). The pool's
    disconnect() (what Redis.close() and aclose() call) also closes it."""
    return backend.session_of(client, Session, timeout)


class Session(backend.SessionConnection):
    """A session: its connection and reader are the backend's
    (SessionConnection: opening a new session when it breaks, closing it);
    what goes through them is here."""

    def command_timeout(self) -> float:
        """The socket timeout of a command sent for the session that serves
        no deadline: a quarter of its timeout (the asked or the server's
        default until the session says)."""
        return (self.state.timeout or self.asked or DEFAULT_SESSION_TIMEOUT) / HEARTBEAT_FRACTION

    def _connection(self):
        """A connection of the session's own, made with the pool's connection
        class and settings (host, auth, TLS, db, RESP version), not counted in
        its max_connections."""
        quarter = self.command_timeout()
        kwargs = dict(self.pool.connection_kwargs, socket_timeout=quarter, decode_responses=False)
        if kwargs.get("socket_connect_timeout") is None:
            kwargs["socket_connect_timeout"] = quarter
        return self.pool.connection_class(**kwargs)

    def _elsewhere(self, connection) -> bool:
        """Whether ``connection`` reaches another server than the session's:
        through Sentinel, one made before the sentinels named another master
        (a failover), which answers until they demote it. There the session
        is unknown: its NOSESSION is not the session's end."""
        session = self.connection
        return session is not None and (getattr(connection, "host", None), getattr(connection, "port", None)) != (
            getattr(session, "host", None), getattr(session, "port", None))

    async def send(self, args, timeout: float):
        """``args`` to the session's server, on one of the session's own
        connections for sending (at most SEND_CONCURRENCY, kept open: no
        pool's connection taken and given back per command), with a socket
        timeout of ``timeout``; sent again as send() does when the reply is
        lost."""
        async with self.limiter:
            for attempt in range(RESENDS + 1):
                connection = self._idle_sender()
                while connection is not None and self._elsewhere(connection):
                    await backend.disconnect(connection)
                    connection = self._idle_sender()
                connection = connection or self._connection()
                try:
                    reply = await backend.exchange(connection, args, timeout)
                except ResponseError as e:
                    if is_nosession(e) and self._elsewhere(connection) and attempt < RESENDS:
                        await backend.disconnect(connection)
                        continue
                    await self._sender_back(connection)
                    raise
                except LOST_REPLY:
                    await backend.disconnect(connection)
                    if attempt == RESENDS:
                        raise
                    continue
                except BaseException:
                    await backend.disconnect(connection)
                    raise
                await self._sender_back(connection)
                return reply

    async def open(self) -> str:
        """The session ID, opening the session (connection, ``FLOCK.SESSION
        [TIMEOUT ms] WITHTIMEOUT``, reader, deadline timer) if it is not
        open. Its deadline counts from the send time of FLOCK.SESSION."""
        if self.sid is not None:
            return self.sid
        async with self.lock:
            if self.sid is not None:
                return self.sid
            quarter = self.command_timeout()
            connection = self._connection()
            command = ["FLOCK.SESSION", "WITHTIMEOUT"]
            if self.asked is not None:
                command[1:1] = ["TIMEOUT", to_ms(self.asked)]
            try:
                # connect() first: there a Sentinel-managed connection asks
                # the sentinels for the master (send_command's own connect
                # would go to the default address).
                await connection.connect()
                sent = time.monotonic()
                sid, timeout_ms = await backend.exchange(connection, command, quarter)
                sid = _text(sid)
            except BaseException:
                await backend.disconnect(connection)
                raise
            self.connection, self.sid = connection, sid
            self.state.opened(sid, int(timeout_ms) / 1000, sent)
            self._deadline(sid)
            self._start_reader(connection)
            return sid

    def _deadline(self, sid: str) -> None:
        """The session's deadline timer: at the deadline of session ``sid``
        (moved on by each heartbeat since), its session grants are lost
        (``unconfirmed``) unless a heartbeat confirmed it meanwhile."""
        if self.state.check(sid):
            self.timer = backend.schedule(self.state.deadline, self._deadline, sid)

    async def _inbox(self, connection, sid: str, longest: Optional[float] = None) -> bool:
        """One FLOCK.INBOX on ``connection``, the session ``sid``'s, waiting
        at most a quarter of the session's timeout (the heartbeat), its reply
        awaited until the session's deadline: a reply confirms the session as
        of the read's send time, and its events are handled in the server's
        order. False when the server answers NOSESSION; another error reply
        is logged (and UNBLOCKED, the server demoted, does what that
        demotion's events would have); a broken connection, or a reply that
        did not come by the deadline, raises. ``longest``: seconds the read
        may wait at most, if less than the heartbeat."""
        sent = time.monotonic()
        left = self.state.deadline_of(sid)[0] - sent
        if left <= 0:
            raise TimeoutError("the session's deadline passed without a heartbeat")
        try:
            # Less than a quarter when the deadline is nearer than twice that
            # (a pause or a slow reply held up this read's send), so that the
            # answer comes back well before the deadline.
            quarter = int(self.state.timeout * 1000) // HEARTBEAT_FRACTION
            heartbeat = max(1, min(quarter, int(left * 1000) // 2))
            if longest is not None:
                heartbeat = max(1, min(heartbeat, int(longest * 1000)))
            events = await backend.exchange(connection, ("FLOCK.INBOX", heartbeat), left)
            # A cancel (close()) that the write lost: the reader read on for
            # ever (and the loop's close waited on it).
            backend.raise_lost_cancel()
        except ResponseError as e:
            if is_nosession(e):
                return False
            logger.warning("FLOCK session: FLOCK.INBOX answered %s", e)
            if is_demotion(e):
                self.state.demoted(e)
            await backend.sleep(0.05)
            return True
        self.state.confirmed(sid, sent)
        for event in events or ():
            try:
                action = self.state.dispatch(event, sent)
                # Each waits on a server: not on the reader.
                if action is not None and action[0] == RELEASE:
                    backend.spawn("flock-release", self._release, *action[1:])
                elif action is not None:
                    backend.spawn("flock-moved", rewatch_moved, self.client, *action[1:])
            except Exception:
                logger.exception("FLOCK session: event %r", event)
        return True

    async def _rewatch(self, sid: str) -> bool:
        """Checks every grant held that another session watched, and moves
        its watch to session ``sid``; False when that could not be done now
        (tried again after a pause)."""
        if self.rewatched == sid and not self.state.stale:
            return True
        for lock, grant in self.state.to_rewatch(sid):
            try:
                if not await self._rewatch_one(lock, grant, sid):
                    self.state.stale = True
                    return False
            except Exception as e:
                logger.info("FLOCK session: re-watching a grant of %r failed (%s)", lock.name, e)
                self.state.stale = True
                return False
            except BaseException:
                self.state.stale = True
                raise
        self.rewatched = sid
        return True

    async def _rewatch_one(self, lock, grant, sid: str) -> bool:
        """A RENEW (NOTOWNER: the grant is lost, with that text), then a
        reentrant ``ACQUIRE ... INBOX sid`` (the same token, one more hold)
        and a RELEASE of that hold, under the grant's mutex: the holder's
        own release waits, so the hold count is right. A fixed lease asks
        for what is left of it; none left: lost (``expired``, the push went
        with the old session). False on NOSESSION. Each command has a
        socket timeout until the grant's deadline."""
        timeout = lambda: lock._grant_timeout(grant)  # noqa: E731
        async with grant.mutex:
            if grant.stopped or grant.lost:
                return True
            if grant.extra_release is not None:
                await release_extra(lock.redis, timeout, grant)
            if grant.watched_sid == sid:
                return True
            commands = lock._rewatch_commands(grant, sid)
            if commands is None:
                grant.watched_sid = sid
                lock._grant_lost(grant, "expired")
                return True
            renew, acquire, release = commands
            sent = time.monotonic()
            try:
                await send_own(lock.redis, renew, timeout)
            except ResponseError as e:
                grant.watched_sid = sid
                if is_notowner(e):
                    lock._grant_lost(grant, NOTOWNER, str(e))
                else:
                    logger.warning("FLOCK session: checking a grant of %r answered %s", lock.name, e)
                return True
            # The RENEW set the lease from when it was sent (what was left of
            # a fixed one, the watchdog's): a renewal.
            grant.lease_ms, grant.lease_from = renew[3], sent
            try:
                # On the session's own server: through a RedisCluster, a slot
                # that moved would take it to a node that knows no ``sid``.
                token = await self.send(acquire, lock._grant_timeout(grant))
            except ResponseError as e:
                if is_nosession(e):
                    self._gone(sid)
                    return False
                grant.watched_sid = sid
                logger.warning("FLOCK session: re-watching a grant of %r answered %s", lock.name, e)
                return True
            grant.watched_sid = sid
            if token is None:
                lock._grant_lost(grant, NOTOWNER, "NOTOWNER the grant ended while the session was replaced")
                return True
            grant.extra_release = release
            await release_extra(lock.redis, timeout, grant)
            if token != grant.token:
                lock._grant_lost(grant, NOTOWNER, "NOTOWNER the grant ended while the session was replaced")
            return True

    async def _release(self, key: bytes, owner: bytes) -> None:
        """A grant for a wait its thread or task gave up on: give it back."""
        try:
            await self.send(("FLOCK.RELEASE", key, owner, "ID", new_id()), self.command_timeout())
        except Exception as e:
            logger.warning("FLOCK: could not release an abandoned grant of %r: %s", key, e)

    # Acquiring.

    async def try_acquire(self, client, command: list, rid: str):
        """``command`` (ACQUIRE without WAIT) once, with request ID ``rid``,
        watched by this session: (a token or None, the session ID, the send
        time of the command that answered: a lease counts from then)."""
        for attempt in range(RESENDS + 1):
            sid = await self.open()
            sent = time.monotonic()
            try:
                reply = await self.send((*command, "INBOX", sid, "ID", rid), self.command_timeout())
                return reply, sid, sent
            except ResponseError as e:
                if not is_nosession(e) or attempt == RESENDS:
                    raise
                self._gone(sid)

    async def send_wait(self, wait: SessionWait) -> None:
        """Sends ``wait`` to the current session unless it is there already;
        settles it when the reply ends it (a token, an error)."""
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
                wait.sent_to = sid  # being sent: the reader leaves it alone
                sent = time.monotonic()
                try:
                    reply = await self.send(wait.args(sid), self.command_timeout())
                except ResponseError as e:
                    wait.sent_to = None
                    if is_nosession(e):
                        self._gone(sid)
                        current = self.sid
                        if current is not None and current != sid:
                            continue
                        return  # the reader reopens and sends it
                    self.state.settle(wait, (ERROR, 0, e))
                    return
                if isinstance(reply, int):
                    self.state.queued(wait, sid, (GRANTED, reply, ""), sent)
                    return
                self.state.queued(wait, sid)
                if reply is None:
                    self.state.settle(wait, (TIMEOUT, 0, ""))
                elif not is_waiting(reply):
                    self.state.settle(wait, (ERROR, 0, ResponseError(f"unexpected reply {reply!r}")))
                return

    async def wait(self, client, key: bytes, owner: bytes, command: list, wait_ms: int, rid: str, cancel=None):
        """Queues ``command`` with WAIT ``wait_ms`` and request ID ``rid``
        (the same when it is sent again) through the session and
        waits for its outcome: ((kind, token, detail), the wait, whose
        ``sent_to`` and ``basis`` say which session granted it and the send
        time of the command that brought the grant; a granted event's
        detail is the lease left when its read answered). Interrupted (an exception in the waiting thread, a cancelled
        task) or cancelled (``cancel``, a CancelToken), it cancels the wait
        first; a grant that won the race is released; cancelled, its outcome
        is (CANCELLED, ...)."""
        wait = SessionWait(client, key, owner, command, wait_ms, rid)
        self.state.register(wait)
        return await self._outcome(client, wait, cancel), wait

    async def _outcome(self, client, wait: SessionWait, cancel):
        # The token's cancel() wakes the waiting thread, which sends the CANCEL.
        unsubscribe = cancel._subscribe(wait.wake) if cancel is not None else None
        try:
            if not (cancel is not None and cancel.cancelled):
                await self.send_wait(wait)
            backend.raise_lost_cancel()
            deadline = wait.local_deadline()
            woken = cancel is not None and cancel.cancelled
            if not woken:
                woken = await self._await(wait, None if deadline is None else max(0.0, deadline - time.monotonic()), cancel)
            if cancel is not None and cancel.cancelled:
                await self.cancel(client, wait, keep=False)
                return (CANCELLED, 0, "")
            if not woken:
                # The server's timeout event is late (or the session is down).
                return await self.cancel(client, wait, keep=True)
            backend.raise_lost_cancel()
        except BaseException:
            await self.cancel(client, wait, keep=False)
            raise
        finally:
            if unsubscribe is not None:
                unsubscribe()
        return wait.outcome

    async def cancel(self, client, wait: SessionWait, keep: bool):
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
                await self.send(("FLOCK.CANCEL", wait.key, wait.owner), self.command_timeout())
                await wait.event.wait(CANCEL_GRACE)
            except BaseException as e:
                if keep and isinstance(e, LOST_REPLY):
                    # The server cannot be reached past the wait's deadline: a
                    # timeout (the session that queued it is gone, or a grant
                    # coming later is the reader's to release).
                    outcome = self.state.abandon(wait)
                    if outcome is None:
                        return (TIMEOUT, 0, "")
                    return outcome
                if keep or not isinstance(e, backend.CANCEL_SURVIVES):
                    self.state.abandon(wait)
                    raise
                logger.debug("FLOCK: cancelling a wait failed: %r", e)
            outcome = self.state.abandon(wait)
            if outcome is None:
                return (TIMEOUT, 0, "")
        if outcome[0] == GRANTED and not keep:
            # To its end, even if the task is cancelled again meanwhile.
            await backend.finish(self._release, wait.key, wait.owner)
        return outcome


__all__ = ["Session", "confirm_durable", "moved_away", "node_client", "redirected", "routed", "send", "send_own", "session_of"]
