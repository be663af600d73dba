package io.flock;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;

/**
 * A fair (FIFO) distributed lock on a FLOCK server, with the {@link Lock} interface and Redisson's
 * {@code RLock} shapes. Get one from {@link FlockClient#getFairLock}.
 *
 * <p>The owner is {@code <client UUID>:<thread id>}: the same thread of the same client reenters (one more
 * hold, the same token, the lease reset); another thread, or another client, waits its turn. Each
 * {@code lock}/{@code tryLock} that returned true needs one {@link #unlock}. Without a lease time the lease is
 * the client's watchdog timeout (30 s by default) and a watchdog renews it every third of that until the
 * last unlock; with a lease time the lock ends by itself after it. I/O failures that outlast
 * {@link FlockClient#RESENDS} resends surface as {@link UncheckedIOException}; other error replies as
 * {@link RedisError} (or the adapter's exception).
 */
public class FlockLock implements Lock {
    private static final long FOREVER = -1;
    private static final long WATCHDOG = -1;

    private final FlockClient client;
    private final String name;
    private final byte[] key;
    private final List<byte[]> acquireOptions;

    FlockLock(FlockClient client, String name) {
        this(client, name, new byte[0][]);
    }

    /**
     * {@code acquireOptions} go into every FLOCK.ACQUIRE after the lease: the hook for the read and
     * semaphore variants, which differ from this lock only in those arguments.
     */
    protected FlockLock(FlockClient client, String name, byte[]... acquireOptions) {
        this.client = client;
        this.name = name;
        this.key = FlockClient.bytes(name);
        this.acquireOptions = List.of(acquireOptions);
    }

    public String getName() {
        return name;
    }

    // --- java.util.concurrent.locks.Lock ---

    /** Waits in the queue, without limit, not answering interrupts (as ReentrantLock); watchdog lease. */
    @Override
    public void lock() {
        lockUninterruptibly(WATCHDOG);
    }

    /** Waits in the queue; an interrupt takes the wait off the server's queue and throws. */
    @Override
    public void lockInterruptibly() throws InterruptedException {
        acquire(FOREVER, WATCHDOG, true);
    }

    /** Takes the lock if it is free and nobody queues for it (a try never overtakes the queue). */
    @Override
    public boolean tryLock() {
        return tryLockAndGetToken() != null;
    }

    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
        return tryLock(time, WATCHDOG, unit);
    }

    @Override
    public void unlock() {
        Grant.Key mine = mine();
        Grant grant = client.grants.get(mine);
        if (grant != null && grant.lostReason != null) {
            forget(mine);
            throw new IllegalMonitorStateException("the lease of lock '" + name + "' was lost (" + grant.lostReason
                    + ") while held by thread " + mine.threadId + ": another owner may have held it since");
        }
        long left;
        try {
            left = (Long) call("FLOCK.RELEASE", key, owner(), FlockClient.bytes("ID"), FlockClient.requestId());
        } catch (RuntimeException e) {
            if ("NOTOWNER".equals(RedisError.codeOf(e))) {
                forget(mine);
                throw new IllegalMonitorStateException("attempt to unlock lock '" + name
                        + "', not locked by current thread by node id: " + client.getId() + " thread-id: "
                        + mine.threadId);
            }
            throw e;
        }
        if (left == 0) {
            forget(mine);
        }
    }

    /** Not supported: FLOCK has no condition variables (Redisson's RLock does not have them either). */
    @Override
    public Condition newCondition() {
        throw new UnsupportedOperationException("FLOCK locks have no conditions");
    }

    // --- Redisson's RLock shapes ---

    /** Waits without limit (not interruptibly); the lock ends after {@code leaseTime} unless unlocked first. */
    public void lock(long leaseTime, TimeUnit unit) {
        lockUninterruptibly(unit.toMillis(leaseTime));
    }

    public void lockInterruptibly(long leaseTime, TimeUnit unit) throws InterruptedException {
        acquire(FOREVER, unit.toMillis(leaseTime), true);
    }

    /** Waits up to {@code waitTime} (&le; 0: tries once); {@code leaseTime} &le; 0 means the watchdog lease. */
    public boolean tryLock(long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException {
        return tryLockAndGetToken(waitTime, leaseTime, unit) != null;
    }

    /** {@link #lock()} returning the fencing token of the grant. */
    public long lockAndGetToken() {
        return lockUninterruptibly(WATCHDOG);
    }

    public long lockAndGetToken(long leaseTime, TimeUnit unit) {
        return lockUninterruptibly(unit.toMillis(leaseTime));
    }

    /** {@link #tryLock()} returning the fencing token, or null when busy. */
    public Long tryLockAndGetToken() {
        try {
            return acquire(0, WATCHDOG, false);
        } catch (InterruptedException impossible) {
            throw new AssertionError("a try never waits", impossible);
        }
    }

    /** {@link #tryLock(long, long, TimeUnit)} returning the fencing token, or null when the wait ran out. */
    public Long tryLockAndGetToken(long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException {
        long leaseMs = leaseTime > 0 ? Math.max(1, unit.toMillis(leaseTime)) : WATCHDOG;
        return acquire(waitTime > 0 ? Math.max(1, unit.toMillis(waitTime)) : 0, leaseMs, true);
    }

    /** The fencing token of the current thread's grant: pass it to the resource the lock protects. */
    public long getToken() {
        Grant grant = client.grants.get(mine());
        if (grant == null) {
            throw new IllegalMonitorStateException("lock '" + name + "' is not held by the current thread");
        }
        return grant.token;
    }

    /** True once the watchdog found the current thread's grant gone; the next unlock() then throws. */
    public boolean isLeaseLost() {
        Grant grant = client.grants.get(mine());
        return grant != null && grant.lostReason != null;
    }

    /** Asks the server (FLOCK.INFO), as Redisson does; a shared or semaphore holder among the others counts. */
    public boolean isHeldByCurrentThread() {
        return myHolder() != null;
    }

    public boolean isLocked() {
        return info() != null;
    }

    /** The current thread's holds on the server; 0 when it does not hold it. */
    public int getHoldCount() {
        Map<String, Object> mine = myHolder();
        return mine == null ? 0 : ((Long) mine.get("holds")).intValue();
    }

    /** The lease left in ms, or -2 when nobody holds the lock (Redisson's, from PTTL). */
    public long remainTimeToLive() {
        Map<String, Object> info = info();
        return info == null ? -2 : (Long) info.get("ttl-ms");
    }

    /**
     * Releases the lock whoever holds it, every shared or semaphore holder too (FLOCK.FORCERELEASE); true if
     * someone held it. Stops this client's watchdogs for it.
     */
    public boolean forceUnlock() {
        boolean released = (Long) call("FLOCK.FORCERELEASE", key, FlockClient.bytes("ID"), FlockClient.requestId()) > 0;
        client.grants.keySet().removeIf(k -> {
            if (!k.name.equals(name)) {
                return false;
            }
            Grant grant = client.grants.get(k);
            if (grant != null) {
                grant.stopWatchdog();
            }
            return true;
        });
        return released;
    }

    /**
     * FLOCK.INFO as a map (owner as bytes, the numbers as Long, {@code holders} as a list of such maps, one per
     * holder), or null when nobody holds the lock.
     */
    public Map<String, Object> info() {
        Object reply = call("FLOCK.INFO", key);
        if (reply == null) {
            return null;
        }
        Map<String, Object> info = fields(reply);
        List<Map<String, Object>> holders = new ArrayList<>();
        for (Object holder : (List<?>) info.getOrDefault("holders", List.of())) {
            holders.add(fields(holder));
        }
        info.put("holders", holders);
        return info;
    }

    /** The current thread's entry in {@code holders}, or null when it holds nothing. */
    private Map<String, Object> myHolder() {
        Map<String, Object> info = info();
        if (info == null) {
            return null;
        }
        String me = text(owner());
        for (Object holder : (List<?>) info.get("holders")) {
            @SuppressWarnings("unchecked")
            Map<String, Object> fields = (Map<String, Object>) holder;
            if (text(fields.get("owner")).equals(me)) {
                return fields;
            }
        }
        return null;
    }

    /** A RESP2 flat field/value array as a map. */
    private static Map<String, Object> fields(Object reply) {
        List<?> flat = (List<?>) reply;
        Map<String, Object> fields = new HashMap<>();
        for (int i = 0; i + 1 < flat.size(); i += 2) {
            fields.put(text(flat.get(i)), flat.get(i + 1));
        }
        return fields;
    }

    // --- the acquire path ---

    private long lockUninterruptibly(long leaseMs) {
        try {
            return acquire(FOREVER, leaseMs, false);
        } catch (InterruptedException impossible) {
            throw new AssertionError("an uninterruptible wait was interrupted", impossible);
        }
    }

    /**
     * A try on the shared connection first (free or reentry: no wait connection needed; a try never overtakes
     * the queue, so this keeps FIFO), then, if busy and allowed to wait, a WAIT on a connection of its own.
     * waitMs: 0 tries only, FOREVER queues without limit. Returns the token, or null if not granted.
     */
    private Long acquire(long waitMs, long leaseMs, boolean interruptible) throws InterruptedException {
        if (interruptible && Thread.interrupted()) {
            throw new InterruptedException();
        }
        long lease = leaseMs > 0 ? leaseMs : client.getWatchdogTimeout();
        Object reply;
        boolean interrupted = false;
        try {
            reply = call(acquireArgs(lease, null));
            if (reply == null && waitMs != 0) {
                FlockClient.Reply waited = client.callBlocking(acquireArgs(lease, waitMs == FOREVER ? 0 : waitMs),
                        interruptible);
                reply = waited.value;
                interrupted = waited.interrupted;
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (RuntimeException e) {
            throw RedisError.specific(e);
        }
        if (interrupted) {
            if (reply != null) {
                // The grant won the race with CLIENT UNBLOCK; a WAIT grant is never a reentry, so one
                // RELEASE gives it back whole (to the next in the queue).
                call("FLOCK.RELEASE", key, owner(), FlockClient.bytes("ID"), FlockClient.requestId());
            }
            throw new InterruptedException("interrupted while waiting for lock '" + name + "'");
        }
        if (reply == null) {
            return null;
        }
        long token = (Long) reply;
        remember(token, leaseMs == WATCHDOG);
        return token;
    }

    private byte[][] acquireArgs(long leaseMs, Long waitMs) {
        List<byte[]> args = new ArrayList<>(List.of(FlockClient.bytes("FLOCK.ACQUIRE"), key, owner(),
                FlockClient.bytes(Long.toString(leaseMs))));
        args.addAll(acquireOptions);
        if (waitMs != null) {
            args.add(FlockClient.bytes("WAIT"));
            args.add(FlockClient.bytes(Long.toString(waitMs)));
        }
        args.add(FlockClient.bytes("ID"));
        args.add(FlockClient.requestId());
        return args.toArray(new byte[0][]);
    }

    /** A new token is a new grant (also after a lost lease); the same token is a reentry of the one known. */
    private void remember(long token, boolean watchdog) {
        Grant.Key mine = mine();
        Grant grant = client.grants.get(mine);
        if (grant == null || grant.token != token || grant.lostReason != null) {
            if (grant != null) {
                grant.stopWatchdog();
            }
            grant = new Grant(mine, key, owner(), token);
            client.grants.put(mine, grant);
        }
        if (watchdog && grant.watchdog == null) {
            client.startWatchdog(grant);
        }
    }

    private void forget(Grant.Key mine) {
        Grant grant = client.grants.remove(mine);
        if (grant != null) {
            grant.stopWatchdog();
        }
    }

    private Grant.Key mine() {
        return new Grant.Key(name, Thread.currentThread().getId());
    }

    private byte[] owner() {
        return FlockClient.bytes(client.getId() + ":" + Thread.currentThread().getId());
    }

    private Object call(Object... args) {
        byte[][] bytes = new byte[args.length][];
        for (int i = 0; i < args.length; i++) {
            bytes[i] = args[i] instanceof String ? FlockClient.bytes((String) args[i]) : (byte[]) args[i];
        }
        return call(bytes);
    }

    private Object call(byte[][] args) {
        try {
            return client.call(args);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private static String text(Object reply) {
        return reply instanceof byte[] ? new String((byte[]) reply, StandardCharsets.UTF_8) : String.valueOf(reply);
    }
}
