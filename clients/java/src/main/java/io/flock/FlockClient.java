package io.flock;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * What {@code RedissonClient} is to {@code RLock}: one per application and server. It owns a UUID (the
 * first half of every owner it uses, {@code <uuid>:<thread id>}), a command connection shared by its locks,
 * a watchdog thread with a connection of its own, and the connections blocking waits run on.
 */
public final class FlockClient implements AutoCloseable {
    /** The lease of a lock taken without a lease time, renewed every third of it: Redisson's lockWatchdogTimeout. */
    public static final long DEFAULT_WATCHDOG_TIMEOUT_MS = 30_000;
    /** How many times a command whose reply was lost is sent again, with the same request ID. */
    public static final int RESENDS = 3;
    private static final long UNBLOCK_RETRY_MS = 10;

    private final String id = UUID.randomUUID().toString();
    private final ConnectionFactory factory;
    private final long watchdogTimeoutMs;
    private final Link commands;
    private final Link renewals;
    private final ConcurrentLinkedDeque<Link> idleWaitLinks = new ConcurrentLinkedDeque<>();
    private final ScheduledExecutorService watchdog = Executors.newSingleThreadScheduledExecutor(daemon("flock-watchdog"));
    private final ExecutorService waiters = Executors.newCachedThreadPool(daemon("flock-wait"));
    final Map<Grant.Key, Grant> grants = new ConcurrentHashMap<>();
    private volatile LeaseLostListener leaseLostListener = (name, thread, token, reason) -> {};

    public FlockClient(ConnectionFactory factory) {
        this(factory, DEFAULT_WATCHDOG_TIMEOUT_MS);
    }

    public FlockClient(ConnectionFactory factory, long watchdogTimeoutMs) {
        if (watchdogTimeoutMs < 3) {
            throw new IllegalArgumentException("watchdog timeout must be at least 3 ms");
        }
        this.factory = factory;
        this.watchdogTimeoutMs = watchdogTimeoutMs;
        this.commands = new Link(factory, false);
        this.renewals = new Link(factory, false);
    }

    /** A client on the built-in {@link RespConnection}. */
    public static FlockClient create(String host, int port) {
        return new FlockClient(RespConnection.factory(host, port));
    }

    /** FLOCK's only lock is fair (FIFO), so this is {@link #getLock}; named as Redisson's. */
    public FlockLock getFairLock(String name) {
        return getLock(name);
    }

    public FlockLock getLock(String name) {
        return new FlockLock(this, name);
    }

    /** Redisson's getReadWriteLock: a read (SHARED) and a write lock on one key, in one FIFO queue. */
    public FlockReadWriteLock getReadWriteLock(String name) {
        return new FlockReadWriteLock(this, name);
    }

    /** A semaphore of {@code limit} permits (Redisson's getSemaphore plus trySetPermits, in one). */
    public FlockSemaphore getSemaphore(String name, int limit) {
        return new FlockSemaphore(this, name, limit);
    }

    /** The UUID that prefixes this client's owners. */
    public String getId() {
        return id;
    }

    public long getWatchdogTimeout() {
        return watchdogTimeoutMs;
    }

    public void setLeaseLostListener(LeaseLostListener listener) {
        this.leaseLostListener = listener == null ? (name, thread, token, reason) -> {} : listener;
    }

    /** Sends any command on the shared connection, resending a lost reply (give IDs where resends matter). */
    public Object call(byte[]... args) throws IOException {
        return callResending(commands, args);
    }

    @Override
    public void close() {
        watchdog.shutdownNow();
        waiters.shutdownNow();
        commands.close();
        renewals.close();
        for (Link link; (link = idleWaitLinks.poll()) != null; ) {
            link.close();
        }
    }

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static byte[] requestId() {
        return bytes(UUID.randomUUID().toString());
    }

    /** The same arguments (and so the same request ID) each time: the server applies the command once. */
    static Object callResending(Link link, byte[][] args) throws IOException {
        for (int attempt = 0; ; attempt++) {
            try {
                return link.call(args);
            } catch (IOException e) {
                if (attempt == RESENDS) {
                    throw e;
                }
            }
        }
    }

    /**
     * A blocking command on a connection of its own. {@code interruptible}: it runs on a wait thread while the
     * caller waits for it; an interrupt sends CLIENT UNBLOCK for that connection from the command connection
     * and then takes the blocked call's reply as it is (nil, or a grant that won the race) and the interrupt
     * together, for the caller to settle. Otherwise it runs on the calling thread.
     */
    Reply callBlocking(byte[][] args, boolean interruptible) throws IOException {
        Link link = idleWaitLinks.poll();
        if (link == null) {
            link = new Link(factory, true);
        }
        Link waitLink = link;
        try {
            if (!interruptible) {
                return new Reply(callResending(waitLink, args), false);
            }
            Future<Object> reply = waiters.submit(() -> callResending(waitLink, args));
            try {
                return new Reply(reply.get(), false);
            } catch (ExecutionException failed) {
                throw rethrow(failed.getCause());
            } catch (InterruptedException interrupted) {
                unblock(waitLink, reply);
                return new Reply(resultOf(reply), true);
            }
        } finally {
            if (waitLink.isOpen()) {
                idleWaitLinks.push(waitLink);
            }
        }
    }

    /** Until the wait has answered: CLIENT UNBLOCK it (again, if it was not blocked yet when asked). */
    private void unblock(Link waitLink, Future<Object> reply) throws IOException {
        while (!reply.isDone()) {
            long clientId = waitLink.clientId();
            if (clientId != 0) {
                callResending(commands, new byte[][] {bytes("CLIENT"), bytes("UNBLOCK"), bytes(Long.toString(clientId))});
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

    void startWatchdog(Grant grant) {
        long period = watchdogTimeoutMs / 3;
        grant.watchdog = watchdog.scheduleWithFixedDelay(() -> renew(grant), period, period, TimeUnit.MILLISECONDS);
    }

    private void renew(Grant grant) {
        try {
            callResending(renewals, grant.renewArgs(watchdogTimeoutMs));
            grant.confirmedNanos = System.nanoTime();
        } catch (IOException | RuntimeException e) {
            if ("NOTOWNER".equals(RedisError.codeOf(e))) {
                leaseLost(grant, "NOTOWNER");
            } else if (System.nanoTime() - grant.confirmedNanos > TimeUnit.MILLISECONDS.toNanos(watchdogTimeoutMs)) {
                leaseLost(grant, "UNCONFIRMED");
            }
        }
    }

    private void leaseLost(Grant grant, String reason) {
        if (grants.get(grant.key) != grant) {
            return; // released meanwhile: the renewal raced the unlock
        }
        grant.lostReason = reason;
        grant.stopWatchdog();
        leaseLostListener.onLeaseLost(grant.key.name, grant.key.threadId, grant.token, reason);
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
