package io.flock;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Lock;

/**
 * A fair (FIFO) distributed lock on a FLOCK server, with the {@link Lock} interface and Redisson's
 * {@code RLock} shapes. Get one from {@link FlockClient#getFairLock}.
 *
 * <p>The owner is {@code <client UUID>:<thread id>}: the same thread of the same client reenters (one more
 * hold, the same token, the lease reset); another thread, or another client, waits its turn. Each
 * {@code lock}/{@code tryLock} that returned true needs one {@link #unlock}. Without a lease time the grant lives
 * with the client's session ({@code FLOCK.ACQUIRE ... 0 ... INBOX}: no lease, no renewals) until the last unlock
 * or the session's end (without a session, the watchdog's lease, renewed every third of it); with a lease time
 * the lock ends by itself after it. A wait is one {@code FLOCK.ACQUIRE ... WAIT} through the client's session (no
 * connection of its own); the server pushes the loss of a grant at once, and a grant whose deadline passes
 * unconfirmed (its session's, its lease's) is lost then ({@link #isLeaseLost()}, {@link #getLeaseLostReason()},
 * the client's {@link LeaseLostListener}). A wait whose server cannot be reached
 * retries until its own deadline and then ends as a wait that ran out ({@code tryLock} false; {@code lock()}
 * retries without limit, {@code lockInterruptibly()} until interrupted). Other I/O failures that outlast
 * {@link FlockClient#RESENDS} resends (a try without wait, unlock, info) surface as
 * {@link UncheckedIOException}; error replies as {@link RedisError} (or the adapter's exception). With durable
 * grants ({@link FlockConfig#setDurableReplicas}) every acquire that got a grant returns only once that many
 * replicas acknowledged it, or gives the hold back and throws {@link LockNotDurableException}.
 */
public class FlockLock extends AbstractFlockLock<Long> implements Lock {
    final FlockClient client;
    private final String name;
    final byte[] key;
    final List<byte[]> acquireOptions;

    FlockLock(FlockClient client, String name) {
        this(client, name, new byte[0][]);
    }

    /**
     * {@code acquireOptions} go into every FLOCK.ACQUIRE after the lease: the hook for the read and
     * semaphore variants, which differ from this lock only in those arguments.
     *
     * @param client the client whose connections, session, timer and watchdog the lock uses
     * @param name the lock's key
     * @param acquireOptions FLOCK.ACQUIRE options ({@code SHARED}, {@code PERMITS n LIMIT m}), or none
     */
    protected FlockLock(FlockClient client, String name, byte[]... acquireOptions) {
        this.client = client;
        this.name = name;
        this.key = FlockClient.bytes(name);
        this.acquireOptions = List.of(acquireOptions);
    }

    /**
     * The lock's name, as Redisson's {@code getName()}.
     *
     * @return the Redis key
     */
    public String getName() {
        return name;
    }

    // --- java.util.concurrent.locks.Lock: unlock() here; the rest, and Redisson's overloads with a lease or wait
    // time, are AbstractFlockLock's, over acquire(...) ---

    /**
     * Releases one hold. {@link IllegalMonitorStateException} when the thread does not hold the lock: Redisson's
     * "attempt to unlock lock ..., not locked by current thread" message, followed by why when it is known (the
     * loss the server pushed or the watchdog found, or the server's NOTOWNER text: the lease ended, it was
     * force-released, the key was deleted).
     */
    @Override
    public void unlock() {
        Grant.Key mine = mine();
        Grant grant = client.grants.get(mine);
        if (grant != null && client.lostByNow(grant)) {
            forget(mine);
            // a grant reported lost as its node was demoted can still be held on the promoted replica: if the
            // thread's next acquire gets its token back, its holds are given back then
            client.released(mine, grant.token);
            throw new IllegalMonitorStateException(notLocked(mine) + ": " + grant.lostMessage + " (token "
                    + grant.token + "; another owner may have held it since)");
        }
        synchronized (grant != null ? grant.holdsLock : new Object()) {
            long left;
            try {
                left = (Long) call("FLOCK.RELEASE", key, owner(), FlockClient.bytes("ID"), FlockClient.requestId());
            } catch (RuntimeException e) {
                if ("NOTOWNER".equals(RedisError.codeOf(e))) {
                    forget(mine);
                    throw new IllegalMonitorStateException(notLocked(mine) + ": " + new RedisError(e).getMessage());
                }
                releaseFailed(grant);
                throw e;
            }
            releasedOne(grant, left);
        }
    }

    /**
     * One hold of the thread's {@code grant} (null: one it did not know of) was released, the server counting
     * {@code left}: a single unlock's or a multi-lock's (which holds {@code grant.holdsLock} meanwhile too).
     */
    void releasedOne(Grant grant, long left) {
        boolean last = grant != null && --grant.holds <= 0;
        if (last) {
            left = releaseUnknownHolds(left);
        }
        if (left == 0 || last) {
            // holds left after the last are ones whose give-back failed: the thread's next grant of this token
            // gives them back (dropLeakedHolds), as after a release refused
            Grant.Key mine = mine();
            forget(mine);
            if (grant != null) {
                client.released(mine, grant.token);
            }
        }
    }

    /**
     * A release of one of the thread's holds of {@code grant} failed other than NOTOWNER (refused:
     * {@code NOREPLICAS}, {@code READONLY}; or its reply lost): the caller let the hold go, so the thread no
     * longer counts it, but the server may (docs/client-protocol.md, "stale holds"): the thread's next grant of
     * this token gives it back (dropLeakedHolds).
     */
    void releaseFailed(Grant grant) {
        if (grant == null) {
            return; // no token to know the grant again by: its lease or session ends it
        }
        Grant.Key mine = mine();
        if (--grant.holds <= 0) {
            forget(mine);
        }
        client.released(mine, grant.token);
    }

    /**
     * The thread released its last hold and the server still counts {@code left}: holds it does not know of,
     * which would keep the lock from every other thread while this one reenters it. Released too; returns
     * what the server counts then (not 0 only when it could not be reached or refused).
     */
    private long releaseUnknownHolds(long left) {
        try {
            while (left > 0) {
                left = (Long) own(releaseArgs());
            }
        } catch (RuntimeException e) {
            if ("NOTOWNER".equals(RedisError.codeOf(e))) {
                return 0;
            }
        }
        return left;
    }

    private String notLocked(Grant.Key mine) {
        return "attempt to unlock lock '" + name + "', not locked by current thread by node id: " + client.getId()
                + " thread-id: " + mine.threadId;
    }

    // --- Redisson's RLock shapes, with the fencing token ---

    /**
     * {@link #lock() lock()} returning the fencing token of the grant.
     *
     * @return the grant's fencing token
     */
    public long lockAndGetToken() {
        return lockUninterruptibly(WATCHDOG);
    }

    /**
     * {@link #lock(long, TimeUnit) lock(long, TimeUnit)} returning the fencing token of the grant.
     *
     * @param leaseTime how long the grant lasts (no watchdog)
     * @param unit the unit of {@code leaseTime}
     * @return the grant's fencing token
     */
    public long lockAndGetToken(long leaseTime, TimeUnit unit) {
        return lockUninterruptibly(lockLeaseMs(leaseTime, unit));
    }

    /**
     * {@link #tryLock() tryLock()} returning the fencing token, or null when busy.
     *
     * @return the grant's fencing token, or null
     */
    public Long tryLockAndGetToken() {
        return tryOnce();
    }

    /**
     * {@link #tryLock(long, long, TimeUnit) tryLock(long, long, TimeUnit)} returning the fencing token, or null when
     * the wait ran out.
     *
     * @param waitTime how long to wait in the queue
     * @param leaseTime how long the grant lasts; &le; 0: none, the grant lives with the client's session (the
     *     watchdog's lease, renewed until unlock, without one)
     * @param unit the unit of both times
     * @return the grant's fencing token, or null
     * @throws InterruptedException if interrupted while waiting (a grant that raced it is released)
     */
    public Long tryLockAndGetToken(long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException {
        return tryAcquire(waitTime, leaseTime, unit);
    }

    /**
     * The fencing token of the current thread's grant: pass it to the resource the lock protects.
     *
     * @return the token
     * @throws IllegalMonitorStateException if the current thread does not hold the lock
     */
    public long getToken() {
        Grant grant = client.grants.get(mine());
        if (grant == null) {
            throw new IllegalMonitorStateException("lock '" + name + "' is not held by the current thread");
        }
        return grant.token;
    }

    /**
     * Runs {@code command} on the lock's server only while the current thread's grant still holds the lock
     * ({@code FLOCK.FENCED key token command ...}, with the grant's fencing token), in one step on the server:
     * a holder that paused past its lease (a GC pause, a frozen VM) cannot otherwise keep its late write from
     * landing after the next holder's, as checking {@link #isLeaseLost()} first and writing then leaves a gap
     * ({@code docs/fencing.md}). Give the command's keys the lock's hash tag ({@code {order:42}:lock},
     * {@code {order:42}:row}): on a Cluster they must share its slot.
     *
     * <p>The command is sent once, never again after a lost reply: {@code FLOCK.FENCED} takes no request ID,
     * and a resend could run it twice, perhaps after the grant had moved on. A reply lost on the way is an
     * {@link UncheckedIOException}, and whether the command ran is then unknown (read the data back, through
     * this method, to find out). MOVED and ASK are followed, as nothing runs before them.
     *
     * <p>The command's own error replies ({@code WRONGTYPE}, {@code ERR ...}, a Cluster's {@code CROSSSLOT})
     * reach the caller as they came, and the grant stays held: only {@code STALE} means it ended.
     *
     * @param command the command and its arguments: each a {@code String} or other {@link CharSequence} (sent
     *     as UTF-8), a {@code byte[]} (as it is), or a {@link Number} (its decimal text)
     * @return the command's reply, mapped as {@link FlockCommands} says ({@code Long}, {@code byte[]}, a status
     *     {@code String}, {@code null}, a {@code List})
     * @throws StaleTokenException if the grant has ended: refused {@code STALE} by the server (nothing ran, and
     *     the grant is lost from then on, {@link LossReason#NOTOWNER}), or already known lost here (nothing sent)
     * @throws IllegalMonitorStateException if the current thread holds no grant of this lock (nothing sent)
     * @throws IllegalArgumentException if {@code command} is empty or an argument of another type (nothing sent)
     * @throws UncheckedIOException if the reply was lost: the command may or may not have run
     */
    public Object fenced(Object... command) {
        byte[][] args = fencedArgs(command);
        Grant grant = client.grants.get(mine());
        if (grant == null) {
            throw new IllegalMonitorStateException("lock '" + name + "' is not held by the current thread: "
                    + "no command runs through it");
        }
        if (client.lostByNow(grant)) {
            throw new StaleTokenException("lock '" + name + "' is no longer held with token " + grant.token + ": "
                    + grant.lostMessage + "; the command was not sent", null);
        }
        args[2] = FlockClient.bytes(Long.toString(grant.token));
        try {
            Router.Route route = client.router.route(key);
            while (true) {
                try {
                    return route.sendOnce(args, n -> n.commands);
                } catch (RuntimeException e) {
                    if (!route.redirected(e)) {
                        throw e;
                    }
                }
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (RuntimeException e) {
            if (!"STALE".equals(RedisError.codeOf(e))) {
                throw e; // the command's own error: it ran, or was refused as a direct call would be
            }
            String stale = new RedisError(e).getMessage();
            client.leaseLost(grant, LossReason.NOTOWNER, "a fenced command was refused: " + stale);
            throw new StaleTokenException(stale, e);
        }
    }

    /** {@code FLOCK.FENCED key <token> command...}, the token's place left for the caller to fill. */
    private byte[][] fencedArgs(Object[] command) {
        if (command.length == 0) {
            throw new IllegalArgumentException("fenced() needs a command to run");
        }
        byte[][] args = new byte[command.length + 3][];
        args[0] = FlockClient.bytes("FLOCK.FENCED");
        args[1] = key;
        for (int i = 0; i < command.length; i++) {
            Object arg = command[i];
            if (arg instanceof byte[]) {
                args[i + 3] = (byte[]) arg;
            } else if (arg instanceof CharSequence || arg instanceof Number) {
                args[i + 3] = FlockClient.bytes(arg.toString());
            } else {
                throw new IllegalArgumentException("fenced() argument " + i + " is " + (arg == null ? "null"
                        : "a " + arg.getClass().getName()) + ": give a String, a byte[] or a number");
            }
        }
        return args;
    }

    /**
     * True once the current thread's grant is known gone: at once when the server pushes the loss through the
     * session (lease ended, force-released, key deleted, demoted), when its session ended, when a watchdog
     * renewal finds it gone, or once its deadline has passed: a fixed lease's end, or the session's (no heartbeat
     * confirmed it for the session timeout), compared with the clock at this call too, so that a process paused
     * past it sees the loss at its first check. The next unlock() then throws.
     *
     * @return whether the current thread's grant was lost
     */
    public boolean isLeaseLost() {
        Grant grant = client.grants.get(mine());
        return grant != null && client.lostByNow(grant);
    }

    /**
     * Why the current thread's grant was lost ({@link #isLeaseLost()}), or null while it is held (or the thread
     * holds none): {@code reason()} gives the word the {@link LeaseLostListener} was told.
     *
     * @return the reason, or null
     */
    public LossReason getLeaseLostReason() {
        Grant grant = client.grants.get(mine());
        return grant != null && client.lostByNow(grant) ? grant.lostReason : null;
    }

    /**
     * Asks the server (FLOCK.INFO), as Redisson does; a shared or semaphore holder among the others counts.
     *
     * @return whether the current thread holds the lock
     */
    public boolean isHeldByCurrentThread() {
        return myHolder() != null;
    }

    /**
     * Asks the server (FLOCK.INFO) whether anyone holds the lock.
     *
     * @return whether the lock is held
     */
    public boolean isLocked() {
        return held(info()) != null;
    }

    /**
     * The current thread's holds on the server.
     *
     * @return the hold count, 0 when it does not hold the lock
     */
    public int getHoldCount() {
        Map<String, Object> mine = myHolder();
        return mine == null ? 0 : ((Long) mine.get("holds")).intValue();
    }

    /**
     * The lease left, as Redisson's (from PTTL).
     *
     * @return milliseconds, or -2 when nobody holds the lock
     */
    public long remainTimeToLive() {
        Map<String, Object> info = held(info());
        return info == null ? -2 : (Long) info.get("ttl-ms");
    }

    /**
     * {@code info} if someone holds the lock: a free lock that a multi-lock's wait keeps its place on has an
     * INFO too (owner nil, no holders).
     */
    private static Map<String, Object> held(Map<String, Object> info) {
        return info == null || ((List<?>) info.get("holders")).isEmpty() ? null : info;
    }

    /**
     * Releases the lock whoever holds it, every shared or semaphore holder too (FLOCK.FORCERELEASE); true if
     * someone held it. Stops this client's watchdogs for it.
     *
     * @return whether someone held it
     */
    public boolean forceUnlock() {
        boolean released = (Long) call("FLOCK.FORCERELEASE", key, FlockClient.bytes("ID"), FlockClient.requestId()) > 0;
        client.grants.keySet().removeIf(k -> {
            if (!k.name.equals(name)) {
                return false;
            }
            Grant grant = client.grants.get(k);
            if (grant != null) {
                grant.stop();
            }
            return true;
        });
        return released;
    }

    /**
     * FLOCK.INFO as a map (owner as bytes, the numbers as Long, {@code holders} as a list of such maps, one per
     * holder), or null when nobody holds the lock and nobody waits for it (owner null and no holders: a
     * multi-lock's wait keeps its place on the free lock).
     *
     * @return the lock's fields, or null
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

    /**
     * A single lock's {@code lock(leaseTime, unit)}, {@code lockInterruptibly(leaseTime, unit)} and
     * {@code lockAndGetToken(leaseTime, unit)} take the lease as {@code unit.toMillis(leaseTime)}, unlike its
     * tries and a multi-lock: -1 ms is the watchdog's lease, any other lease under 1 ms (0, -1 s) the watchdog's
     * timeout without a watchdog (see {@link #acquire}).
     */
    @Override
    long lockLeaseMs(long leaseTime, TimeUnit unit) {
        return unit.toMillis(leaseTime);
    }

    /**
     * waitMs: 0 tries only, FOREVER queues without limit. Returns the token, or null if not granted. Through the
     * session (the default) or, without sessions, a try on a command connection and then a blocking WAIT on a
     * connection of its own. leaseMs {@link #WATCHDOG}: through the session a grant that lives with the session
     * ({@code lease-ms 0}: no lease, no renewals), without one (or with durable grants, whose replicas must see a
     * lease) the watchdog's lease, renewed.
     */
    @Override
    Long acquire(long waitMs, long leaseMs, boolean interruptible) throws InterruptedException {
        if (interruptible && Thread.interrupted()) {
            throw new InterruptedException();
        }
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(waitMs);
        for (int attempt = 0; ; attempt++) {
            long left = waitMs <= 0 ? waitMs : TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
            FlockClient.Taken taken;
            try {
                taken = left <= 0 && waitMs > 0 ? null : acquireWithoutKnownHolds(left, leaseMs, interruptible);
            } catch (RuntimeException e) {
                mayHoldUnknowingly();
                throw e;
            }
            if (taken == null) {
                return null;
            }
            boolean fresh = client.grants.get(mine()) == null;
            if (fresh && taken.leaseMs() == 0 && taken.via().gone() && attempt < FlockClient.RESENDS) {
                // Granted through a session that ended meanwhile (the server ended the grant with it): not held,
                // so the acquire goes on through a new session, for the time it has left.
                continue;
            }
            dropLeakedHolds(taken.token());
            if (client.durableReplicas > 0) {
                // durable grants have a lease of their own (never lease-ms 0): the one asked, or the watchdog's
                confirmDurable(client, List.of(this), List.of(taken.token()),
                        leaseMs > 0 ? leaseMs : client.getWatchdogTimeout(), this::giveBack);
            }
            Grant grant = remember(taken);
            if (fresh && grant.session != null && grant.lostReason != null && attempt < FlockClient.RESENDS) {
                // the same, the session having ended as the grant became known
                forget(grant.key);
                continue;
            }
            return taken.token();
        }
    }

    /**
     * An acquire failed, yet the server may have granted it all the same (a reply lost in a failover): a hold
     * this thread does not know of, which its next grant, a reentry of it, gives back.
     */
    void mayHoldUnknowingly() {
        client.releasedUnknown(mine());
    }

    private FlockClient.Taken acquireWithoutKnownHolds(long waitMs, long leaseMs, boolean interruptible)
            throws InterruptedException {
        // a lease time under 1 ms but the watchdog's: the watchdog's timeout as a fixed lease
        long lease = leaseMs > 0 ? leaseMs : client.getWatchdogTimeout();
        boolean watchdog = leaseMs == WATCHDOG;
        if (!client.usesSessions()) {
            return acquireBlocking(waitMs, lease, watchdog, interruptible);
        }
        try {
            boolean sessionGrant = watchdog && client.durableReplicas == 0;
            return acquireInSession(waitMs, sessionGrant ? 0 : lease, watchdog && !sessionGrant, interruptible);
        } catch (RuntimeException e) {
            if (!client.sessionsUnsupported(e)) {
                throw e;
            }
            // an older module: wait as it allows
            return acquireBlocking(waitMs, lease, watchdog, interruptible);
        }
    }

    /**
     * If the acquire was answered with the token of the grant this thread released last (or may hold
     * unknowingly), that release reached a server that lost it (an old master after a failover) or was refused,
     * so this is a reentry of the grant, with the holds the thread let go still counted. Give back those beyond
     * the holds the thread has not released and this one, before anything else (the durable check included),
     * so that the thread's last unlock frees the lock; otherwise the holds would stay until the lease ends,
     * and while the thread keeps reentering (each reentry resets the lease), nobody else would get the lock.
     * A give-back that fails leaves the token remembered for the next grant; the acquire stands.
     */
    void dropLeakedHolds(long token) {
        Grant.Key thread = mine();
        if (!client.releasedBefore(thread, token)) {
            return;
        }
        Grant grant = client.grants.get(thread);
        // remember(...) counts a known grant's holds on, else starts them anew
        if (grant != null && grant.token == token && grant.lostReason == null) {
            synchronized (grant.holdsLock) { // a re-watch's extra hold would look stale
                giveBackBeyond(grant.holds, thread, token);
            }
        } else {
            giveBackBeyond(0, thread, token);
        }
    }

    /** Gives back the thread's holds of grant {@code token} beyond its {@code unreleased} ones and this one. */
    private void giveBackBeyond(long unreleased, Grant.Key thread, long token) {
        try {
            Map<String, Object> mine = myHolder();
            long extra = mine == null ? 0 : (Long) mine.get("holds") - unreleased - 1;
            for (long i = 0; i < extra; i++) {
                own(releaseArgs());
            }
        } catch (RuntimeException e) {
            if (!"NOTOWNER".equals(RedisError.codeOf(e))) {
                client.released(thread, token);
            }
        }
    }

    /**
     * Durable grants (docs/client-protocol.md, "Durable grants"): {@code FLOCK.RENEW} of each of {@code locks}
     * (this connection's writes, after the grants in the replication stream) and {@code WAIT replicas timeout}
     * in one round trip on a connection to their node (a multi-lock's keys share one). Fewer replicas than
     * asked, or a grant (of {@code tokens}, one per lock) gone: NOTOWNER, or a RENEW that answers another
     * token (another grant of this owner, an older one a failover's promoted replica kept):
     * {@code giveBack} gives back the holds just taken (a new grant's only hold, or a reentry's extra one) and
     * {@link LockNotDurableException} is thrown. A lost reply is sent again (new RENEWs), and on a Cluster or
     * Sentinel sent again to the keys' master after a failover.
     */
    static void confirmDurable(FlockClient client, List<FlockLock> locks, List<Long> tokens, long lease,
            Runnable giveBack) {
        int replicas = client.durableReplicas;
        byte[][] waitArgs = {FlockClient.bytes("WAIT"), FlockClient.bytes(Integer.toString(replicas)),
            FlockClient.bytes(Integer.toString(client.durableTimeoutMs))};
        String why;
        long reached = 0;
        Exception cause = null;
        try {
            Router.Route route = client.router.route(locks.get(0).key);
            for (int resends = 0; ; ) {
                byte[][][] commands = new byte[locks.size() + 1][][];
                for (int i = 0; i < locks.size(); i++) {
                    // A request ID of its own for each RENEW sent: a resend of the same ID would be answered
                    // from the server's record and write nothing for the WAIT to count.
                    commands[i] = new byte[][] {FlockClient.bytes("FLOCK.RENEW"), locks.get(i).key,
                        client.owner(), FlockClient.bytes(Long.toString(lease)), FlockClient.bytes("ID"),
                        FlockClient.requestId()};
                }
                commands[locks.size()] = waitArgs;
                List<Object> replies;
                try {
                    replies = route.pipeline(commands);
                } catch (IOException e) {
                    if (resends++ < FlockClient.RESENDS || route.failedOver()) {
                        continue;
                    }
                    throw e;
                }
                int refused = 0;
                while (refused < locks.size() && !(replies.get(refused) instanceof RuntimeException)) {
                    refused++;
                }
                Object acked = replies.get(locks.size());
                if (refused < locks.size()) {
                    RuntimeException e = (RuntimeException) replies.get(refused);
                    if (route.redirected(e)) {
                        continue; // MOVED, ASK: the grant is on the node named
                    }
                    if (!"NOTOWNER".equals(RedisError.codeOf(e))) {
                        throw e;
                    }
                    why = "the grant" + (locks.size() > 1 ? " of '" + locks.get(refused).name + "'" : "")
                            + " was gone before they did (" + new RedisError(e).getMessage() + ")";
                    cause = e;
                    break;
                }
                if (acked instanceof RuntimeException) {
                    throw (RuntimeException) acked;
                }
                reached = (Long) acked;
                int replaced = 0;
                while (replaced < locks.size() && tokens.get(replaced).equals(replies.get(replaced))) {
                    replaced++;
                }
                if (replaced < locks.size()) {
                    why = "the grant" + (locks.size() > 1 ? " of '" + locks.get(replaced).name + "'" : "") + " (token "
                            + tokens.get(replaced) + ") was gone, the server holds another grant of this owner (token "
                            + replies.get(replaced) + ")";
                    break;
                }
                if (reached >= replicas) {
                    return;
                }
                why = "WAIT " + replicas + " " + client.durableTimeoutMs + " answered " + reached;
                break;
            }
        } catch (IOException e) {
            why = "the server could not be reached (" + e.getMessage() + ")";
            cause = e;
        } catch (RuntimeException e) {
            giveBack.run();
            throw RedisError.specific(e);
        }
        giveBack.run();
        String names = locks.stream().map(FlockLock::getName).collect(java.util.stream.Collectors.joining(", "));
        throw new LockNotDurableException(names, reached, replicas, why, cause);
    }

    /**
     * A grant that won the race with the wait's own end, given back whole. NOTOWNER means it is gone already:
     * a session grant ends with its session, which a kill or an expiry may have ended meanwhile.
     */
    private void giveBackWon() {
        try {
            own(releaseArgs());
        } catch (RuntimeException e) {
            if (!"NOTOWNER".equals(RedisError.codeOf(e))) {
                throw e;
            }
        }
    }

    /** The hold a durable grant could not confirm, given back; NOTOWNER (already gone) and I/O errors ignored. */
    private void giveBack() {
        try {
            own(releaseArgs());
        } catch (RuntimeException e) {
            // gone already (NOTOWNER), or unreachable: its lease ends it, or the thread's next grant, a
            // reentry of it, gives it back
            mayHoldUnknowingly();
        }
    }

    private FlockClient.Taken acquireBlocking(long waitMs, long lease, boolean watchdog, boolean interruptible)
            throws InterruptedException {
        Object reply;
        boolean interrupted = false;
        long sent = System.nanoTime();
        try {
            reply = call(acquireArgs(lease, null, null, FlockClient.requestId()));
            if (reply == null && waitMs != 0) {
                long wait = waitMs == FOREVER ? 0 : waitMs;
                sent = System.nanoTime();
                FlockClient.Reply waited = client.callBlocking(acquireArgs(lease, wait, null, FlockClient.requestId()),
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
                giveBackWon();
            }
            throw new InterruptedException("interrupted while waiting for lock '" + name + "'");
        }
        // the lease began on the server after the command that answered it was sent
        return reply == null ? null : new FlockClient.Taken((Long) reply, sent, lease, watchdog, null);
    }

    /** How long past its WAIT timeout a wait waits for the server's event before it cancels the wait itself. */
    static final long LOCAL_DEADLINE_MARGIN_MS = 2_000;
    /**
     * How long an ending wait waits for the session to show that the server has nothing more for it; then the
     * session, which says nothing, is closed (its end says it).
     */
    static final long CANCEL_GRACE_MS = Protocol.CANCEL_GRACE_MS;
    /** Between attempts to open a new session while the server cannot be reached. */
    static final long REOPEN_PAUSE_MS = 100;

    /**
     * Why a wait ends before its outcome came: interrupted, out of time, an error reply, or a reply that answered
     * it (a grant). It ends once the server can have nothing more for it, so that its thread's next wait of this
     * lock never takes its event: its final event, its session's end, or a fence after a reply that shows the
     * server holds no more of it (a CANCEL's, a grant's).
     */
    private enum Ending { INTERRUPT, DEADLINE, FAILED, ANSWERED }

    /**
     * One {@code FLOCK.ACQUIRE ... [WAIT t] INBOX sid ID rid} on a command connection. A try (waitMs 0)
     * ends with its reply. A wait registers with the session first, then the reply is a token, nil or
     * {@code WAITING}; after {@code WAITING} the session's reader hands over the outcome. An interrupt (or the
     * local deadline, the WAIT timeout plus a margin) sends FLOCK.CANCEL and the wait's event then decides: a
     * grant that won the race with an interrupt is released. A broken session: the wait is sent again, same
     * request ID, to a new one. While the server cannot be reached (before the first WAITING too) the wait
     * retries every {@link #REOPEN_PAUSE_MS} until its own deadline, and then ends as one that ran out. A wait
     * that a lost reply may have queued ends only as {@link Ending} says.
     */
    private FlockClient.Taken acquireInSession(long waitMs, long lease, boolean watchdog, boolean interruptible)
            throws InterruptedException {
        Router.Route route;
        try {
            route = client.router.route(key);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        byte[] rid = FlockClient.requestId();
        if (waitMs == 0) {
            for (int attempt = 0; ; ) {
                String sid = null;
                try {
                    Session.Reader session = route.node().session.current();
                    sid = session.sid;
                    long sent = System.nanoTime();
                    Long token = (Long) route.send(acquireArgs(lease, null, sid, rid), node -> node.commands);
                    return token == null ? null : new FlockClient.Taken(token, sent, lease, watchdog, session);
                } catch (IOException e) {
                    if (!route.failedOver()) {
                        throw new UncheckedIOException(e);
                    }
                } catch (RuntimeException e) {
                    if (sid != null && "NOSESSION".equals(RedisError.codeOf(e)) && attempt++ < FlockClient.RESENDS) {
                        // a new session is opened once its reader handed out what that one had
                        route.node().session.forget(sid);
                    } else if (!route.redirected(e)) { // MOVED, ASK: the same request to the node named
                        throw RedisError.specific(e);
                    }
                }
            }
        }
        Session.Wait wait = new Session.Wait(key, owner());
        long now = System.nanoTime();
        long deadline = waitMs == FOREVER ? 0 : now + TimeUnit.MILLISECONDS.toNanos(waitMs);
        long localDeadline = deadline == 0 ? 0 : deadline + TimeUnit.MILLISECONDS.toNanos(LOCAL_DEADLINE_MARGIN_MS);
        boolean onServer = false;       // the session sent to last may hold the wait, or an event for it
        boolean sendNow = true;
        long sendAt = now;              // nanoTime of the next attempt to send, when sendNow waits for it
        boolean firstSend = true;
        int lost = 0;                   // replies lost in a row: sent again at once, then after a pause
        int noSession = 0;
        boolean interruptedQuietly = false;
        Ending ending = null;
        FlockClient.Taken answered = null;
        long ridSent = 0;               // when the request ID in use was first sent (its grant began after)
        RuntimeException failure = null;
        long giveUpAt = 0;
        try {
            while (true) {
                now = System.nanoTime();
                if (sendNow && now - sendAt >= 0 && ending == null) {
                    sendNow = false;
                    long remainingMs = 0;
                    if (firstSend) {
                        remainingMs = waitMs == FOREVER ? 0 : waitMs;
                        firstSend = false;
                    } else if (deadline != 0) {
                        remainingMs = TimeUnit.NANOSECONDS.toMillis(deadline - now);
                        if (remainingMs <= 0) {
                            // the wait ran out while its session was being replaced, or its replies were lost
                            ending = Ending.DEADLINE;
                            if (!onServer) {
                                return ended(ending, null, null);
                            }
                            giveUpAt = cancel(wait);
                            continue;
                        }
                    }
                    String sid = null;
                    Object reply;
                    try {
                        // on the key's node, naming that node's session
                        String before = wait.sessionId;
                        sid = route.node().session.register(wait);
                        if (sid == null) {
                            continue; // the end of the session it was sent to comes, and sends it again
                        }
                        if (!sid.equals(before)) {
                            onServer = false; // that session ended, and the server's wait with it
                        }
                        if (ridSent == 0) {
                            ridSent = System.nanoTime();
                        }
                        reply = route.sendOnce(acquireArgs(lease, remainingMs, sid, rid), node -> node.commands);
                    } catch (IOException e) {
                        // The command may have been applied. Sent again at once (the same request ID takes over
                        // its place); then, the server cannot be reached (before the first WAITING too): try
                        // again after a pause, until the wait's own deadline, which then ends it as a timeout.
                        // On a Cluster the slot map is asked again first (a failover may have moved the key's
                        // master).
                        onServer |= sid != null;
                        sendNow = true;
                        if (lost++ < FlockClient.RESENDS) {
                            sendAt = System.nanoTime();
                        } else {
                            lost = 0;
                            route.reroute();
                            sendAt = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(REOPEN_PAUSE_MS);
                        }
                        continue;
                    } catch (RuntimeException e) {
                        lost = 0;
                        boolean noSuchSession = sid != null && "NOSESSION".equals(RedisError.codeOf(e));
                        if (noSuchSession && noSession++ < FlockClient.RESENDS) {
                            // its reader hands out what that session had (for this wait too), then its end
                            // sends the wait again
                            wait.session.forget(sid);
                            continue;
                        }
                        if (route.redirected(e)) { // MOVED, ASK: the same request to the node named
                            sendNow = true;
                            continue;
                        }
                        failure = RedisError.specific(e);
                        if (!onServer) {
                            throw failure;
                        }
                        ending = Ending.FAILED; // an earlier send of it may be queued, or its event on its way
                        giveUpAt = cancel(wait);
                        continue;
                    }
                    lost = 0;
                    if (reply == null || reply instanceof Long) { // granted at once (a token) or not (nil)
                        // the grant, if any, began after this request ID was first sent
                        answered = reply == null ? null
                                : new FlockClient.Taken((Long) reply, ridSent, lease, watchdog, wait.reader);
                        if (!onServer) {
                            return answered;
                        }
                        // an earlier send of it was queued, and its event (its grant's) may be on its way
                        ending = Ending.ANSWERED;
                        wait.fence();
                        giveUpAt = fenceGiveUp(wait);
                        continue;
                    }
                    if (!"WAITING".equals(text(reply))) { // a status reply; some libraries give it as bytes
                        throw new IllegalStateException("FLOCK.ACQUIRE answered " + text(reply));
                    }
                    onServer = true;
                    noSession = 0;
                }
                long until = ending != null ? giveUpAt : sendNow ? sendAt : localDeadline;
                Session.Event event;
                try {
                    if (until == 0) {
                        event = wait.events.take();
                    } else {
                        event = wait.events.poll(Math.max(0, until - System.nanoTime()), TimeUnit.NANOSECONDS);
                    }
                } catch (InterruptedException e) {
                    if (!interruptible || ending == Ending.FAILED || ending == Ending.ANSWERED) {
                        interruptedQuietly = true; // lock(): as ReentrantLock, keep waiting and keep the flag
                    } else if (ending == null) {
                        ending = Ending.INTERRUPT;
                        if (!onServer) {
                            return ended(ending, null, null);
                        }
                        giveUpAt = cancel(wait);
                    } else {
                        ending = Ending.INTERRUPT; // out of time, and the CANCEL went out
                    }
                    continue;
                }
                if (event == null) {
                    now = System.nanoTime();
                    if (ending != null && now - giveUpAt >= 0) {
                        wait.closeSession();
                        giveUpAt = 0;
                    } else if (ending == null && localDeadline != 0 && now - localDeadline >= 0) {
                        ending = Ending.DEADLINE;
                        if (!onServer) {
                            return ended(ending, null, null);
                        }
                        giveUpAt = cancel(wait);
                    }
                    continue;
                }
                boolean current = event.sessionId().equals(wait.sessionId);
                switch (event.kind()) {
                    case Session.Event.GRANTED: // from any session: the grant is the wait's, held on the server
                        if (ending == Ending.ANSWERED) {
                            continue; // the grant the reply answered, or an earlier one that ended
                        }
                        if (ending == Ending.INTERRUPT || ending == Ending.FAILED) {
                            // The grant won the race with FLOCK.CANCEL: give it back whole (a wait's grant is
                            // never a reentry), then report the interrupt or the error.
                            giveBackWon();
                            return ended(ending, null, failure);
                        }
                        // a grant just past the local deadline is still a grant; a lease's left is counted from
                        // the read that brought it
                        return new FlockClient.Taken(event.token(), event.readSentNanos(),
                                lease == 0 ? 0 : leaseLeft(event.detail(), lease), watchdog, event.reader());
                    case Session.Event.TIMEOUT:
                    case Session.Event.CANCELLED:
                        if (!current || ending == Ending.ANSWERED) {
                            continue; // of a request that a later one (same ID) replaced, or answered
                        }
                        return ending == null ? null : ended(ending, answered, failure);
                    case Session.Event.ERROR:
                        if (!current || ending == Ending.ANSWERED) {
                            continue;
                        }
                        if (ending != null) {
                            return ended(ending, answered, failure);
                        }
                        onServer = false;
                        if ("LOCKDELETED".equals(RedisError.codeOf(new RedisError(event.detail())))
                                && route.keyMoved()) {
                            // MIGRATE took the key (and its request IDs) to another node: queue there, at
                            // the tail, as a new request with what is left of the wait
                            rid = FlockClient.requestId();
                            ridSent = 0;
                            sendNow = true;
                            sendAt = System.nanoTime();
                            continue;
                        }
                        if ("UNBLOCKED".equals(RedisError.codeOf(new RedisError(event.detail())))
                                && client.router.failsOver()) {
                            // The key's node became a replica (a Cluster or Sentinel failover) and dropped the
                            // wait: send it again, same request ID (a grant made before the failover and
                            // replicated is answered as such), to the key's master now, for the time left.
                            route.reroute();
                            sendNow = true;
                            sendAt = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(REOPEN_PAUSE_MS);
                            continue;
                        }
                        throw RedisError.specific(new RedisError(event.detail()));
                    case Session.Event.BROKEN:
                    case Session.Event.FENCED: // asked for only while ending
                        if (!current) {
                            continue; // about a session this wait already left
                        }
                        onServer = false; // the server dropped the wait with its session, or holds no more of it
                        if (ending != null) {
                            return ended(ending, answered, failure);
                        }
                        sendNow = true;
                        sendAt = System.nanoTime();
                        continue;
                    case Session.Event.CLOSED:
                    default:
                        throw new IllegalStateException(
                                "the FlockClient was closed while waiting for lock '" + name + "'");
                }
            }
        } finally {
            wait.unregister();
            if (interruptedQuietly) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /**
     * The lease left of a {@code granted} event ({@code detail}, ms when the read answered); {@code lease} when
     * the detail is not a number (a server that sent none).
     */
    private static long leaseLeft(String detail, long lease) {
        try {
            return Math.max(1, Math.min(lease, Long.parseLong(detail)));
        } catch (NumberFormatException e) {
            return lease;
        }
    }

    /** How an ending wait ends once the server has nothing more for it. */
    private FlockClient.Taken ended(Ending ending, FlockClient.Taken answered, RuntimeException failure)
            throws InterruptedException {
        switch (ending) {
            case INTERRUPT:
                throw new InterruptedException("interrupted while waiting for lock '" + name + "'");
            case FAILED:
                throw failure;
            case ANSWERED:
                return answered;
            default:
                return null; // out of time
        }
    }

    /**
     * FLOCK.CANCEL for this thread's wait, which the server may hold, and then a fence: once the session has
     * handed out what the server had for the wait by the CANCEL (its final event, if any), nothing more comes.
     * Returns when to stop waiting for that.
     */
    private long cancel(Session.Wait wait) {
        long giveUpAt = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(CANCEL_GRACE_MS);
        try {
            // sent once, within the grace: no answer by then closes the session (its waits are sent again)
            client.router.route(key).callTimed(new byte[][] {FlockClient.bytes("FLOCK.CANCEL"), key, wait.owner},
                    n -> n.commands, (int) CANCEL_GRACE_MS);
            wait.fence();
            return fenceGiveUp(wait);
        } catch (IOException | RuntimeException e) {
            // the final event or the session's end may still come; else, after the grace, the session is closed
        }
        return giveUpAt;
    }

    /**
     * When to stop waiting for the fence just asked for: the session's next read brings it, within a quarter of
     * its timeout, or its deadline ends the session; past its timeout and a grace more, the session says nothing
     * and is closed.
     */
    private static long fenceGiveUp(Session.Wait wait) {
        return System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(wait.reader.timeoutMs + CANCEL_GRACE_MS);
    }

    /** waitMs: null for a try, 0 for no limit; sessionId: null without a session. */
    private byte[][] acquireArgs(long leaseMs, Long waitMs, String sessionId, byte[] requestId) {
        List<byte[]> args = new ArrayList<>(List.of(FlockClient.bytes("FLOCK.ACQUIRE"), key, owner(),
                FlockClient.bytes(Long.toString(leaseMs))));
        args.addAll(acquireOptions);
        if (client.lockDelayMs >= 0) {
            args.add(FlockClient.bytes("LOCKDELAY"));
            args.add(FlockClient.bytes(Long.toString(client.lockDelayMs)));
        }
        if (waitMs != null) {
            args.add(FlockClient.bytes("WAIT"));
            args.add(FlockClient.bytes(Long.toString(waitMs)));
        }
        if (sessionId != null) {
            args.add(FlockClient.bytes("INBOX"));
            args.add(FlockClient.bytes(sessionId));
        }
        args.add(FlockClient.bytes("ID"));
        args.add(requestId);
        return args.toArray(new byte[0][]);
    }

    /**
     * A new token is a new grant (also after a lost lease); the same token is a reentry of the one known, which
     * takes the terms of this acquire (its lease, or living with the session again).
     */
    Grant remember(FlockClient.Taken taken) {
        Grant.Key mine = mine();
        Grant grant = client.grants.get(mine);
        boolean fresh = grant == null || grant.token != taken.token() || grant.lostReason != null;
        if (fresh) {
            if (grant != null) {
                grant.stop();
            }
            grant = new Grant(mine, key, owner(), taken.token(), acquireOptions);
            client.grants.put(mine, grant);
        }
        grant.holds++;
        client.track(grant, taken);
        if (fresh) {
            client.checkEarlyLoss(grant);
        }
        return grant;
    }

    private void forget(Grant.Key mine) {
        Grant grant = client.grants.remove(mine);
        if (grant != null) {
            grant.stop();
        }
    }

    /** The calling thread's grant of this lock, as the client's grants are keyed. */
    Grant.Key mine() {
        return new Grant.Key(name, Thread.currentThread().getId());
    }

    private byte[] owner() {
        return client.owner();
    }

    /** FLOCK.RELEASE of one of the thread's holds, with a request ID of its own. */
    private byte[][] releaseArgs() {
        return new byte[][] {FlockClient.bytes("FLOCK.RELEASE"), key, owner(), FlockClient.bytes("ID"),
            FlockClient.requestId()};
    }

    /**
     * A command the client sends for itself (a give-back, a cancel) on the key's node: each send within a quarter
     * of the session timeout, a lost reply sent again at once with the same arguments (the same request ID), up
     * to {@link FlockClient#RESENDS} times; then {@link UncheckedIOException}.
     */
    private Object own(byte[][] args) {
        try {
            Router.Route route = client.router.route(key);
            int ms = (int) Protocol.heartbeatMs(route.node().session.timeoutMs());
            for (int attempt = 0; ; attempt++) {
                try {
                    return route.callTimed(args, n -> n.commands, ms);
                } catch (IOException e) {
                    if (attempt == FlockClient.RESENDS) {
                        throw e;
                    }
                }
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
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

    static String text(Object reply) {
        return reply instanceof byte[] ? new String((byte[]) reply, StandardCharsets.UTF_8) : String.valueOf(reply);
    }
}
