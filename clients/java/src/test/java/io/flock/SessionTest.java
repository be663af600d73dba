package io.flock;

import static io.flock.TestServer.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;

/** Waits through the client's FLOCK session (the default): multiplexed, resent, cancelled; losses pushed. */
@Order(1) // among the longest classes: started first (build.sh orders classes so), not left to end the run
class SessionTest extends ServerTest {

    /** The server's ids of the session connections (last command FLOCK.SESSION or FLOCK.INBOX). */
    List<Long> sessionConnections() {
        String list;
        try {
            list = new String((byte[]) admin.call("CLIENT", "LIST"), StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
        List<Long> ids = new ArrayList<>();
        for (String line : list.split("\n")) {
            if (line.contains(" cmd=flock.inbox") || line.contains(" cmd=flock.session")) {
                ids.add(Long.parseLong(line.substring(3, line.indexOf(' '))));
            }
        }
        return ids;
    }

    @Test
    void twoHundredWaitingThreadsAddAtMostFourConnections() throws Exception {
        int threads = 200;
        FlockClient client = client();
        FlockLock lock = client.getFairLock("k");
        assertNull(info("k")); // the test's own client connects now: not counted with the client's below
        long before = connectedClients();
        admin.call("CONFIG", "SET", "maxclients", "40");
        try {
            lock.lock();
            AtomicInteger granted = new AtomicInteger();
            List<Thread> waiting = new ArrayList<>();
            for (int i = 0; i < threads; i++) {
                waiting.add(spawn(() -> {
                    lock.lock();
                    granted.incrementAndGet();
                    lock.unlock();
                }));
            }
            await(threads + " waiters queue", () -> waiters("k") == threads);
            long added = connectedClients() - before;
            // the session and the command connections, however many threads wait
            assertTrue(added <= 4, "the client added " + added + " connections for " + threads + " waiters");
            lock.unlock();
            joinAll(waiting);
            assertEquals(threads, granted.get());
            await("the lock is free", () -> info("k") == null);
        } finally {
            admin.call("CONFIG", "SET", "maxclients", "10000");
        }
    }

    @Test
    void waitersOfOneProcessAreGrantedInQueueOrderThroughTheSession() throws Exception {
        FlockClient client = client();
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        List<Integer> order = Collections.synchronizedList(new ArrayList<>());
        List<Thread> waiting = queueInTurn("k", 12, n -> () -> {
            lock.lock();
            order.add(n);
            lock.unlock();
        });
        assertEquals(1, sessionConnections().size(), "one session for every waiting thread");
        lock.unlock();
        joinAll(waiting);
        List<Integer> expected = new ArrayList<>();
        for (int i = 0; i < 12; i++) {
            expected.add(i);
        }
        assertEquals(expected, order);
    }

    @Test
    void aForceReleaseIsPushedAtOnceWithTheWatchdog() throws Exception {
        FlockClient client = client(60_000); // no renewal in the test's time: the push tells
        CompletableFuture<String> reported = new CompletableFuture<>();
        client.setLeaseLostListener((name, thread, token, reason) -> reported.complete(name + " " + reason));
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        assertFalse(lock.isLeaseLost());
        assertEquals(1L, admin.call("FLOCK.FORCERELEASE", "k"));
        assertEquals("k forcereleased", reported.get(10, TimeUnit.SECONDS));
        assertTrue(lock.isLeaseLost());
        assertEquals(0, client.watchdogs());
        IllegalMonitorStateException e = assertThrows(IllegalMonitorStateException.class, lock::unlock);
        assertTrue(e.getMessage().contains("not locked by current thread"), e.getMessage());
        assertTrue(e.getMessage().contains("force-released"), e.getMessage());
    }

    @Test
    void aFixedLeaseThatRunsOutIsPushed() throws Exception {
        FlockClient client = client();
        CompletableFuture<String> reported = new CompletableFuture<>();
        client.setLeaseLostListener((name, thread, token, reason) -> reported.complete(name + " " + reason));
        FlockLock lock = client.getFairLock("k");
        long token = lock.lockAndGetToken(300, TimeUnit.MILLISECONDS);
        assertEquals(0, client.watchdogs());
        await("the loss is known", lock::isLeaseLost);
        assertEquals("k expired", reported.get(10, TimeUnit.SECONDS));
        assertEquals(token, lock.getToken());
        IllegalMonitorStateException e = assertThrows(IllegalMonitorStateException.class, lock::unlock);
        assertTrue(e.getMessage().contains("lease ended"), e.getMessage());
        assertFalse(lock.isLeaseLost());
    }

    @Test
    void aDeletedKeyIsPushedToEveryHolder() throws Exception {
        FlockClient client = client();
        List<String> reasons = Collections.synchronizedList(new ArrayList<>());
        client.setLeaseLostListener((name, thread, token, reason) -> reasons.add(reason));
        FlockReadWriteLock rw = client.getReadWriteLock("k");
        rw.readLock().lock();
        onThread(() -> {
            rw.readLock().lock();
            return null;
        }).get(10, TimeUnit.SECONDS);
        assertEquals(2, holderCount("k"));
        admin.call("DEL", "k");
        await("both losses are known", () -> reasons.size() == 2);
        assertEquals(List.of("deleted", "deleted"), reasons);
        assertTrue(rw.readLock().isLeaseLost());
    }

    /** The server pushes the loss before the grant to the next waiter, and the reader keeps that order. */
    @Test
    void aLossIsKnownBeforeALaterGrantOfTheSameProcess() throws Exception {
        FlockClient client = client();
        List<String> seen = Collections.synchronizedList(new ArrayList<>());
        client.setLeaseLostListener((name, thread, token, reason) -> seen.add("lost " + reason));
        FlockLock lock = client.getFairLock("k");
        onThread(() -> lock.lockAndGetToken(400, TimeUnit.MILLISECONDS)).get(10, TimeUnit.SECONDS);
        CompletableFuture<Void> next = onThread(() -> {
            lock.lock();
            seen.add("granted");
            lock.unlock();
            return null;
        });
        next.get(10, TimeUnit.SECONDS);
        assertEquals(List.of("lost expired", "granted"), seen);
    }

    @Test
    void anInterruptCancelsTheSessionWait() throws Exception {
        FlockClient client = client();
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        AtomicReference<Thread> waiter = new AtomicReference<>();
        CompletableFuture<Boolean> tried = onThread(() -> {
            waiter.set(Thread.currentThread());
            return lock.tryLock(30, -1, TimeUnit.SECONDS);
        });
        await("the waiter queues", () -> waiters("k") == 1);
        waiter.get().interrupt();
        assertTrue(failure(tried) instanceof InterruptedException);
        assertEquals(0, waiters("k"));
        lock.unlock();
        assertNull(info("k"));
        // lock() is not interruptible: it keeps waiting, is granted, and keeps the flag.
        lock.lock();
        CompletableFuture<Boolean> uninterruptible = onThread(() -> {
            waiter.set(Thread.currentThread());
            lock.lock();
            boolean flag = Thread.interrupted();
            lock.unlock();
            return flag;
        });
        await("the waiter queues", () -> waiters("k") == 1);
        waiter.get().interrupt();
        Thread.sleep(100); // nothing to observe: the point is that nothing changes
        assertEquals(1, waiters("k"));
        lock.unlock();
        assertTrue(uninterruptible.get(10, TimeUnit.SECONDS));
    }

    @Test
    void aKilledSessionConnectionResendsTheWaits() throws Exception {
        FlockClient client = client();
        FlockLock lock = client.getFairLock("k");
        lock.lock(60, TimeUnit.SECONDS); // a lease of its own: it outlives the session
        int n = 5;
        AtomicInteger granted = new AtomicInteger();
        CountDownLatch done = new CountDownLatch(n);
        for (int i = 0; i < n; i++) {
            spawn(() -> {
                lock.lock();
                granted.incrementAndGet();
                lock.unlock();
                done.countDown();
            });
        }
        await(n + " waiters queue", () -> waiters("k") == n);
        List<Long> sessions = sessionConnections();
        assertEquals(1, sessions.size());
        long killed = sessions.get(0);
        assertEquals(1L, admin.call("CLIENT", "KILL", "ID", Long.toString(killed)));
        await("a new session reads", () -> {
            List<Long> now = sessionConnections();
            return now.size() == 1 && now.get(0) != killed;
        });
        await("the waits are sent again", () -> waiters("k") == n);
        assertEquals(2, client.session().opened());
        assertTrue(lock.isHeldByCurrentThread(), "a grant with a lease outlives its session");
        lock.unlock();
        assertTrue(done.await(10, TimeUnit.SECONDS));
        assertEquals(n, granted.get());
        assertNotEquals(null, client.session().id());
    }

    /**
     * Threads lock, try with short waits and are interrupted at random while the session connection is killed
     * now and then: never two holders, no thread left hanging, nothing held or queued at the end. For 3 s (about
     * ten session kills, one every 150 interrupts); with FLOCK_SOAK=1 for FLOCK_SOAK_SECS (default 30).
     */
    @Test
    void interruptsTimeoutsAndSessionKillsLeaveNothingBehind() throws Exception {
        FlockClient client = client();
        FlockLock lock = client.getFairLock("k");
        int n = 20;
        // A session kill ends the grant of the thread inside (it lived with the session): that thread is told
        // (sessionended) before any other thread is granted the lock, and its unlock then throws.
        java.util.Set<Long> inside = java.util.concurrent.ConcurrentHashMap.newKeySet();
        java.util.Set<Long> lost = java.util.concurrent.ConcurrentHashMap.newKeySet();
        client.setLeaseLostListener((name, thread, token, reason) -> lost.add(thread));
        AtomicInteger grants = new AtomicInteger();
        AtomicReference<Throwable> failed = new AtomicReference<>();
        long seconds = "1".equals(System.getenv("FLOCK_SOAK"))
                ? Long.parseLong(java.util.Objects.requireNonNullElse(System.getenv("FLOCK_SOAK_SECS"), "30")) : 3;
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            threads.add(spawn(() -> {
                java.util.Random random = new java.util.Random();
                while (System.nanoTime() < end) {
                    lost.remove(Thread.currentThread().getId()); // a report from now on is of this grant
                    try {
                        boolean got = random.nextBoolean() ? lock.tryLock(random.nextInt(30), -1, TimeUnit.MILLISECONDS)
                                : lockInterruptibly(lock);
                        if (got) {
                            long me = Thread.currentThread().getId();
                            for (long other : inside) {
                                if (!lost.contains(other)) {
                                    failed.compareAndSet(null, new AssertionError(
                                            "two threads hold the lock, neither told of a loss"));
                                }
                            }
                            inside.add(me);
                            grants.incrementAndGet();
                            inside.remove(me);
                            try {
                                lock.unlock();
                            } catch (IllegalMonitorStateException e) {
                                // told lost, or NOTOWNER: a kill ended the grant before the reader saw the close
                                if (!lost.contains(me) && !e.getMessage().contains("NOTOWNER")) {
                                    throw e;
                                }
                            }
                        }
                    } catch (InterruptedException e) {
                        // one of the interrupts below
                    } catch (Throwable e) {
                        failed.compareAndSet(null, e);
                    }
                }
            }));
        }
        java.util.Random random = new java.util.Random();
        for (int i = 0; System.nanoTime() < end; i++) {
            threads.get(random.nextInt(n)).interrupt();
            Thread.sleep(2);
            if (i % 150 == 149) {
                for (long id : sessionConnections()) {
                    admin.call("CLIENT", "KILL", "ID", Long.toString(id));
                }
            }
        }
        for (Thread t : threads) {
            t.join(20_000);
            assertFalse(t.isAlive(), () -> "a thread hangs: " + hung(t, "k"));
        }
        if (failed.get() != null) {
            throw new AssertionError(failed.get());
        }
        assertTrue(grants.get() > 0);
        assertTrue(client.session().opened() > 1, "the session was replaced");
        await("the lock is free", () -> info("k") == null);
        assertEquals(0, client.watchdogs());
        assertTrue(client.grants.isEmpty());
    }

    /** Where {@code thread} waits and what the server says of {@code key}: a hang's failure message. */
    private String hung(Thread thread, String key) {
        StringBuilder where = new StringBuilder(thread.getName() + ", owner <client id>:" + thread.getId());
        for (StackTraceElement frame : thread.getStackTrace()) {
            where.append("\n    at ").append(frame);
        }
        return where.append("\nFLOCK.INFO ").append(key).append(": ").append(shown(info(key))).toString();
    }

    /** A reply with its byte strings as text. */
    private static Object shown(Object reply) {
        if (reply instanceof byte[]) {
            return new String((byte[]) reply, StandardCharsets.UTF_8);
        }
        if (reply instanceof Map) {
            Map<Object, Object> fields = new java.util.LinkedHashMap<>();
            ((Map<?, ?>) reply).forEach((name, value) -> fields.put(name, shown(value)));
            return fields;
        }
        if (reply instanceof List) {
            return ((List<?>) reply).stream().map(SessionTest::shown).collect(java.util.stream.Collectors.toList());
        }
        return reply;
    }

    private static boolean lockInterruptibly(FlockLock lock) throws InterruptedException {
        lock.lockInterruptibly();
        return true;
    }

    /**
     * A lock taken without a lease time lives with the session: when the session ends (its connection killed)
     * the server ends the grant, the client reports it lost (sessionended) at once and never takes it again.
     */
    @Test
    void aGrantThatLivedWithABrokenSessionIsReportedLostAndNotTakenAgain() throws Exception {
        FlockClient client = client();
        CompletableFuture<String> reported = new CompletableFuture<>();
        client.setLeaseLostListener((name, thread, token, reason) -> reported.complete(reason));
        FlockLock lock = client.getFairLock("k");
        long token = lock.lockAndGetToken();
        assertEquals(1L, info("k").get("session"));
        await("the session connection is open", () -> sessionConnections().size() == 1);
        long killed = sessionConnections().get(0);
        assertEquals(1L, admin.call("CLIENT", "KILL", "ID", Long.toString(killed)));
        assertEquals("sessionended", reported.get(10, TimeUnit.SECONDS));
        assertTrue(lock.isLeaseLost());
        assertEquals(LossReason.SESSIONENDED, lock.getLeaseLostReason());
        assertEquals(token, lock.getToken());
        assertNull(info("k"), "the server ended it with its session");
        assertEquals(0, client.rewatched.get(), "not taken again");
        IllegalMonitorStateException e = assertThrows(IllegalMonitorStateException.class, lock::unlock);
        assertTrue(e.getMessage().contains("session"), e.getMessage());
        assertNull(info("k"));
        assertTrue(lock.tryLock(), "a new acquire takes it anew, on a new session");
        assertEquals(2, client.session().opened());
        lock.unlock();
    }

    /** A grant with a fixed lease is re-watched with the lease it has left, never more. */
    @Test
    void aFixedLeaseGrantHeldWhenTheSessionBreaksIsStillWatchedWithItsLeaseLeft() throws Exception {
        FlockClient client = client();
        CompletableFuture<String> reported = new CompletableFuture<>();
        client.setLeaseLostListener((name, thread, token, reason) -> reported.complete(reason));
        FlockLock lock = client.getFairLock("k");
        lock.lock(5, TimeUnit.SECONDS);
        await("the session connection is open", () -> sessionConnections().size() == 1);
        long killed = sessionConnections().get(0);
        assertEquals(1L, admin.call("CLIENT", "KILL", "ID", Long.toString(killed)));
        await("a new session watches the grant", () -> client.rewatched.get() == 1);
        assertEquals(1, holds("k"), "the re-watch's hold was given back");
        long ttl = (Long) info("k").get("ttl-ms");
        assertTrue(ttl <= 5_000, "the lease was not extended: " + ttl);
        assertEquals(1L, admin.call("FLOCK.FORCERELEASE", "k"));
        assertEquals("forcereleased", reported.get(10, TimeUnit.SECONDS));
        assertTrue(lock.isLeaseLost());
    }

    /** The documented behaviour for a server restart mid-wait: the wait retries until its own deadline. */
    @Test
    void aWaitOutlivesAServerRestartUntilItsDeadline() throws Exception {
        TestServer[] own = {TestServer.start()};
        try {
            int port = own[0].port;
            FlockClient holder = opened(new FlockClient(own[0].factory()));
            FlockClient client = opened(new FlockClient(own[0].factory()));
            holder.getFairLock("k").lock();
            CompletableFuture<Long> waiter = onThread(() -> client.getFairLock("k").tryLockAndGetToken(30, -1,
                    TimeUnit.SECONDS));
            FlockLock inspect = opened(new FlockClient(own[0].factory())).getFairLock("k");
            await("the waiter queues", () -> {
                java.util.Map<String, Object> info = inspect.info();
                return info != null && (Long) info.get("waiters") == 1;
            });
            own[0].close();
            Thread.sleep(300); // the server is down for a while: the wait retries meanwhile
            own[0] = TestServer.start(port);
            Long token = waiter.get(20, TimeUnit.SECONDS);
            assertNotNull(token, "granted by the restarted server");
            assertEquals(2, client.session().opened());
        } finally {
            own[0].close();
        }
    }

    /** A factory that refuses to connect while {@code down} (a server that cannot be reached). */
    static final class GatedFactory implements ConnectionFactory {
        private final ConnectionFactory inner;
        volatile boolean down;

        GatedFactory(ConnectionFactory inner) {
            this.inner = inner;
        }

        @Override
        public FlockConnection connect() throws IOException {
            if (down) {
                throw new java.net.ConnectException("the test's server is unreachable");
            }
            return inner.connect();
        }
    }

    /** A grant force-released while the session was down is found lost by the re-watch's RENEW. */
    @Test
    void aGrantForceReleasedWhileTheSessionWasDownIsReportedLostAfterTheReconnect() throws Exception {
        GatedFactory gate = new GatedFactory(server.factory());
        FlockClient client = opened(new FlockClient(gate, 60_000));
        CompletableFuture<String> reported = new CompletableFuture<>();
        client.setLeaseLostListener((name, thread, token, reason) -> reported.complete(name + " " + reason));
        FlockLock lock = client.getFairLock("k");
        lock.lock(60, TimeUnit.SECONDS); // a lease of its own: it outlives the session
        await("the session connection is open", () -> sessionConnections().size() == 1);
        gate.down = true;
        assertEquals(1L, admin.call("CLIENT", "KILL", "ID", Long.toString(sessionConnections().get(0))));
        await("the session is gone", () -> sessionConnections().isEmpty());
        assertEquals(1L, admin.call("FLOCK.FORCERELEASE", "k"));
        Thread.sleep(300); // nothing can tell the client meanwhile
        assertFalse(lock.isLeaseLost());
        assertFalse(reported.isDone());
        gate.down = false;
        assertEquals("k notowner", reported.get(10, TimeUnit.SECONDS));
        assertTrue(lock.isLeaseLost());
        assertEquals(0, client.rewatched.get());
        assertEquals(2, client.session().opened());
        IllegalMonitorStateException e = assertThrows(IllegalMonitorStateException.class, lock::unlock);
        assertTrue(e.getMessage().contains("not locked by current thread"), e.getMessage());
        assertTrue(e.getMessage().contains("the server ended the grant"), e.getMessage());
        assertNull(info("k"));
    }

    /** The re-watch's extra hold is given back: a reentered fixed-lease grant keeps its two holds. */
    @Test
    void aReenteredFixedLeaseGrantKeepsItsHoldCountAcrossTheReWatch() throws Exception {
        FlockClient client = client();
        CompletableFuture<String> reported = new CompletableFuture<>();
        client.setLeaseLostListener((name, thread, token, reason) -> reported.complete(reason));
        FlockLock lock = client.getFairLock("k");
        long token = lock.lockAndGetToken(20, TimeUnit.SECONDS);
        assertEquals(token, lock.lockAndGetToken(20, TimeUnit.SECONDS));
        assertEquals(2, holds("k"));
        await("the session connection is open", () -> sessionConnections().size() == 1);
        assertEquals(1L, admin.call("CLIENT", "KILL", "ID", Long.toString(sessionConnections().get(0))));
        await("a new session watches the grant", () -> client.rewatched.get() == 1);
        assertEquals(2, holds("k"), "the hold count is unchanged");
        assertEquals(0, client.watchdogs());
        assertTrue((Long) info("k").get("ttl-ms") <= 20_000);
        lock.unlock();
        assertEquals(1, holds("k"));
        // Still watched by the new session, without a watchdog: a force-release is pushed at once.
        long before = System.nanoTime();
        assertEquals(1L, admin.call("FLOCK.FORCERELEASE", "k"));
        assertEquals("forcereleased", reported.get(10, TimeUnit.SECONDS));
        assertTrue(System.nanoTime() - before < TimeUnit.SECONDS.toNanos(2), "pushed, not found later");
        assertTrue(lock.isLeaseLost());
    }

    /** The server is down before the wait's first ACQUIRE: tryLock runs out, lock() retries until it is back. */
    @Test
    void aWaitWhoseServerIsDownFromTheStartEndsAsATimeout() throws Exception {
        TestServer[] own = {TestServer.start()};
        try {
            int port = own[0].port;
            FlockClient client = opened(new FlockClient(own[0].factory()));
            FlockLock lock = client.getFairLock("k");
            lock.lock(); // the session is open, then its server goes away
            lock.unlock();
            own[0].close();
            long start = System.nanoTime();
            assertFalse(onThread(() -> lock.tryLock(600, -1, TimeUnit.MILLISECONDS)).get(10, TimeUnit.SECONDS));
            long tookMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
            assertTrue(tookMs >= 550 && tookMs < 3_000, "ran out after " + tookMs + " ms");
            // A client that never reached its server: the same.
            FlockLock fresh = opened(new FlockClient(RespConnection.factory("127.0.0.1", port))).getFairLock("k");
            assertNull(onThread(() -> fresh.tryLockAndGetToken(300, -1, TimeUnit.MILLISECONDS))
                    .get(10, TimeUnit.SECONDS));
            // lockInterruptibly() retries until interrupted.
            AtomicReference<Thread> waiter = new AtomicReference<>();
            CompletableFuture<Void> interruptible = onThread(() -> {
                waiter.set(Thread.currentThread());
                lock.lockInterruptibly();
                return null;
            });
            Thread.sleep(400);
            assertFalse(interruptible.isDone(), String.valueOf(interruptible));
            waiter.get().interrupt();
            assertTrue(failure(interruptible) instanceof InterruptedException);
            // lock() retries without limit: granted once the server is back.
            CompletableFuture<Long> locked = onThread(() -> lock.lockAndGetToken());
            Thread.sleep(400);
            assertFalse(locked.isDone(), String.valueOf(locked));
            own[0] = TestServer.start(port);
            assertNotNull(locked.get(20, TimeUnit.SECONDS), "granted by the restarted server");
        } finally {
            own[0].close();
        }
    }

    /**
     * The I/O failure comes before the first WAITING reply on a reachable server (every ACQUIRE's reply is
     * lost): the wait retries and runs out as a timeout, and nothing of it stays queued.
     */
    @Test
    void aWaitWhoseAcquireRepliesAreLostEndsAsATimeout() throws Exception {
        try (DroppingProxy proxy = new DroppingProxy(server.port)) {
            FlockLock held = client().getFairLock("k");
            held.lock();
            FlockClient client = opened(new FlockClient(RespConnection.factory("127.0.0.1", proxy.port())));
            FlockLock lock = client.getFairLock("k");
            proxy.dropRepliesTo("FLOCK.ACQUIRE", Integer.MAX_VALUE);
            long start = System.nanoTime();
            assertFalse(onThread(() -> lock.tryLock(800, -1, TimeUnit.MILLISECONDS)).get(10, TimeUnit.SECONDS));
            long tookMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
            assertTrue(tookMs >= 750 && tookMs < 4_000, "ran out after " + tookMs + " ms");
            assertTrue(proxy.dropped.get() > FlockClient.RESENDS + 1, "lost replies: " + proxy.dropped.get());
            await("the server's wait ran out too", () -> waiters("k") == 0);
            proxy.dropRepliesTo("FLOCK.ACQUIRE", 0);
            held.unlock();
            await("nothing of the wait holds the lock", () -> info("k") == null);
        }
    }

    /**
     * A wait whose every ACQUIRE reply is lost is queued on the server all the same; it ends (out of time, then
     * interrupted) only with its own event, which the session connection here brings a second late. Were it
     * to end at once, the thread's next wait would take that event for its own and end early, and its own
     * grant would then come with nobody waiting for it (the lock held until its lease ran out), or the server
     * would still hold the old wait and answer the next one QUEUED.
     */
    @Test
    void theLateEventOfAWaitWhoseRepliesWereLostIsNotTakenByTheNextWait() throws Exception {
        try (DroppingProxy proxy = new DroppingProxy(server.port)) {
            FlockLock held = client().getFairLock("k");
            FlockClient client = opened(new FlockClient(RespConnection.factory("127.0.0.1", proxy.port())));
            FlockLock lock = client.getFairLock("k");
            assertTrue(lock.tryLock()); // opens the session
            lock.unlock();
            proxy.delaySessionReplies(1_000);
            for (boolean interrupted : new boolean[] {false, true}) {
                held.lock();
                int dropped = proxy.dropped.get();
                proxy.dropRepliesTo("FLOCK.ACQUIRE", Integer.MAX_VALUE);
                AtomicReference<Thread> waiter = new AtomicReference<>();
                CompletableFuture<Boolean> first = new CompletableFuture<>();
                CompletableFuture<Void> next = new CompletableFuture<>();
                CompletableFuture<Boolean> second = onThread(() -> {
                    waiter.set(Thread.currentThread());
                    try {
                        first.complete(interrupted ? lockInterruptibly(lock)
                                : lock.tryLock(300, -1, TimeUnit.MILLISECONDS));
                    } catch (InterruptedException e) {
                        first.complete(false);
                    }
                    next.get();
                    boolean granted = lock.tryLock(10, -1, TimeUnit.SECONDS);
                    if (granted) {
                        lock.unlock();
                    }
                    return granted;
                });
                if (interrupted) {
                    await("the wait is queued, its replies lost",
                            () -> waiters("k") == 1 && proxy.dropped.get() > dropped);
                    waiter.get().interrupt();
                }
                assertFalse(first.get(10, TimeUnit.SECONDS));
                await("the first wait left the queue", () -> waiters("k") == 0);
                proxy.dropRepliesTo("FLOCK.ACQUIRE", 0);
                next.complete(null);
                await("the next wait queues", () -> waiters("k") == 1);
                held.unlock();
                assertTrue(second.get(10, TimeUnit.SECONDS), "the next wait got its own grant");
                await("nothing holds the lock", () -> info("k") == null);
            }
        }
    }

    /**
     * A wait whose every ACQUIRE is lost before the server reads it: nothing will come for it, which a read of
     * the session after its CANCEL shows, so it ends soon after its deadline; not after the grace, when its
     * session, which said nothing of it, would be given up.
     */
    @Test
    void aWaitWhoseAcquiresNeverReachedTheServerEndsSoonAfterItsDeadline() throws Exception {
        try (DroppingProxy proxy = new DroppingProxy(server.port)) {
            client().getFairLock("k").lock();
            FlockClient client = opened(new FlockClient(RespConnection.factory("127.0.0.1", proxy.port())));
            FlockLock lock = client.getFairLock("k");
            assertFalse(lock.tryLock()); // opens the session
            proxy.dropCommands("FLOCK.ACQUIRE", Integer.MAX_VALUE);
            long start = System.nanoTime();
            assertFalse(onThread(() -> lock.tryLock(300, -1, TimeUnit.MILLISECONDS)).get(20, TimeUnit.SECONDS));
            long tookMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
            assertTrue(tookMs >= 250 && tookMs < 4_000, "ended after " + tookMs + " ms");
            assertTrue(proxy.dropped.get() > FlockClient.RESENDS + 1, "lost commands: " + proxy.dropped.get());
            assertEquals(1, client.session().opened(), "its session was kept");
            assertEquals(0, waiters("k"), "nothing of it was queued");
        }
    }

    /**
     * The session connection is killed while a grant is on its way there to a thread that is being interrupted,
     * and another thread's ACQUIRE, naming the session, hears NOSESSION first: that thread opens no new session
     * until the old one's reader has handed out what it read, and the grant still reaches the interrupted
     * thread, which gives it back, instead of being lost with the connection that thread closed.
     */
    @Test
    void aGrantOnItsWayWhenTheSessionEndsStillReachesItsWait() throws Exception {
        try (DroppingProxy proxy = new DroppingProxy(server.port)) {
            admin.call("FLOCK.ACQUIRE", "k", "other", "30000");
            FlockClient client = opened(new FlockClient(RespConnection.factory("127.0.0.1", proxy.port())));
            FlockLock lock = client.getFairLock("k");
            AtomicReference<Thread> waiter = new AtomicReference<>();
            CompletableFuture<Boolean> interrupted = onThread(() -> {
                waiter.set(Thread.currentThread());
                // a lease of its own: the grant outlives the session (one that lives with it would end with it)
                lock.lockInterruptibly(30, TimeUnit.SECONDS);
                return true;
            });
            await("the waiter queues", () -> waiters("k") == 1);
            proxy.holdSessionReplies();
            admin.call("FLOCK.RELEASE", "k", "other");
            await("the waiter is granted", () -> waiters("k") == 0);
            waiter.get().interrupt();
            List<Long> sessions = sessionConnections();
            assertEquals(1, sessions.size());
            admin.call("CLIENT", "KILL", "ID", Long.toString(sessions.get(0)));
            AtomicReference<Thread> trying = new AtomicReference<>();
            CompletableFuture<Boolean> tried = onThread(() -> {
                trying.set(Thread.currentThread());
                boolean granted = lock.tryLock();
                if (granted) {
                    lock.unlock();
                }
                return granted;
            });
            await("the try waits for the old session's reader", () -> trying.get() != null
                    && trying.get().getState() == Thread.State.TIMED_WAITING && !tried.isDone());
            proxy.passSessionReplies();
            assertTrue(failure(interrupted) instanceof InterruptedException);
            tried.get(10, TimeUnit.SECONDS); // granted or not, as the give-back and the try raced
            await("the grant was given back", () -> info("k") == null);
        }
    }

    /** Queued, then the server goes away for good: the wait ends as a timeout at its deadline. */
    @Test
    void aQueuedWaitWhoseServerStaysDownEndsAsATimeout() throws Exception {
        TestServer own = TestServer.start();
        long start;
        CompletableFuture<Boolean> waiter;
        try {
            FlockClient holder = opened(new FlockClient(own.factory()));
            FlockClient client = opened(new FlockClient(own.factory()));
            holder.getFairLock("k").lock();
            start = System.nanoTime();
            waiter = onThread(() -> client.getFairLock("k").tryLock(1_500, -1, TimeUnit.MILLISECONDS));
            FlockLock inspect = opened(new FlockClient(own.factory())).getFairLock("k");
            await("the waiter queues", () -> {
                java.util.Map<String, Object> info = inspect.info();
                return info != null && (Long) info.get("waiters") == 1;
            });
        } finally {
            own.close(); // for good
        }
        assertFalse(waiter.get(10, TimeUnit.SECONDS));
        long tookMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
        assertTrue(tookMs >= 1_400 && tookMs < 4_000, "ran out after " + tookMs + " ms");
    }

    /**
     * A demotion: the waits end with an error, not a hang. Redis 7.0 closes the blocked FLOCK.INBOX connection
     * itself (its disconnectAllBlockedClients), so the session's events are lost with it: the waiter, resent to
     * a new session, gets the replica's READONLY, or UNBLOCKED where the server keeps the session.
     */
    @Test
    void aDemotionEndsTheWaitsWithAnError() throws Exception {
        try (TestServer own = TestServer.start(); RespConnection ownAdmin = own.connect()) {
            FlockClient client = opened(new FlockClient(own.factory()));
            FlockLock lock = client.getFairLock("k");
            lock.lock();
            CompletableFuture<Void> waiter = onThread(() -> {
                lock.lock();
                return null;
            });
            FlockLock inspect = opened(new FlockClient(own.factory())).getFairLock("k");
            await("the waiter queues", () -> (Long) inspect.info().get("waiters") == 1);
            ownAdmin.call("REPLICAOF", "127.0.0.1", "1"); // a master that is never reached
            try {
                Throwable ended = failure(waiter);
                String code = RedisError.codeOf(ended);
                assertTrue(code.equals("UNBLOCKED") || code.equals("READONLY"), String.valueOf(ended));
            } finally {
                ownAdmin.call("REPLICAOF", "NO", "ONE");
            }
        }
    }

    @Test
    void reentryThroughTheSessionAddsAHoldWhileOthersWait() throws Exception {
        FlockLock lock = client().getFairLock("k");
        long token = lock.lockAndGetToken();
        Holder waiter = new Holder(lock);
        await("the waiter queues", () -> waiters("k") == 1);
        assertEquals(token, lock.lockAndGetToken());
        assertEquals(2, holds("k"));
        lock.unlock();
        assertFalse(waiter.isGranted());
        lock.unlock();
        assertTrue(waiter.token() > token);
        waiter.unlock();
    }

    @Test
    void wrongModeAndUpgradeThroughTheSession() throws Exception {
        FlockClient client = client();
        client.getSemaphore("s", 2).acquire();
        assertThrows(WrongModeException.class, () -> client.getFairLock("s").tryLock(1, TimeUnit.SECONDS));
        assertThrows(WrongModeException.class, () -> client.getSemaphore("s", 3).tryAcquire(1, TimeUnit.SECONDS));
        FlockReadWriteLock rw = client.getReadWriteLock("k");
        rw.readLock().lock();
        assertThrows(UpgradeException.class, () -> rw.writeLock().tryLock(1, TimeUnit.SECONDS));
        assertThrows(UpgradeException.class, rw.writeLock()::lock);
        rw.readLock().unlock();
        client.getSemaphore("s", 2).release();
    }

    @Test
    void aSemaphoreGrantsNoMoreThanItsLimitThroughTheSession() throws Exception {
        FlockClient client = client();
        FlockSemaphore slots = client.getSemaphore("s", 3);
        AtomicInteger inside = new AtomicInteger();
        AtomicInteger most = new AtomicInteger();
        CountDownLatch release = new CountDownLatch(1);
        List<Thread> workers = new ArrayList<>();
        for (int i = 0; i < 8; i++) {
            workers.add(spawn(() -> {
                try {
                    slots.acquire();
                    most.accumulateAndGet(inside.incrementAndGet(), Math::max);
                    release.await();
                    inside.decrementAndGet();
                    slots.release();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }));
        }
        await("3 hold and 5 wait", () -> holderCount("s") == 3 && waiters("s") == 5);
        assertEquals(0, slots.availablePermits());
        await("the 3 holders' threads are inside", () -> inside.get() == 3); // granted before they count
        release.countDown();
        joinAll(workers);
        assertEquals(3, most.get());
        await("all permits are back", () -> info("s") == null);
    }

    @Test
    void closeEndsTheSessionConnectionAndItsReader() throws Exception {
        FlockClient client = client();
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        lock.unlock();
        assertEquals(1, sessionConnections().size());
        Thread reader = client.session().reader();
        assertTrue(reader.isDaemon() && reader.isAlive());
        client.close();
        await("the session connection closes", () -> sessionConnections().isEmpty());
        await("the reader thread ends", () -> !reader.isAlive());
    }

    @Test
    void closeEndsAWaitingThread() throws Exception {
        FlockClient client = client();
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        CompletableFuture<Void> waiting = onThread(() -> {
            client.getFairLock("k").lock();
            return null;
        });
        await("the waiter queues", () -> waiters("k") == 1);
        client.close();
        assertTrue(failure(waiting) instanceof IllegalStateException);
    }

    @Test
    void theSessionReaderIsADaemonThread() throws Exception {
        FlockLock lock = client().getFairLock("k");
        lock.lock();
        lock.unlock();
        assertTrue(Thread.getAllStackTraces().keySet().stream()
                .filter(t -> t.getName().equals("flock-session-reader"))
                .allMatch(Thread::isDaemon));
    }

    @Test
    void blockingWaitsStayAnOption() throws Exception {
        FlockClient client = opened(new FlockClient(server.factory(), FlockClient.DEFAULT_WATCHDOG_TIMEOUT_MS, false));
        assertFalse(client.usesSessions());
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        Holder waiter = new Holder(lock);
        await("the waiter queues", () -> waiters("k") == 1);
        assertTrue(sessionConnections().isEmpty());
        lock.unlock();
        waiter.token();
        waiter.unlock();
        assertNull(info("k"));
    }

    /** Without a session nothing is pushed: the NOTOWNER text of the unlock says why. */
    @Test
    void anUnlockAfterTheLeaseRanOutSaysSoWithoutSessions() {
        FlockClient client = opened(new FlockClient(server.factory(), FlockClient.DEFAULT_WATCHDOG_TIMEOUT_MS, false));
        FlockLock lock = client.getFairLock("k");
        lock.lock(100, TimeUnit.MILLISECONDS);
        await("the lease ends", () -> info("k") == null);
        IllegalMonitorStateException e = assertThrows(IllegalMonitorStateException.class, lock::unlock);
        assertTrue(e.getMessage().contains("not locked by current thread"), e.getMessage());
        assertTrue(e.getMessage().contains("lease"), e.getMessage());
    }
}
