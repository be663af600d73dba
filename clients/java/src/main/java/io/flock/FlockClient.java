package io.flock;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * What {@code RedissonClient} is to {@code RLock}: one per application and server (or Redis Cluster, or
 * Sentinel-watched master; on a Cluster what follows holds per node: connections and a session on each node
 * used, each lock's commands sent to the master of its key's slot). It owns a UUID (the
 * first half of every owner it uses, {@code <uuid>:<thread id>}), command connections its threads share (up to
 * three, each lent to one command at a time: a thread's command waits behind no other's unless three are under
 * way), a FLOCK session (one more connection, opened on the first acquire, on which a daemon thread reads the
 * outcome of every thread's wait and the losses of its grants, {@code FLOCK.INBOX}, every quarter of the session
 * timeout at least: the session's heartbeat), a timer thread for the deadlines, and a watchdog connection. So any
 * number of waiting threads costs five connections at most in all (but for the waits of a {@link FlockMultiLock},
 * each of which blocks a connection of its own).
 *
 * <p>A lock taken without a lease time lives with the session ({@code FLOCK.ACQUIRE ... 0 ... INBOX}): no lease,
 * no renewals. It is reported lost ({@link LossReason#UNCONFIRMED}) when no heartbeat confirmed the session for
 * its timeout ({@link FlockConfig#setSessionTimeout}), which is before the server can give it to another, and
 * ({@link LossReason#SESSIONENDED}) when the session ends. A lock taken with a lease time is lost at its
 * lease's end ({@link LossReason#EXPIRED}). Locks taken without a session (a {@link FlockMultiLock}'s, durable
 * grants', every lock's with {@code sessions} false) get the watchdog's lease, renewed every third of it.
 *
 * <p>With {@code sessions} false (the constructor's option) waits block a connection each instead
 * ({@code FLOCK.ACQUIRE ... WAIT} on a connection of its own, as BLPOP), and losses are only found by the
 * watchdog's renewals, its deadline and by unlock.
 */
public final class FlockClient implements AutoCloseable {
    /** The lease of a lock taken without a lease time, renewed every third of it: Redisson's lockWatchdogTimeout. */
    public static final long DEFAULT_WATCHDOG_TIMEOUT_MS = 30_000;
    /** How many times a command whose reply was lost is sent again, with the same request ID. */
    public static final int RESENDS = 3;
    private static final long UNBLOCK_RETRY_MS = 10;

    private final String id = UUID.randomUUID().toString();
    private final long watchdogTimeoutMs;
    /** Each key's server: its connections and session. */
    final Router router;
    /**
     * Runs the deadlines: each session's, each grant's own lease end, each watchdog renewal's start. It never
     * waits for I/O, so no slow server delays another deadline.
     */
    private final ScheduledThreadPoolExecutor timer = new ScheduledThreadPoolExecutor(1, daemon("flock-timer"));
    /** Renewals (one at a time per node) and re-watches: the I/O the timer starts. */
    final ExecutorService io = Executors.newCachedThreadPool(daemon("flock-io"));
    private final ExecutorService waiters = Executors.newCachedThreadPool(daemon("flock-wait"));
    /** The session timeout asked for ({@link FlockConfig#setSessionTimeout}), or 0: the server's. */
    final long sessionTimeoutMs;
    /** Every grant's LOCKDELAY ms; -1: none sent (the server's default). */
    final long lockDelayMs;
    final Map<Grant.Key, Grant> grants = new ConcurrentHashMap<>();
    private volatile LeaseLostListener leaseLostListener = (name, thread, token, reason) -> {};
    private volatile boolean sessions;
    /** Durable grants: how many replicas must acknowledge each grant (0: off), and how long WAIT waits. */
    final int durableReplicas;
    final int durableTimeoutMs;
    /** Losses pushed before their grant was known here (the grant's reply still on its way): key -> reason. */
    private final Map<String, LossReason> earlyLosses = new java.util.LinkedHashMap<>() {
        private static final long serialVersionUID = 1L;

        @Override
        protected boolean removeEldestEntry(Map.Entry<String, LossReason> eldest) {
            return size() > 1024;
        }
    };

    /** Tokens are positive: this one stands for any grant the thread did not know it had. */
    private static final long ANY_TOKEN = -1;

    /**
     * The token of the grant each (lock, thread) released last, with the reply 0 (no hold left) or failing other
     * than NOTOWNER: a later acquire answered with the same token found that grant still held, its release lost
     * or refused (see FlockLock#dropLeakedHolds); or {@link #ANY_TOKEN} after an acquire whose outcome is
     * unknown. The 1,024 remembered last.
     */
    private final Map<Grant.Key, Long> released = new java.util.LinkedHashMap<>() {
        private static final long serialVersionUID = 1L;

        @Override
        protected boolean removeEldestEntry(Map.Entry<Grant.Key, Long> eldest) {
            return size() > 1024;
        }
    };

    /**
     * A client with the default watchdog timeout and sessions.
     *
     * @param factory opens each connection the client needs (never a shared one)
     */
    public FlockClient(ConnectionFactory factory) {
        this(factory, DEFAULT_WATCHDOG_TIMEOUT_MS);
    }

    /**
     * A client with sessions.
     *
     * @param factory opens each connection the client needs (never a shared one)
     * @param watchdogTimeoutMs the lease of a lock taken without a lease time, renewed every third of it
     */
    public FlockClient(ConnectionFactory factory, long watchdogTimeoutMs) {
        this(factory, watchdogTimeoutMs, true);
    }

    /**
     * {@code sessions}: true (the default) waits through the client's FLOCK session (one connection for all
     * waiting threads, losses pushed at once); false waits with a blocking {@code FLOCK.ACQUIRE ... WAIT} on a
     * connection per waiting thread, as before sessions.
     *
     * @param factory opens each connection the client needs (never a shared one)
     * @param watchdogTimeoutMs the lease of a lock taken without a lease time, renewed every third of it
     * @param sessions whether waits go through the client's session
     */
    public FlockClient(ConnectionFactory factory, long watchdogTimeoutMs, boolean sessions) {
        this(client -> new Router(client, factory), watchdogTimeoutMs, sessions, 0,
                FlockConfig.DEFAULT_DURABLE_TIMEOUT_MS, 0, -1);
    }

    /**
     * A client on connections from {@code factory} (a Jedis, Lettuce or Spring adapter) with the options of
     * {@code options} that do not concern connecting: the session timeout, the watchdog timeout and durable
     * grants ({@link FlockConfig#setSessionTimeout}, {@link FlockConfig#setLockWatchdogTimeout},
     * {@link FlockConfig#setDurableReplicas}, {@link FlockConfig#setDurableTimeout}); sessions on.
     *
     * @param factory opens each connection the client needs (never a shared one)
     * @param options the session and watchdog timeouts and the durable-grant options (address, credentials,
     *     TLS and topology are the factory's, not taken from it)
     */
    public FlockClient(ConnectionFactory factory, FlockConfig options) {
        this(client -> new Router(client, factory), options.lockWatchdogTimeoutMs, true, options.durableReplicas,
                options.durableTimeoutMs, options.sessionTimeoutMs, options.lockDelayMs);
    }

    /** Every option (tests: durable grants without sessions). */
    FlockClient(java.util.function.Function<FlockClient, Router> router, long watchdogTimeoutMs,
            boolean sessions, int durableReplicas, int durableTimeoutMs, long sessionTimeoutMs, long lockDelayMs) {
        if (watchdogTimeoutMs < 3) {
            throw new IllegalArgumentException("watchdog timeout must be at least 3 ms");
        }
        this.watchdogTimeoutMs = watchdogTimeoutMs;
        this.sessions = sessions;
        this.durableReplicas = durableReplicas;
        this.durableTimeoutMs = durableTimeoutMs;
        this.sessionTimeoutMs = sessionTimeoutMs;
        this.lockDelayMs = lockDelayMs;
        timer.setRemoveOnCancelPolicy(true);
        this.router = router.apply(this);
    }

    /**
     * A client on the built-in {@link RespConnection} to {@code host:port}: no AUTH, database 0, no TLS,
     * {@link FlockConfig}'s default timeouts.
     *
     * @param host the server's host name or address
     * @param port its port
     * @return the client
     */
    public static FlockClient create(String host, int port) {
        return new FlockClient(RespConnection.factory(host, port));
    }

    /**
     * A client on the built-in {@link RespConnection} as {@code config} says (Redisson's
     * {@code Redisson.create(config)}). Connects on first use: a wrong password is a {@link RedisError}
     * ({@code WRONGPASS}) from the first lock call. A {@link FlockConfig#useClusterServers()} config routes each
     * lock to the master of its key's slot, with a session per node; a {@link FlockConfig#useSentinelServers()}
     * config asks the sentinels for the master on every connection it opens.
     *
     * @param config the address (or Cluster seeds, or sentinels), credentials, database, timeouts, TLS options
     *     and watchdog timeout
     * @return the client
     * @throws java.io.UncheckedIOException if a TLS file of the config cannot be read
     * @throws IllegalArgumentException if a Cluster config has no seed or a database other than 0, or a Sentinel
     *     config no master name or sentinel
     */
    public static FlockClient create(FlockConfig config) {
        return new FlockClient(client -> Router.of(client, config), config.lockWatchdogTimeoutMs, true,
                config.durableReplicas, config.durableTimeoutMs, config.sessionTimeoutMs, config.lockDelayMs);
    }

    /**
     * FLOCK's only lock is fair (FIFO), so this is {@link #getLock}; named as Redisson's.
     *
     * @param name the lock's key
     * @return the lock
     */
    public FlockLock getFairLock(String name) {
        return getLock(name);
    }

    /**
     * The exclusive lock {@code name}: any number of objects for one name are the same lock.
     *
     * @param name the lock's key
     * @return the lock
     */
    public FlockLock getLock(String name) {
        return new FlockLock(this, name);
    }

    /**
     * Redisson's getReadWriteLock: a read (SHARED) and a write lock on one key, in one FIFO queue.
     *
     * @param name the lock's key
     * @return the read-write lock
     */
    public FlockReadWriteLock getReadWriteLock(String name) {
        return new FlockReadWriteLock(this, name);
    }

    /**
     * A semaphore of {@code limit} permits (Redisson's getSemaphore plus trySetPermits, in one).
     *
     * @param name the semaphore's key
     * @param limit its permits in all, fixed by the first acquire that creates the key
     * @return the semaphore
     */
    public FlockSemaphore getSemaphore(String name, int limit) {
        return new FlockSemaphore(this, name, limit);
    }

    /**
     * Redisson's getMultiLock: the locks {@code names} taken and released together, all or none, each in one
     * server call ({@code FLOCK.ACQUIREALL}, {@code FLOCK.RELEASEALL}). On a Cluster the names must share a hash
     * slot (a hash tag: {@code {account:42}:from}, {@code {account:42}:to}).
     *
     * @param names the locks' keys, at least one, each once
     * @return the multi-lock
     * @throws IllegalArgumentException if no name is given, or one twice
     */
    public FlockMultiLock getMultiLock(String... names) {
        FlockLock[] locks = new FlockLock[names.length];
        for (int i = 0; i < names.length; i++) {
            locks[i] = getLock(names[i]);
        }
        return new FlockMultiLock(this, locks);
    }

    /**
     * Redisson's getMultiLock(RLock...): {@code locks} taken and released together, all or none. They are this
     * client's exclusive locks ({@link #getLock}), or all read locks ({@link FlockReadWriteLock#readLock()}):
     * one request takes every key in one mode. A thread that holds one of them already reenters it.
     *
     * @param locks this client's locks, at least one, each key once
     * @return the multi-lock
     * @throws IllegalArgumentException if none is given, a key twice, a lock of another client, a semaphore's
     *     permits, or exclusive and read locks together
     */
    public FlockMultiLock getMultiLock(FlockLock... locks) {
        return new FlockMultiLock(this, locks);
    }

    /**
     * The UUID that prefixes this client's owners.
     *
     * @return the UUID, as text
     */
    public String getId() {
        return id;
    }

    /**
     * The lease of a lock taken without a lease time.
     *
     * @return milliseconds
     */
    public long getWatchdogTimeout() {
        return watchdogTimeoutMs;
    }

    /**
     * How many replicas must acknowledge each grant before an acquire returns ({@link
     * FlockConfig#setDurableReplicas}).
     *
     * @return the count, 0 when durable grants are off
     */
    public int getDurableReplicas() {
        return durableReplicas;
    }

    /**
     * Whether waits go through the client's session (the default) or block a connection each (asked for, or
     * the server's module has no sessions: an older FLOCK).
     *
     * @return true while waits go through the session
     */
    public boolean usesSessions() {
        return sessions;
    }

    /** True, and sessions off from now on, when {@code error} says the server has no FLOCK.SESSION. */
    boolean sessionsUnsupported(RuntimeException error) {
        String message = String.valueOf(new RedisError(error).getMessage()).toLowerCase(java.util.Locale.ROOT);
        if (message.contains("unknown command") && message.contains("flock.session")) {
            sessions = false;
            return true;
        }
        return false;
    }

    /**
     * Told once per grant found lost, with the {@link LossReason} word: at once when the server pushes the loss
     * ({@code expired}, {@code forcereleased}, {@code deleted} or {@code demoted}), at a deadline ({@code expired}
     * for a fixed lease, {@code unconfirmed} for a grant no heartbeat or renewal confirmed in time), at its
     * session's end ({@code sessionended}), or when a renewal finds it gone or a {@link FlockLock#fenced} command
     * is refused {@code STALE} ({@code notowner}). See
     * {@link LeaseLostListener} for the thread it runs on.
     *
     * @param listener the listener, or null for none
     */
    public void setLeaseLostListener(LeaseLostListener listener) {
        this.leaseLostListener = listener == null ? (name, thread, token, reason) -> {} : listener;
    }

    /**
     * Sends any command on a command connection of the server of its key (the second argument; on a Cluster,
     * following MOVED and ASK), resending a lost reply (give IDs where resends matter).
     *
     * @param args the command and its arguments
     * @return the reply, mapped as {@link FlockCommands} says
     * @throws IOException if the reply was lost {@link #RESENDS} more times (on a Cluster or Sentinel: and no
     *     failover brought the key's server back within 30 s)
     */
    public Object call(byte[]... args) throws IOException {
        return command(args);
    }

    /**
     * The session timeout T: the one the last session opened was given by its server (its
     * {@link FlockConfig#setSessionTimeout} if set, else the server's {@code flock.session-timeout-ms}); before
     * any session, the one asked for, else the server default (10 s). A session grant (a lock taken without a
     * lease time) is reported lost when no heartbeat confirmed its session for about this long.
     *
     * @return the session timeout
     */
    public java.time.Duration getSessionTimeout() {
        for (Node node : router.nodes()) {
            return java.time.Duration.ofMillis(node.session.timeoutMs());
        }
        return java.time.Duration.ofMillis(sessionTimeoutMs > 0 ? sessionTimeoutMs
                : Protocol.DEFAULT_SESSION_TIMEOUT_MS);
    }

    @Override
    public void close() {
        timer.shutdownNow();
        io.shutdownNow();
        waiters.shutdownNow();
        router.close();
    }

    /** The session of a one-server or Sentinel client (tests). */
    Session session() {
        return router.single().session;
    }

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static byte[] requestId() {
        return bytes(UUID.randomUUID().toString());
    }

    /**
     * The calling thread's owner, {@code <uuid>:<thread id>}: the same for its single and multi-locks, so that
     * the server sees one caller across them (reentry, deadlock detection).
     */
    byte[] owner() {
        return bytes(id + ":" + Thread.currentThread().getId());
    }

    /**
     * The same arguments (and so the same request ID) each time: the server applies the command once.
     * {@code asking}: each time after ASKING (see {@link Link#call(byte[][], boolean)}).
     */
    static Object callResending(Channel link, byte[][] args, boolean asking) throws IOException {
        for (int attempt = 0; ; attempt++) {
            try {
                return link.call(args, asking);
            } catch (IOException e) {
                if (attempt == RESENDS) {
                    throw e;
                }
            }
        }
    }

    /** Sends on a command connection of the node of the key {@code args[1]}, resending a lost reply. */
    Object command(byte[][] args) throws IOException {
        return router.call(args.length > 1 ? args[1] : null, args, node -> node.commands, true);
    }

    /**
     * A blocking command on a connection of its own. {@code interruptible}: it runs on a wait thread while the
     * caller waits for it; an interrupt sends CLIENT UNBLOCK for that connection from a command connection
     * and then takes the blocked call's reply as it is (nil, or a grant that won the race) and the interrupt
     * together, for the caller to settle. Otherwise it runs on the calling thread.
     */
    Reply callBlocking(byte[][] args, boolean interruptible) throws IOException {
        return callBlocking(args[1], args, interruptible);
    }

    /** {@link #callBlocking(byte[][], boolean)} on the node of {@code key} (a multi-key command's first key). */
    Reply callBlocking(byte[] key, byte[][] args, boolean interruptible) throws IOException {
        Router.Route route = router.route(key);
        while (true) {
            try {
                return callBlocking(route.node(), args, interruptible);
            } catch (RuntimeException e) {
                // A Cluster node that does not serve the key answers MOVED at once: wait on the one named. (A
                // wait is not sent after ASKING: the slot is moving, the pause of a resend lets it settle.)
                if (!route.redirected(e)) {
                    throw e;
                }
            }
        }
    }

    private Reply callBlocking(Node node, byte[][] args, boolean interruptible) throws IOException {
        Link waitLink = node.waitLinks.take(0);
        try {
            if (!interruptible) {
                return new Reply(callResending(waitLink, args, false), false);
            }
            Future<Object> reply = waiters.submit(() -> callResending(waitLink, args, false));
            try {
                return new Reply(reply.get(), false);
            } catch (ExecutionException failed) {
                throw rethrow(failed.getCause());
            } catch (InterruptedException interrupted) {
                unblock(node, waitLink, reply);
                return new Reply(resultOf(reply), true);
            }
        } finally {
            node.waitLinks.give(waitLink);
        }
    }

    /** Until the wait has answered: CLIENT UNBLOCK it from a command connection of its node (again, if needed). */
    private void unblock(Node node, Link waitLink, Future<Object> reply) throws IOException {
        while (!reply.isDone()) {
            long clientId = waitLink.clientId();
            if (clientId != 0) {
                callResending(node.commands,
                        new byte[][] {bytes("CLIENT"), bytes("UNBLOCK"), bytes(Long.toString(clientId))}, false);
            }
            try {
                reply.get(UNBLOCK_RETRY_MS, TimeUnit.MILLISECONDS);
            } catch (TimeoutException | InterruptedException | ExecutionException notYet) {
                // looked at by resultOf below, once done
            }
        }
    }

    private static Object resultOf(Future<Object> done) throws IOException {
        try {
            return done.get();
        } catch (InterruptedException | ExecutionException e) {
            throw rethrow(e instanceof ExecutionException ? e.getCause() : e);
        }
    }

    private static IOException rethrow(Throwable cause) {
        if (cause instanceof IOException) {
            return (IOException) cause;
        }
        if (cause instanceof RuntimeException) {
            throw (RuntimeException) cause;
        }
        if (cause instanceof Error) {
            throw (Error) cause;
        }
        return new IOException(cause);
    }

    /** Runs {@code task} on the client's timer after {@code nanos}; nothing once the client is closed. */
    ScheduledFuture<?> schedule(Runnable task, long nanos) {
        try {
            return timer.schedule(task, Math.max(0, nanos), TimeUnit.NANOSECONDS);
        } catch (RejectedExecutionException closed) {
            return null;
        }
    }

    /**
     * How a grant was taken, for its deadline: its token; when the command that answered it (the acquire, or the
     * FLOCK.INBOX read that brought its event) was sent; its lease ({@code leaseMs} 0: none of its own, it lives
     * with session {@code via}; else its lease, or its lease left when the event was read); whether the watchdog
     * renews it; and the session that watches it (null without one).
     */
    record Taken(long token, long sentNanos, long leaseMs, boolean renewed, Session.Reader via) {
    }

    /**
     * The terms of {@code grant} after an acquire (a new grant or a reentry, which gives it the acquire's lease,
     * or makes it live with the session again for lease-ms 0) and the timers they need: the session's deadline
     * covers a grant that lives with it; a lease of its own has a timer at its deadline, and the watchdog's
     * renewals when it renews it.
     */
    void track(Grant grant, Taken taken) {
        Session.Reader bindTo = null;
        synchronized (grant) {
            if (grant.lostReason != null) {
                return;
            }
            if (taken.via() != null) {
                grant.watcher = taken.via();
            }
            if (taken.leaseMs() == 0) {
                grant.leaseMs = 0;
                grant.renewed = false;
                grant.cancelTimers();
                if (grant.session != taken.via()) {
                    Session.Reader before = grant.session;
                    if (before != null) {
                        before.unbind(grant);
                    }
                    grant.session = taken.via();
                    bindTo = taken.via();
                }
            } else {
                // a reentry with a lease keeps the grant bound to its session too (the server keeps it so)
                grant.leaseMs = taken.leaseMs();
                grant.leaseDeadline = Protocol.deadline(taken.sentNanos(), taken.leaseMs());
                grant.renewed = taken.renewed();
                armDeadline(grant);
                if (taken.renewed()) {
                    startWatchdog(grant, taken.sentNanos());
                } else {
                    grant.stopWatchdog();
                }
            }
        }
        if (bindTo != null) {
            LossReason gone = bindTo.bind(grant);
            if (gone != null) {
                leaseLost(grant, gone, gone == LossReason.UNCONFIRMED
                        ? "its session's deadline passed before the grant was known"
                        : "the session it lived with ended before the grant was known: the server ended it");
            }
        }
    }

    /** The timer at {@code grant}'s own lease deadline (again, when a renewal or reentry moved it). */
    private void armDeadline(Grant grant) {
        synchronized (grant) {
            if (grant.lostReason != null || grant.leaseMs == 0) {
                return;
            }
            grant.cancelDeadline();
            grant.deadlineCheck = schedule(() -> checkDeadline(grant), grant.leaseDeadline - System.nanoTime());
        }
    }

    /** On the timer: {@code grant}'s deadline came (lost, unless a renewal moved it on meanwhile). */
    private void checkDeadline(Grant grant) {
        if (grants.get(grant.key) != grant || grant.lostReason != null) {
            return;
        }
        if (!lostByNow(grant)) {
            armDeadline(grant);
        }
    }

    /**
     * Whether {@code grant} is known lost, or its deadline (its session's, its own lease's) has passed by the
     * clock now, which reports it lost: a process paused past its deadline sees it at its first check.
     */
    boolean lostByNow(Grant grant) {
        if (grant.lostReason != null) {
            return true;
        }
        long now = System.nanoTime();
        LossReason due = grant.due(now);
        if (due == null) {
            return false;
        }
        Session.Reader session = grant.session;
        if (session != null && now - session.deadline() >= 0) {
            // its session is over, for all its grants: it is closed, so that the server ends them all too
            session.expire();
        }
        leaseLost(grant, due, due == LossReason.EXPIRED ? lossMessage("expired")
                : grant.leaseMs > 0 && grant.renewed ? "no renewal was confirmed for a whole lease ("
                        + grant.leaseMs + " ms): the lease may have ended"
                : "no heartbeat of its session confirmed it for the session's timeout: the server may have ended it");
        return grant.lostReason != null;
    }

    /** The watchdog's renewals of {@code grant}: the first a third of the lease after {@code sentNanos}. */
    private void startWatchdog(Grant grant, long sentNanos) {
        synchronized (grant) {
            if (grant.watchdog != null) {
                return;
            }
            long period = TimeUnit.MILLISECONDS.toNanos(watchdogTimeoutMs / Protocol.WATCHDOG_RENEW_FRACTION);
            try {
                grant.watchdog = timer.scheduleWithFixedDelay(() -> renewSoon(grant),
                        Math.max(0, sentNanos + period - System.nanoTime()), period, TimeUnit.NANOSECONDS);
            } catch (RejectedExecutionException closed) {
                // the client is closing
            }
        }
    }

    /** On the timer: a renewal of {@code grant}, one at a time per node, unless one is under way. */
    private void renewSoon(Grant grant) {
        if (grant.lostReason != null || !grant.renewing.compareAndSet(false, true)) {
            return;
        }
        try {
            router.renewerOf(grant.lockKey).execute(() -> {
                try {
                    renew(grant);
                } finally {
                    grant.renewing.set(false);
                }
            });
        } catch (RejectedExecutionException closed) {
            grant.renewing.set(false);
        }
    }

    /**
     * FLOCK.RENEW of {@code grant}, resent with its request ID at once when a reply is lost, each send given the
     * time left until the grant's deadline. A reply moves the deadline to the first send's time + the lease (the
     * server applied it then at the earliest); NOTOWNER is a loss; anything else leaves the deadline as it is.
     */
    private void renew(Grant grant) {
        if (grants.get(grant.key) != grant || grant.lostReason != null) {
            return;
        }
        byte[][] args = grant.renewArgs(watchdogTimeoutMs);
        long sent = System.nanoTime();
        for (int attempt = 0; attempt <= RESENDS; attempt++) {
            long deadline = grant.leaseDeadline;
            if (System.nanoTime() - deadline >= 0) {
                return; // its timer reports it
            }
            try {
                router.route(grant.lockKey).callTimed(args, node -> node.renewals, Protocol.msUntil(deadline));
                grant.confirmed(sent, watchdogTimeoutMs);
                return;
            } catch (IOException e) {
                // lost: sent again at once, same ID
            } catch (RuntimeException e) {
                if ("NOTOWNER".equals(RedisError.codeOf(e))) {
                    leaseLost(grant, LossReason.NOTOWNER, "the watchdog's renewal was refused: "
                            + new RedisError(e).getMessage());
                }
                return;
            }
        }
    }

    /**
     * Reports {@code grant} lost, once (a push, a timer and a renewal may all find it): stops its timers, and
     * tells the listener on the calling thread.
     */
    void leaseLost(Grant grant, LossReason reason, String message) {
        if (grants.get(grant.key) != grant) {
            return; // released meanwhile: the renewal raced the unlock
        }
        synchronized (grant) {
            if (grant.lostReason != null) {
                return; // told once: a push and a renewal both found it
            }
            grant.lostMessage = message;
            grant.lostReason = reason;
        }
        grant.stop();
        leaseLostListener.onLeaseLost(grant.key.name, grant.key.threadId, grant.token, reason.reason());
    }

    /** What a pushed loss's reason means, for the exception of a later unlock. */
    static String lossMessage(String reason) {
        switch (reason) {
            case "expired":
                return "the lease ended (expired) before unlock";
            case "forcereleased":
                return "the lock was force-released (FLOCK.FORCERELEASE) while held";
            case "deleted":
                return "the lock key was deleted while held";
            case "demoted":
                return "the server stopped being a master while the lock was held";
            default:
                return "the server ended the grant (" + reason + ")";
        }
    }

    /** The session's reader: the server ended grant {@code token} of {@code owner} on {@code name}. */
    void pushedLoss(String name, String owner, long token, String reason) {
        long threadId = threadOf(owner);
        if (threadId < 0) {
            return;
        }
        LossReason why = LossReason.of(reason);
        if (why == null) {
            why = LossReason.DELETED; // a reason newer than this client: the server ended it all the same
        }
        Grant grant = grantOf(name, owner, token);
        if (grant != null) {
            leaseLost(grant, why, lossMessage(reason));
        } else {
            synchronized (earlyLosses) {
                earlyLosses.put(lossKey(name, threadId, token), why);
            }
        }
    }

    /** The thread of one of this client's owners ({@code <uuid>:<thread id>}), or -1 for another's. */
    private long threadOf(String owner) {
        String prefix = id + ":";
        if (!owner.startsWith(prefix)) {
            return -1;
        }
        try {
            return Long.parseLong(owner.substring(prefix.length()));
        } catch (NumberFormatException notOurs) {
            return -1;
        }
    }

    /** This client's grant {@code token} of {@code owner} on {@code name}, or null when it knows none. */
    private Grant grantOf(String name, String owner, long token) {
        long threadId = threadOf(owner);
        Grant grant = threadId < 0 ? null : grants.get(new Grant.Key(name, threadId));
        return grant != null && grant.token == token ? grant : null;
    }

    /** A grant just became known: if its loss was pushed already, it is lost now. */
    void checkEarlyLoss(Grant grant) {
        LossReason reason;
        synchronized (earlyLosses) {
            reason = earlyLosses.remove(lossKey(grant.key.name, grant.key.threadId, grant.token));
        }
        if (reason != null) {
            leaseLost(grant, reason, lossMessage(reason.reason()));
        }
    }

    private static String lossKey(String name, long threadId, long token) {
        return threadId + ":" + token + ":" + name;
    }

    /** How long a re-watch waits before it tries again to open a session, while the server cannot be reached. */
    static final long REWATCH_RETRY_MS = 1_000;
    /** Grants whose watch moved to a new session (tests). */
    final java.util.concurrent.atomic.AtomicInteger rewatched = new java.util.concurrent.atomic.AtomicInteger();

    /**
     * After a session broke: moves the watch of every grant with a lease of its own that it watched to a new
     * session of its key's node, so that their losses are still pushed (on an I/O thread, at once or after
     * {@code delayMs}). The grants that lived with it ended with it.
     */
    void rewatchLater(long delayMs) {
        if (!sessions) {
            return;
        }
        Runnable task = () -> {
            try {
                io.execute(this::rewatch);
            } catch (RejectedExecutionException closed) {
                // the client is closing
            }
        };
        if (delayMs == 0) {
            task.run();
        } else {
            schedule(task, TimeUnit.MILLISECONDS.toNanos(delayMs));
        }
    }

    /**
     * The session's reader heard {@code moved}: the grant went with its key to another node (a Cluster slot
     * move) and is held there; watch it from that node's session (on an I/O thread).
     */
    void movedAway(String name, String owner, long token, Session.Reader from) {
        Grant grant = grantOf(name, owner, token);
        if (grant == null) {
            return;
        }
        from.unbind(grant); // it no longer ends with that session
        try {
            io.execute(() -> {
                if (rewatch(grant, true) == Rewatch.UNREACHABLE) {
                    rewatchLater(REWATCH_RETRY_MS);
                }
            });
        } catch (RejectedExecutionException closed) {
            // the client is closing
        }
    }

    private void rewatch() {
        boolean unreachable = false;
        for (Grant grant : grants.values()) {
            Session.Reader watcher = grant.watcher;
            if (grant.lostReason == null && grant.leaseMs > 0 && watcher != null && watcher.over()
                    && rewatch(grant, false) == Rewatch.UNREACHABLE) {
                unreachable = true;
            }
        }
        if (unreachable) {
            rewatchLater(REWATCH_RETRY_MS);
        }
    }

    private static final String REPLACED = "the grant ended while the client's session was being replaced";

    /** How a re-watch ended: UNREACHABLE, no session could be opened on the key's node (try again later). */
    private enum Rewatch { DONE, UNREACHABLE }

    /**
     * A RENEW (NOTOWNER: the grant is gone, reported lost), then, on the node that answered it, a reentrant
     * ACQUIRE ... INBOX with that node's session (the same token, one more hold, the lease reset to the
     * watchdog's as a renewal does, for a fixed lease to the lease it has left, or lease-ms 0 again for a grant
     * that lived with its session and {@code moved} with its key) and a RELEASE of that hold; the thread's own
     * unlock() waits meanwhile. Each command may take until the grant's deadline (a third of the session timeout
     * for a grant without a lease). Anything but the same token means the grant ended in between: it is reported
     * lost (and a new grant so made is given back).
     */
    private Rewatch rewatch(Grant grant, boolean moved) {
        synchronized (grant.holdsLock) {
            if (grants.get(grant.key) != grant || lostByNow(grant)) {
                return Rewatch.DONE;
            }
            boolean sessionGrant = grant.leaseMs == 0;
            if (sessionGrant && !moved) {
                return Rewatch.DONE; // it ended with its session (reported so)
            }
            long leaseMs = watchdogTimeoutMs;
            if (!sessionGrant && !grant.renewed) {
                // A fixed lease keeps its end: the lease left until its deadline (already taken in by the margin,
                // so this never lengthens it on the server).
                leaseMs = TimeUnit.NANOSECONDS.toMillis(grant.leaseDeadline - System.nanoTime());
                if (leaseMs <= 0) {
                    leaseLost(grant, LossReason.EXPIRED, lossMessage("expired")); // its push went with the old session
                    return Rewatch.DONE;
                }
            }
            Router.Route route;
            Session.Reader reader;
            long sent = System.nanoTime();
            try {
                route = router.route(grant.lockKey);
                Node node = route.node();
                reader = node.session.current();
                if (sessionGrant) {
                    leaseMs = reader.timeoutMs;
                }
                // still ours? (no new grant if not)
                route.callTimed(grant.renewArgs(leaseMs), n -> n.commands, commandMs(grant, reader));
                if (route.node() != node) { // redirected: the grant is on the node named
                    reader = route.node().session.current();
                }
            } catch (IOException | RuntimeException e) {
                if ("NOTOWNER".equals(RedisError.codeOf(e))) {
                    leaseLost(grant, LossReason.NOTOWNER, "the server ended the grant: "
                            + new RedisError(e).getMessage());
                    return Rewatch.DONE;
                }
                // not closed: the node cannot be reached now (its deadline tells if it stays so)
                return e instanceof IllegalStateException ? Rewatch.DONE : Rewatch.UNREACHABLE;
            }
            if (grant.renewed) {
                grant.confirmed(sent, leaseMs);
            }
            Object reply;
            try {
                reply = route.callTimed(grant.rewatchArgs(sessionGrant ? 0 : leaseMs, reader.sid), n -> n.commands,
                        commandMs(grant, reader));
            } catch (IOException | RuntimeException e) {
                // NOSESSION: that session's end re-watches again; anything else: the deadline tells
                return Rewatch.DONE;
            }
            if (reply instanceof Long) {
                try {
                    route.callTimed(grant.releaseArgs(), n -> n.commands, commandMs(grant, reader));
                } catch (IOException | RuntimeException e) {
                    // the extra hold stays until the thread's last unlock finds it: its lease ends it
                }
                if ((Long) reply != grant.token) {
                    leaseLost(grant, LossReason.NOTOWNER, REPLACED);
                    return Rewatch.DONE;
                }
                grant.watcher = reader;
                if (sessionGrant) {
                    grant.session = reader;
                    LossReason gone = reader.bind(grant);
                    if (gone != null) {
                        leaseLost(grant, gone, "the session it was moved to ended");
                        return Rewatch.DONE;
                    }
                }
                rewatched.incrementAndGet();
            } else if (reply == null) {
                leaseLost(grant, LossReason.NOTOWNER, REPLACED);
            }
            return Rewatch.DONE;
        }
    }

    /** How long a command the client sends for {@code grant} may take: until its deadline, else T/3. */
    private static int commandMs(Grant grant, Session.Reader session) {
        if (grant.leaseMs > 0) {
            return Protocol.msUntil(grant.leaseDeadline);
        }
        return (int) Protocol.heartbeatMs(session.timeoutMs);
    }

    /** The thread released its last hold of grant {@code token}, or a release of it failed. */
    void released(Grant.Key key, long token) {
        synchronized (released) {
            released.remove(key); // put alone keeps the first insertion's place, the first to be forgotten
            released.put(key, token);
        }
    }

    /**
     * The thread may hold a grant of {@code key} that it does not know of: an acquire whose reply was lost, a
     * durable grant's give-back that failed. Its next grant, whatever the token, gives back the holds beyond
     * its own.
     */
    void releasedUnknown(Grant.Key key) {
        released(key, ANY_TOKEN);
    }

    /** Whether {@code token} is the grant the thread released last, or may hold unknowingly (forgotten either way). */
    boolean releasedBefore(Grant.Key key, long token) {
        synchronized (released) {
            Long last = released.remove(key);
            return last != null && (last == token || last == ANY_TOKEN);
        }
    }

    /** How many watchdogs run (tests: a release stops its watchdog). */
    int watchdogs() {
        return (int) grants.values().stream().filter(g -> g.watchdog != null).count();
    }

    /** A blocking call's reply and whether the caller was interrupted while it waited. */
    static final class Reply {
        final Object value;
        final boolean interrupted;

        Reply(Object value, boolean interrupted) {
            this.value = value;
            this.interrupted = interrupted;
        }
    }

    private static ThreadFactory daemon(String name) {
        return runnable -> {
            Thread t = new Thread(runnable, name);
            t.setDaemon(true);
            return t;
        };
    }
}
