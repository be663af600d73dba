package io.flock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.TestInfo;

/**
 * One server per test class, flushed before each test; clients and threads made by a test end with it. Test
 * classes run side by side, so each has a server of its own, kept by class.
 */
abstract class ServerTest {
    /**
     * The watchdog timeout of the tests that watch renewals, short so that a few renewals (one every third of
     * it) come soon: a renewal may then come 800 ms late before the lease runs out. With 600 ms (400 ms of
     * slack) a busy machine lost a lease.
     */
    static final long WATCHDOG_MS = 1_200;
    private static final Map<Class<?>, TestServer> SERVERS = new ConcurrentHashMap<>();
    /** This class's server, started before its first test. */
    final TestServer server;
    private final List<AutoCloseable> opened = new ArrayList<>();
    private final List<Thread> threads = new ArrayList<>();
    RespConnection admin;
    private FlockClient inspector;

    /** Starts the class's server with its first test's instance (a class's tests run one after another). */
    ServerTest() {
        TestServer started = SERVERS.get(getClass());
        if (started == null) {
            try {
                started = startServer();
            } catch (IOException e) {
                throw new java.io.UncheckedIOException(e);
            }
            SERVERS.put(getClass(), started);
        }
        server = started;
    }

    /** Starts this class's server: a plain one; a class that needs another (TLS, a password) overrides it. */
    TestServer startServer() throws IOException {
        return TestServer.start();
    }

    @AfterAll
    static void stopServer(TestInfo testClass) throws IOException {
        TestServer started = SERVERS.remove(testClass.getTestClass().orElseThrow());
        if (started != null) {
            started.close();
        }
    }

    @BeforeEach
    void flush() throws IOException {
        admin = opened(server.connect());
        admin.call("FLUSHALL");
        inspector = client();
    }

    @AfterEach
    void closeAll() throws Exception {
        for (Thread t : threads) {
            t.interrupt();
            t.join(5_000);
        }
        for (AutoCloseable c : opened) {
            c.close();
        }
    }

    <T extends AutoCloseable> T opened(T closeable) {
        opened.add(closeable);
        return closeable;
    }

    FlockClient client() {
        return opened(new FlockClient(server.factory()));
    }

    FlockClient client(long watchdogTimeoutMs) {
        return opened(new FlockClient(server.factory(), watchdogTimeoutMs));
    }

    /** A client whose sessions time out after {@code ms} (a heartbeat every third of it). */
    FlockClient sessionClient(long ms) {
        return opened(new FlockClient(server.factory(),
                new FlockConfig().setSessionTimeout(java.time.Duration.ofMillis(ms))));
    }

    /** A client without sessions: blocking waits, every lock kept by the watchdog, of lease {@code watchdogMs}. */
    FlockClient watchdogClient(long watchdogMs) {
        return opened(new FlockClient(server.factory(), watchdogMs, false));
    }

    /** A started thread, interrupted and joined after the test. */
    Thread spawn(Runnable body) {
        Thread t = new Thread(body);
        threads.add(t);
        t.start();
        return t;
    }

    /** A client as {@code config} says, closed after the test. */
    FlockClient client(FlockConfig config) {
        return opened(FlockClient.create(config));
    }

    /**
     * What every connection option must keep working, on every connection a client opens: a lock that lives with
     * the holder's session (its heartbeats seen on the server), a multi-lock kept by the watchdog (renewals seen
     * there too), another client waiting for the lock through its session, and the release handing it over.
     * {@code config} reaches this class's server.
     */
    void lockWaitReleaseAndRenew(FlockConfig config) throws Exception {
        FlockClient holder = client(config.setLockWatchdogTimeout(WATCHDOG_MS)
                .setSessionTimeout(java.time.Duration.ofMillis(WATCHDOG_MS)));
        FlockLock held = holder.getFairLock("k");
        FlockMultiLock renewed = holder.getMultiLock("m");
        FlockClient waiter = client(config);
        held.lock();
        renewed.lock();
        awaitRenewals("k", 2);
        awaitRenewals("m", 2);
        renewed.unlock();
        CompletableFuture<Boolean> waited = onThread(() -> waiter.getFairLock("k").tryLock(10_000, 10_000,
                TimeUnit.MILLISECONDS));
        TestServer.await("the other client waits", () -> waiters("k") == 1);
        held.unlock();
        assertTrue(waited.get(10, TimeUnit.SECONDS), "the waiter got the lock");
        assertTrue(waiter.usesSessions());
        assertEquals(1, waiter.session().opened(), "it waited through its session");
    }

    /** Starts {@code n} threads, thread i running {@code body.apply(i)} once the i before it queue for {@code key}. */
    List<Thread> queueInTurn(String key, int n, java.util.function.IntFunction<Runnable> body) {
        List<Thread> started = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            int queued = i + 1;
            started.add(spawn(body.apply(i)));
            TestServer.await(queued + " waiters queue", () -> waiters(key) == queued);
        }
        return started;
    }

    /** Runs {@code body} on a new thread; the future ends with its result or exception. */
    <T> CompletableFuture<T> onThread(java.util.concurrent.Callable<T> body) {
        CompletableFuture<T> result = new CompletableFuture<>();
        spawn(() -> {
            try {
                result.complete(body.call());
            } catch (Throwable e) {
                result.completeExceptionally(e);
            }
        });
        return result;
    }

    /** Runs {@code body} on a new thread and waits for it, rethrowing what it threw. */
    void onOtherThread(ThrowingRunnable body) throws Exception {
        CompletableFuture<Void> done = onThread(() -> {
            body.run();
            return null;
        });
        try {
            done.get(20, TimeUnit.SECONDS);
        } catch (ExecutionException e) {
            if (e.getCause() instanceof Exception) {
                throw (Exception) e.getCause();
            }
            throw e;
        }
    }

    interface ThrowingRunnable {
        void run() throws Exception;
    }

    interface ClientTask {
        void run(FlockClient client) throws Exception;
    }

    /**
     * Upstream's testSingleInstanceConcurrency/testMultiInstanceConcurrency: {@code tasks} threads at once, task
     * i running {@code body} with {@code clientFor.apply(i)}; waits for all, rethrowing the first failure.
     */
    void concurrently(int tasks, java.util.function.IntFunction<FlockClient> clientFor,
            ClientTask body) throws Exception {
        List<CompletableFuture<Void>> running = new ArrayList<>();
        for (int i = 0; i < tasks; i++) {
            FlockClient client = clientFor.apply(i);
            running.add(onThread(() -> {
                body.run(client);
                return null;
            }));
        }
        for (CompletableFuture<Void> task : running) {
            task.get(60, TimeUnit.SECONDS);
        }
    }

    static Throwable failure(CompletableFuture<?> f) throws InterruptedException {
        try {
            f.get(10, TimeUnit.SECONDS);
            return null;
        } catch (ExecutionException e) {
            return e.getCause();
        } catch (java.util.concurrent.TimeoutException e) {
            throw new AssertionError("the thread did not finish", e);
        }
    }

    /** A thread that takes {@code lock} (interruptibly, so a failed test ends it) and unlocks it when told. */
    final class Holder {
        private final CompletableFuture<Long> granted = new CompletableFuture<>();
        private final CompletableFuture<Void> release = new CompletableFuture<>();
        private final CompletableFuture<Void> done;

        Holder(FlockLock lock) {
            done = onThread(() -> {
                try {
                    lock.lockInterruptibly();
                    granted.complete(lock.getToken());
                } catch (Throwable e) {
                    granted.completeExceptionally(e);
                    throw e;
                }
                release.get();
                lock.unlock();
                return null;
            });
        }

        boolean isGranted() {
            return granted.isDone();
        }

        long token() throws Exception {
            return granted.get(10, TimeUnit.SECONDS);
        }

        void unlock() throws Exception {
            release.complete(null);
            done.get(10, TimeUnit.SECONDS);
        }
    }

    /**
     * {@code take} (on the test thread) takes {@code key} through {@code client}: with sessions, the grant lives
     * with the session, whose heartbeats move its lease on for longer than its timeout, and no watchdog runs;
     * without, the watchdog renews it. Not lost meanwhile; {@code release} frees the key and stops the watchdog.
     */
    void keptAlive(FlockClient client, String key, FlockLock view, ThrowingRunnable take, ThrowingRunnable release)
            throws Exception {
        take.run();
        awaitRenewals(key, 3);
        assertFalse(view.isLeaseLost());
        assertEquals(client.usesSessions() ? 0 : 1, client.watchdogs(), "a watchdog only without a session");
        release.run();
        assertEquals(0, client.watchdogs());
        assertNull(info(key));
    }

    /**
     * Waits until the lease left of {@code key}'s first holder has risen {@code n} times: only a renewal raises it
     * (a watchdog's; for a grant that lives with its session, a heartbeat of the session).
     */
    void awaitRenewals(String key, int n) {
        long[] last = {(Long) info(key).get("ttl-ms")};
        for (int renewals = 0; renewals < n; renewals++) {
            TestServer.await("the watchdog renews", () -> {
                long ttl = (Long) info(key).get("ttl-ms");
                boolean rose = ttl > last[0];
                last[0] = ttl;
                return rose;
            });
        }
    }

    static void joinAll(List<Thread> threads) throws InterruptedException {
        for (Thread t : threads) {
            t.join(20_000);
        }
    }

    /** The server's connections now (the test's own among them). */
    long connectedClients() {
        String info;
        try {
            info = new String((byte[]) admin.call("INFO", "clients"), StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
        for (String line : info.split("\r\n")) {
            if (line.startsWith("connected_clients:")) {
                return Long.parseLong(line.substring("connected_clients:".length()).trim());
            }
        }
        throw new AssertionError("no connected_clients in INFO clients");
    }

    /** FLOCK.INFO of {@code key}, asked on a client of the test's own, or null when nobody holds it. */
    Map<String, Object> info(String key) {
        return inspector.getLock(key).info();
    }

    String owner(String key) {
        Map<String, Object> info = info(key);
        return info == null ? null : new String((byte[]) info.get("owner"), StandardCharsets.UTF_8);
    }

    long waiters(String key) {
        Map<String, Object> info = info(key);
        return info == null ? 0 : (Long) info.get("waiters");
    }

    String mode(String key) {
        Map<String, Object> info = info(key);
        return info == null ? null : new String((byte[]) info.get("mode"), StandardCharsets.UTF_8);
    }

    int holderCount(String key) {
        Map<String, Object> info = info(key);
        return info == null ? 0 : ((List<?>) info.get("holders")).size();
    }

    long holds(String key) {
        Map<String, Object> info = info(key);
        return info == null ? 0 : (Long) info.get("holds");
    }
}
