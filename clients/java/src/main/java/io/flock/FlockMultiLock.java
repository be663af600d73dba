package io.flock;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Lock;
import java.util.stream.Collectors;

/**
 * Several locks of one client taken and released together, all or none: Redisson's {@code RedissonMultiLock}
 * ({@code getMultiLock}) as a {@link Lock}. Get one from {@link FlockClient#getMultiLock}.
 *
 * <p>Each acquire is one {@code FLOCK.ACQUIREALL}: a try takes every key or none; a wait joins every key's FIFO
 * queue at once, keeps its place in each, and is granted all of them together when the last comes free. Each
 * unlock is one {@code FLOCK.RELEASEALL}. The owner is the thread's, the one its single locks use
 * ({@code <client UUID>:<thread id>}): a key the thread holds already is reentered (one more hold, its token),
 * and a wait that would close a cycle with what the thread holds throws {@link DeadlockException} at once.
 * After the grant each key is an ordinary hold of the thread, with its own token and lease: without a lease
 * time the watchdog renews every key until the unlock, and that key's {@link FlockLock} sees the hold
 * ({@link FlockLock#getToken()}, {@link FlockLock#unlock()}).
 *
 * <p>A wait blocks a connection of its own from the client's pool (the server has no session form of
 * {@code ACQUIREALL}), cancelled with {@code CLIENT UNBLOCK} on an interrupt. The loss of a grant is not pushed
 * (no session watches it): the watchdog's renewal finds it, or the unlock. On a Cluster every command goes to
 * the node of the first key, and the keys must share a hash slot: name them with one hash tag
 * ({@code {account:42}:from}, {@code {account:42}:to}). Errors are as for {@link FlockLock}: I/O failures that
 * outlast {@link FlockClient#RESENDS} resends (the same request ID each time) as {@link UncheckedIOException},
 * error replies as {@link RedisError}; with durable grants every key's grant waits for the replicas, or all are
 * given back and {@link LockNotDurableException} thrown.
 */
public final class FlockMultiLock extends AbstractFlockLock<List<Long>> implements Lock {
    private final FlockClient client;
    private final List<FlockLock> locks;
    /** The node of the first key serves them all (a Cluster: they share its slot). */
    private final byte[] firstKey;
    /** The options every key is taken with: none, or SHARED. */
    private final List<byte[]> mode;

    FlockMultiLock(FlockClient client, FlockLock... locks) {
        if (locks.length == 0) {
            throw new IllegalArgumentException("a multi-lock needs at least one lock");
        }
        Set<String> names = new HashSet<>();
        List<byte[]> mode = locks[0].acquireOptions;
        for (FlockLock lock : locks) {
            if (lock.client != client) {
                throw new IllegalArgumentException("lock '" + lock.getName() + "' belongs to another FlockClient: "
                        + "a multi-lock takes the locks of one client (one owner per thread, one server)");
            }
            if (!names.add(lock.getName())) {
                throw new IllegalArgumentException("lock '" + lock.getName() + "' is named twice in a multi-lock");
            }
            if (!sameOptions(lock.acquireOptions, mode)) {
                throw new IllegalArgumentException("lock '" + lock.getName() + "' is taken in another mode than '"
                        + locks[0].getName() + "': one multi-lock takes every key exclusively, or every key as a "
                        + "read lock");
            }
        }
        if (!mode.isEmpty() && !(mode.size() == 1 && "SHARED".equals(FlockLock.text(mode.get(0))))) {
            throw new IllegalArgumentException("a semaphore's permits are not for a multi-lock (FLOCK.ACQUIREALL "
                    + "takes locks and read locks)");
        }
        this.client = client;
        this.locks = List.of(locks);
        this.firstKey = locks[0].key;
        this.mode = mode;
    }

    private static boolean sameOptions(List<byte[]> a, List<byte[]> b) {
        if (a.size() != b.size()) {
            return false;
        }
        for (int i = 0; i < a.size(); i++) {
            if (!Arrays.equals(a.get(i), b.get(i))) {
                return false;
            }
        }
        return true;
    }

    /**
     * The locks this multi-lock takes, in the order their keys are sent (and their tokens answered).
     *
     * @return the locks
     */
    public List<FlockLock> getLocks() {
        return locks;
    }

    // --- java.util.concurrent.locks.Lock: unlock() here; the rest, and Redisson's overloads with a lease or wait
    // time, are AbstractFlockLock's, over acquire(...) ---

    /**
     * Releases one hold of every key in one {@code FLOCK.RELEASEALL}. When the thread no longer holds one of them
     * (its lease ended, it was force-released; known lost, or refused {@code NOTOWNER}), each key it still holds
     * is released on its own, so that none stays held, and the {@link IllegalMonitorStateException} of the first
     * key not held is thrown (those of the others suppressed in it).
     */
    @Override
    public void unlock() {
        List<Grant> grants = new ArrayList<>();
        for (FlockLock lock : locks) {
            Grant grant = client.grants.get(lock.mine());
            if (grant != null && client.lostByNow(grant)) {
                unlockEach();
                return;
            }
            grants.add(grant);
        }
        if (!releaseAll(grants, 0)) {
            unlockEach();
        }
    }

    /**
     * FLOCK.RELEASEALL while holding every grant's {@code holdsLock}, as a single unlock does (a re-watch adds a
     * hold and releases it meanwhile otherwise); false when refused NOTOWNER. Only the thread's own unlocks and
     * the watchdog thread's re-watches (one grant at a time) take these monitors, so taking several is safe.
     */
    private boolean releaseAll(List<Grant> grants, int from) {
        if (from < grants.size()) {
            Grant grant = grants.get(from);
            synchronized (grant != null ? grant.holdsLock : new Object()) {
                return releaseAll(grants, from + 1);
            }
        }
        List<?> left;
        try {
            left = (List<?>) send(releaseArgs());
        } catch (RuntimeException e) {
            if ("NOTOWNER".equals(RedisError.codeOf(e))) {
                return false;
            }
            for (int i = 0; i < locks.size(); i++) {
                locks.get(i).releaseFailed(grants.get(i));
            }
            throw e;
        }
        for (int i = 0; i < locks.size(); i++) {
            locks.get(i).releasedOne(grants.get(i), (Long) left.get(i));
        }
        return true;
    }

    private void unlockEach() {
        RuntimeException first = null;
        for (FlockLock lock : locks) {
            try {
                lock.unlock();
            } catch (RuntimeException e) {
                if (first == null) {
                    first = e;
                } else {
                    first.addSuppressed(e);
                }
            }
        }
        if (first != null) {
            throw first;
        }
    }

    // --- Redisson's RLock shapes, with the fencing tokens ---

    /**
     * {@link #lock() lock()} returning the fencing tokens of the grants.
     *
     * @return each key's token, in the order of {@link #getLocks()}
     */
    public List<Long> lockAndGetTokens() {
        return lockUninterruptibly(WATCHDOG);
    }

    /**
     * {@link #tryLock() tryLock()} returning the fencing tokens, or null when a key was busy.
     *
     * @return each key's token in the order of {@link #getLocks()}, or null
     */
    public List<Long> tryLockAndGetTokens() {
        return tryOnce();
    }

    /**
     * {@link #tryLock(long, long, TimeUnit) tryLock(long, long, TimeUnit)} returning the fencing tokens, or null when
     * the wait ran out.
     *
     * @param waitTime how long to wait in the queues
     * @param leaseTime how long each grant lasts; &le; 0: the watchdog's lease, renewed until unlock
     * @param unit the unit of both times
     * @return each key's token in the order of {@link #getLocks()}, or null
     * @throws InterruptedException if interrupted while waiting (a grant that raced it is given back)
     */
    public List<Long> tryLockAndGetTokens(long waitTime, long leaseTime, TimeUnit unit)
            throws InterruptedException {
        return tryAcquire(waitTime, leaseTime, unit);
    }

    /**
     * The fencing tokens of the current thread's grants: pass each to the resource its lock protects.
     *
     * @return each key's token, in the order of {@link #getLocks()}
     * @throws IllegalMonitorStateException if the current thread does not hold one of the locks
     */
    public List<Long> getTokens() {
        return locks.stream().map(FlockLock::getToken).collect(Collectors.toUnmodifiableList());
    }

    /**
     * Runs {@code command} only while the current thread's grant of {@code key} still holds it, in one step on the
     * server ({@code FLOCK.FENCED} with that key's token): {@link FlockLock#fenced} of that key's lock. One key,
     * because the server checks one token per command; the keys were granted together, but each grant ends on
     * its own (a lease, a force-release of that key).
     *
     * @param key the name of one of {@link #getLocks()}, whose token guards the command
     * @param command the command and its arguments ({@code String}, {@code byte[]} or number each)
     * @return the command's reply
     * @throws StaleTokenException if that key's grant has ended (nothing ran; it is lost from then on, and
     *     {@link #unlock()} then releases the other keys and throws) or is known lost here (nothing sent)
     * @throws IllegalMonitorStateException if the current thread holds no grant of {@code key} (nothing sent)
     * @throws IllegalArgumentException if {@code key} is not one of this multi-lock's keys
     */
    public Object fenced(String key, Object... command) {
        for (FlockLock lock : locks) {
            if (lock.getName().equals(key)) {
                return lock.fenced(command);
            }
        }
        throw new IllegalArgumentException("'" + key + "' is not a key of this multi-lock ("
                + locks.stream().map(FlockLock::getName).collect(Collectors.joining(", ")) + ")");
    }

    /**
     * Asks the server (FLOCK.INFO of each key), as Redisson's multi-lock asks each lock.
     *
     * @return whether the current thread holds every one of the locks
     */
    public boolean isHeldByCurrentThread() {
        return locks.stream().allMatch(FlockLock::isHeldByCurrentThread);
    }

    /**
     * True once the grant of one of the keys is known gone (see {@link FlockLock#isLeaseLost()}; for the grants
     * of a multi-lock, found by the watchdog's renewals). The next unlock() then throws.
     *
     * @return whether one of the current thread's grants was lost
     */
    public boolean isLeaseLost() {
        return locks.stream().anyMatch(FlockLock::isLeaseLost);
    }

    // --- the acquire path ---

    /**
     * waitMs: 0 tries only, FOREVER queues without limit. Returns the tokens, or null if not granted. What follows
     * a grant is a single lock's, for each key: leaked holds dropped, the durable check (all keys in one round
     * trip), the grant remembered with its watchdog.
     */
    @Override
    List<Long> acquire(long waitMs, long leaseMs, boolean interruptible) throws InterruptedException {
        if (interruptible && Thread.interrupted()) {
            throw new InterruptedException();
        }
        long lease = leaseMs > 0 ? leaseMs : client.getWatchdogTimeout();
        List<Long> tokens;
        long sent = System.nanoTime(); // each lease began on the server after this
        try {
            tokens = waitMs == 0 ? tokens(send(acquireArgs(lease, null, FlockClient.requestId())))
                    : await(waitMs, lease, interruptible);
        } catch (RuntimeException e) {
            locks.forEach(FlockLock::mayHoldUnknowingly);
            throw e;
        }
        if (tokens != null) {
            for (int i = 0; i < locks.size(); i++) {
                locks.get(i).dropLeakedHolds(tokens.get(i));
            }
            if (client.durableReplicas > 0) {
                FlockLock.confirmDurable(client, locks, tokens, lease, this::giveBack);
            }
            for (int i = 0; i < locks.size(); i++) {
                locks.get(i).remember(new FlockClient.Taken(tokens.get(i), sent, lease, leaseMs == WATCHDOG, null));
            }
        }
        return tokens;
    }

    /**
     * A blocking {@code FLOCK.ACQUIREALL ... WAIT t ID rid} on a connection of its own (lost replies resent with
     * the same ID). An interrupt (interruptible only) unblocks it; a grant that won that race is given back.
     */
    private List<Long> await(long waitMs, long lease, boolean interruptible) throws InterruptedException {
        byte[] rid = FlockClient.requestId();
        long deadline = waitMs == FOREVER ? 0 : System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(waitMs);
        long timeoutMs = waitMs == FOREVER ? 0 : waitMs; // WAIT 0: no limit
        boolean interruptedQuietly = false;
        try {
            while (true) {
                FlockClient.Reply waited;
                try {
                    waited = client.callBlocking(firstKey, acquireArgs(lease, timeoutMs, rid), interruptible);
                } catch (IOException e) {
                    throw new UncheckedIOException(e);
                } catch (RuntimeException e) {
                    if (!"QUEUED".equals(RedisError.codeOf(e))) {
                        throw specific(e);
                    }
                    // A resend (its reply was lost) came before the server saw the first connection close: that
                    // wait still holds the places. Send again, same ID, once it is gone: a grant it got meanwhile
                    // is answered to the resend.
                    try {
                        Thread.sleep(FlockLock.REOPEN_PAUSE_MS);
                    } catch (InterruptedException interrupted) {
                        if (interruptible) {
                            List<Long> raced = endWaitElsewhere(rid, lease);
                            if (raced != null) {
                                giveBack();
                            }
                            throw new InterruptedException("interrupted while waiting for " + describe());
                        }
                        interruptedQuietly = true; // lock(): as ReentrantLock, keep waiting and keep the flag
                    }
                    if (deadline != 0) {
                        timeoutMs = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
                        if (timeoutMs <= 0) {
                            return endWaitElsewhere(rid, lease); // a grant that still won is kept, as ever
                        }
                    }
                    continue;
                }
                if (waited.interrupted) {
                    if (waited.value != null) {
                        // the grant won the race with CLIENT UNBLOCK: RELEASEALL takes back the holds it added
                        giveBack();
                    }
                    throw new InterruptedException("interrupted while waiting for " + describe());
                }
                return tokens(waited.value);
            }
        } finally {
            if (interruptedQuietly) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /**
     * Ends this thread's wait that another connection still holds on the server (FLOCK.CANCEL at each key until
     * one finds it: it does not queue at the keys it holds), then asks with its request ID as a try: the tokens
     * if it was granted first (or every key is free now), else null.
     */
    private List<Long> endWaitElsewhere(byte[] rid, long lease) {
        for (FlockLock lock : locks) {
            Object cancelled = send(new byte[][] {FlockClient.bytes("FLOCK.CANCEL"), lock.key, client.owner()});
            if (Long.valueOf(1).equals(cancelled)) {
                break;
            }
        }
        return tokens(send(acquireArgs(lease, null, rid)));
    }

    /** Gives back one hold of every key (what a grant added); unreachable: each key's next grant gives it back. */
    private void giveBack() {
        try {
            send(releaseArgs());
        } catch (RuntimeException e) {
            locks.forEach(FlockLock::mayHoldUnknowingly);
        }
    }

    /**
     * On a command connection of the first key's node: a lost reply resent (same arguments, so the same
     * request ID), MOVED and ASK followed, a failover waited for. An error reply as this client's exception.
     */
    private Object send(byte[][] args) {
        try {
            return client.router.call(firstKey, args, node -> node.commands, true);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (RuntimeException e) {
            throw specific(e);
        }
    }

    /** DEADLOCK and the others as {@link RedisError#specific}; CROSSSLOT says what to do about it. */
    private RuntimeException specific(RuntimeException error) {
        if ("CROSSSLOT".equals(RedisError.codeOf(error))) {
            return new IllegalArgumentException("the keys of a multi-lock must be in one Cluster hash slot: give them "
                    + "one hash tag, as {account:42}:from and {account:42}:to (only the part in braces is hashed); "
                    + describe() + " are not (" + new RedisError(error).getMessage() + ")", error);
        }
        return RedisError.specific(error);
    }

    /** waitMs: null for a try, 0 for no limit. */
    private byte[][] acquireArgs(long leaseMs, Long waitMs, byte[] requestId) {
        List<byte[]> args = args("FLOCK.ACQUIREALL", requestId);
        args.add(args.size() - 2, FlockClient.bytes(Long.toString(leaseMs))); // after the owner, before the ID
        if (waitMs != null) {
            args.add(FlockClient.bytes("WAIT"));
            args.add(FlockClient.bytes(Long.toString(waitMs)));
        }
        args.addAll(mode);
        return args.toArray(new byte[0][]);
    }

    private byte[][] releaseArgs() {
        return args("FLOCK.RELEASEALL", FlockClient.requestId()).toArray(new byte[0][]);
    }

    /** {@code command numkeys key... owner ID requestId}. */
    private List<byte[]> args(String command, byte[] requestId) {
        List<byte[]> args = new ArrayList<>();
        args.add(FlockClient.bytes(command));
        args.add(FlockClient.bytes(Integer.toString(locks.size())));
        for (FlockLock lock : locks) {
            args.add(lock.key);
        }
        args.add(client.owner());
        args.add(FlockClient.bytes("ID"));
        args.add(requestId);
        return args;
    }

    private static List<Long> tokens(Object reply) {
        if (reply == null) {
            return null;
        }
        if (!(reply instanceof List)) {
            throw new IllegalStateException("FLOCK.ACQUIREALL answered " + FlockLock.text(reply));
        }
        return ((List<?>) reply).stream().map(token -> (Long) token).collect(Collectors.toUnmodifiableList());
    }

    private String describe() {
        return "locks " + locks.stream().map(lock -> "'" + lock.getName() + "'").collect(Collectors.joining(", "));
    }
}
