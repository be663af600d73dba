package io.flock;

import static io.flock.TestServer.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;

/**
 * A process cut off from its server (a proxy that stops carrying bytes both ways, no FIN, no RST) or paused
 * (SIGSTOP), with short session timeouts and leases: a holder knows it lost its lock before anyone else is
 * granted it, a waiter holds nobody up past its timeout, a short silence loses nothing. Only safety orderings
 * are asserted, never how long anything took.
 */
@Order(1) // among the longest classes: started first
class PartitionTest extends ServerTest {
    /** The session timeout T of the processes cut off. */
    static final long T_MS = 1000;

    /** A process behind {@code proxy}: its sessions time out after {@code sessionMs}; losses noted with their time. */
    final class Process {
        final DroppingProxy proxy;
        final FlockClient client;
        final Map<String, Long> lostAt = new ConcurrentHashMap<>();
        final Map<String, String> reasons = new ConcurrentHashMap<>();

        Process(long sessionMs, boolean sessions, long watchdogMs) throws IOException {
            proxy = opened(new DroppingProxy(server.port));
            ConnectionFactory factory = RespConnection.factory("127.0.0.1", proxy.port());
            client = opened(sessions
                    ? new FlockClient(factory, new FlockConfig().setSessionTimeout(Duration.ofMillis(sessionMs))
                            .setLockWatchdogTimeout(watchdogMs))
                    : new FlockClient(factory, watchdogMs, false));
            client.setLeaseLostListener((name, thread, token, reason) -> {
                lostAt.put(name, System.nanoTime());
                reasons.put(name, reason);
            });
        }

        Process(long sessionMs) throws IOException {
            this(sessionMs, true, FlockClient.DEFAULT_WATCHDOG_TIMEOUT_MS);
        }
    }

    /** {@code waiter} waits for {@code key} on a thread; the future is when it was granted (nanoTime). */
    CompletableFuture<Long> grantedAt(FlockLock waiter, long waitMs) {
        return onThread(() -> {
            assertTrue(waiter.tryLock(waitMs, -1, TimeUnit.MILLISECONDS), "granted");
            long at = System.nanoTime();
            waiter.unlock();
            return at;
        });
    }

    /** The holder of {@code process} takes {@code key} as {@code take} says at its turn, and is cut off. */
    void cutOffHolderKnowsFirst(Process holder, ThrowingRunnable take, String expectedReason) throws Exception {
        // The holder's turn comes with the next waiter queued behind it already: however late a loaded machine
        // runs the threads, nobody else can be granted the lock before the holder's lease ends.
        admin.call("FLOCK.ACQUIRE", "k", "first", "60000");
        CompletableFuture<Void> taken = onThread(() -> {
            take.run();
            return null;
        });
        await("the holder queues", () -> waiters("k") == 1);
        CompletableFuture<Long> waiter = grantedAt(client().getFairLock("k"), 20_000);
        await("the waiter queues", () -> waiters("k") == 2);
        admin.call("FLOCK.RELEASE", "k", "first");
        taken.get(20, TimeUnit.SECONDS);
        holder.proxy.partition();
        long granted = waiter.get(20, TimeUnit.SECONDS);
        Long lost = holder.lostAt.get("k");
        assertNotNull(lost, "the cut-off holder reported no loss by the time the waiter was granted");
        assertTrue(lost - granted < 0, "the holder learnt of its loss "
                + TimeUnit.NANOSECONDS.toMicros(lost - granted) + " us after the waiter was granted");
        assertEquals(expectedReason, holder.reasons.get("k"));
        holder.proxy.heal();
    }

    @Test
    void aCutOffHolderOfASessionGrantReportsItLostBeforeTheNextWaiterIsGranted() throws Exception {
        Process holder = new Process(T_MS);
        cutOffHolderKnowsFirst(holder, () -> holder.client.getFairLock("k").lock(), "unconfirmed");
    }

    @Test
    void aCutOffHolderOfAFixedLeaseReportsItLostBeforeTheNextWaiterIsGranted() throws Exception {
        Process holder = new Process(10_000); // its session outlives the lease: the lease's deadline tells
        cutOffHolderKnowsFirst(holder, () -> holder.client.getFairLock("k").lock(500, TimeUnit.MILLISECONDS),
                "expired");
    }

    @Test
    void aCutOffHolderOfAWatchdogGrantReportsItLostBeforeTheNextWaiterIsGranted() throws Exception {
        // No session: the watchdog's lease, renewed every third of it (WATCHDOG_MS: a loaded machine's late
        // renewal would otherwise lose it before the partition).
        Process holder = new Process(0, false, WATCHDOG_MS);
        cutOffHolderKnowsFirst(holder, () -> holder.client.getFairLock("k").lock(), "unconfirmed");
    }

    @Test
    void aCutOffHolderOfAMultiLockReportsItLostBeforeTheNextWaiterIsGranted() throws Exception {
        Process holder = new Process(T_MS, true, WATCHDOG_MS); // a multi-lock's grants: the watchdog's
        cutOffHolderKnowsFirst(holder, () -> holder.client.getMultiLock("k").lock(), "unconfirmed");
    }

    /**
     * A waiter's process is cut off just as its turn comes: its grant, undelivered, passes on when its session
     * expires, so the next waiter is granted; once the partition heals, the cut-off waiter's wait is sent again
     * on a new session with its request ID and is granted in its turn.
     */
    @Test
    void aWaitingProcessCutOffAtItsTurnHoldsNobodyUpAndItsWaitIsSentAgain() throws Exception {
        FlockLock holder = client().getFairLock("k");
        holder.lock();
        Process cut = new Process(T_MS);
        CompletableFuture<Boolean> cutWait = onThread(() -> {
            boolean granted = cut.client.getFairLock("k").tryLock(30_000, -1, TimeUnit.MILLISECONDS);
            if (granted) {
                cut.client.getFairLock("k").unlock();
            }
            return granted;
        });
        await("the cut-off process waits", () -> waiters("k") == 1);
        FlockClient nextClient = client();
        FlockLock next = nextClient.getFairLock("k");
        CompletableFuture<Void> nextHolds = new CompletableFuture<>();
        CompletableFuture<Void> nextReleases = new CompletableFuture<>();
        CompletableFuture<Boolean> nextWait = onThread(() -> {
            boolean granted = next.tryLock(20_000, -1, TimeUnit.MILLISECONDS);
            nextHolds.complete(null);
            nextReleases.get(20, TimeUnit.SECONDS);
            next.unlock();
            return granted;
        });
        await("the next waits", () -> waiters("k") == 2);
        cut.proxy.partition();
        holder.unlock();
        nextHolds.get(20, TimeUnit.SECONDS);
        assertEquals(nextClient.getId(), ownerProcess(), "the next waiter holds the lock");
        cut.proxy.heal();
        await("the cut-off process's wait is sent again and queues", () -> waiters("k") == 1);
        nextReleases.complete(null);
        assertTrue(nextWait.get(10, TimeUnit.SECONDS));
        assertTrue(cutWait.get(20, TimeUnit.SECONDS), "granted after the heal, in its turn");
        assertTrue(cut.client.session().opened() >= 2, "through a new session");
        await("the lock is free", () -> info("k") == null);
    }

    /** The client id part of the current holder's owner. */
    private String ownerProcess() {
        String owner = owner("k");
        return owner == null ? null : owner.substring(0, owner.lastIndexOf(':'));
    }

    /**
     * A holder with 100 waiters of another process behind it is cut off: after its session's timeout the lock
     * passes to the waiters, one after the other in their queue's order, and the holder knew first.
     */
    @Test
    void aHolderCutOffWithAHundredWaitersBehindItPassesTheLockOnInOrder() throws Exception {
        Process holder = new Process(T_MS);
        onOtherThread(() -> holder.client.getFairLock("k").lock());
        FlockClient waiting = client();
        FlockLock lock = waiting.getFairLock("k");
        List<Integer> order = Collections.synchronizedList(new ArrayList<>());
        long[] firstGranted = {0};
        List<Thread> waiters = queueInTurn("k", 100, n -> () -> {
            lock.lock();
            synchronized (order) {
                if (order.isEmpty()) {
                    firstGranted[0] = System.nanoTime();
                }
                order.add(n);
            }
            lock.unlock();
        });
        holder.proxy.partition();
        joinAll(waiters);
        List<Integer> expected = new ArrayList<>();
        for (int i = 0; i < 100; i++) {
            expected.add(i);
        }
        assertEquals(expected, order, "granted in queue order");
        Long lost = holder.lostAt.get("k");
        assertNotNull(lost, "the holder reported no loss");
        assertTrue(lost - firstGranted[0] < 0, "the holder knew of its loss after the first waiter was granted");
        assertEquals("unconfirmed", holder.reasons.get("k"));
        assertEquals(1, waiting.session().opened(), "the waiters' session never broke");
        await("the lock is free", () -> info("k") == null);
        holder.proxy.heal();
    }

    /**
     * A partition shorter than half the session timeout less the margin (the longest silence a session always
     * survives: the read sent as it began is answered a quarter of T after the heal): the heartbeats go
     * on after it, and nothing is lost. The silence between two confirmed heartbeats then comes close to T.
     */
    @Test
    void aSessionResumedFromSilenceBeforeItsTimeoutLosesNothing() throws Exception {
        long t = 900;
        Process holder = new Process(t);
        FlockLock lock = holder.client.getFairLock("k");
        CompletableFuture<Boolean> held = onThread(() -> {
            lock.lock();
            holder.proxy.partition();
            Thread.sleep(t / 3 - 10 - t / 100 - 40); // the partition's length is what is tested
            holder.proxy.heal();
            long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(2 * t);
            boolean lost = false;
            while (System.nanoTime() - end < 0 && !lost) {
                lost = lock.isLeaseLost();
                Thread.sleep(5);
            }
            if (!lost) {
                lock.unlock();
            }
            return lost;
        });
        assertFalse(held.get(20, TimeUnit.SECONDS), "isLeaseLost() within two timeouts after a short silence");
        assertTrue(holder.lostAt.isEmpty(), "a loss was reported: " + holder.reasons);
        assertEquals(1, holder.client.session().opened(), "the same session all along");
        assertNull(info("k"), "released by its holder");
    }

    /** A {@link PausedHolder} process holding lock k, its output, and the token it said it holds. */
    private record Holder(java.lang.Process process, BufferedReader out, long token) implements AutoCloseable {
        static Holder start(int port) throws Exception {
            Path javaBin = Path.of(System.getProperty("java.home"), "bin", "java");
            String classPath = location(PausedHolder.class) + java.io.File.pathSeparator
                    + location(FlockClient.class);
            java.lang.Process child = new ProcessBuilder(javaBin.toString(), "-XX:TieredStopAtLevel=1", "-cp",
                    classPath, "io.flock.PausedHolder", Integer.toString(port), Long.toString(T_MS), "k")
                    .redirectError(ProcessBuilder.Redirect.INHERIT).start();
            BufferedReader out = new BufferedReader(new InputStreamReader(child.getInputStream(),
                    StandardCharsets.UTF_8));
            String heldLine = out.readLine();
            assertNotNull(heldLine, "the holder process exited");
            assertTrue(heldLine.startsWith("held "), heldLine);
            return new Holder(child, out, Long.parseLong(heldLine.substring("held ".length())));
        }

        /** Asks for the first isLeaseLost() after the line; written while the process may be stopped. */
        void ask() throws Exception {
            OutputStream in = process.getOutputStream();
            in.write("check\n".getBytes(StandardCharsets.UTF_8));
            in.flush();
        }

        @Override
        public void close() {
            process.destroyForcibly();
        }
    }

    /**
     * The holder's JVM is stopped (SIGSTOP) past its session's deadline while another process waits: the server
     * passes the lock on, and after SIGCONT the holder's first isLeaseLost() is true (unconfirmed), whether its
     * timer ran first or the check of the clock found the deadline passed.
     */
    @Test
    void aHolderPausedPastItsDeadlineSeesTheLossAtItsFirstCheck() throws Exception {
        try (Holder holder = Holder.start(server.port)) {
            signal(holder.process(), "-STOP");
            CompletableFuture<Long> waiter = grantedAt(client().getFairLock("k"), 20_000);
            waiter.get(20, TimeUnit.SECONDS); // the server ended the stopped holder's session
            holder.ask(); // waits in the pipe: the first thing the holder's main thread reads once it goes on
            signal(holder.process(), "-CONT");
            assertEquals("lost true unconfirmed", holder.out().readLine(),
                    "the first isLeaseLost() of grant " + holder.token());
        }
    }

    /**
     * The holder's JVM is stopped for a third of its session's timeout (less than T/2 - m, the longest pause it always
     * survives), so nothing is lost, at the client or the server.
     */
    @Test
    void aHolderPausedForAThirdOfItsSessionTimeoutLosesNothing() throws Exception {
        try (Holder holder = Holder.start(server.port)) {
            long expiries = sessionExpiries();
            signal(holder.process(), "-STOP");
            Thread.sleep(T_MS / 3); // the pause tested
            signal(holder.process(), "-CONT");
            Thread.sleep(T_MS); // past the session's timeout since the pause began: any loss has come
            holder.ask();
            assertEquals("lost false null", holder.out().readLine(), "grant " + holder.token());
            assertEquals(holder.token(), Long.parseLong(String.valueOf(info("k").get("token"))));
            assertEquals(expiries, sessionExpiries());
        }
    }

    private long sessionExpiries() throws IOException {
        try (RespConnection c = server.connect()) {
            String info = TestCluster.text(c.call("INFO", "flock"));
            return Long.parseLong(info.replaceAll("(?s).*flock_session_expiries:(\\d+).*", "$1"));
        }
    }

    private static String location(Class<?> c) throws Exception {
        return Path.of(c.getProtectionDomain().getCodeSource().getLocation().toURI()).toString();
    }

    private static void signal(java.lang.Process process, String signal) throws Exception {
        assertEquals(0, new ProcessBuilder("kill", signal, Long.toString(process.pid())).inheritIO().start().waitFor());
    }

    /**
     * The server restarts under a process's session: the grant that lived with it is reported lost
     * (sessionended) and never taken again; a grant with a lease of its own is checked on the new server and
     * reported lost (notowner); a wait is sent again on a new session and granted there.
     */
    @Test
    void aServerRestartUnderASessionLosesItsGrantsAndResendsItsWaits() throws Exception {
        TestServer[] own = {TestServer.start()};
        try {
            int port = own[0].port;
            FlockClient client = opened(new FlockClient(own[0].factory()));
            Map<String, String> reasons = new ConcurrentHashMap<>();
            client.setLeaseLostListener((name, thread, token, reason) -> reasons.put(name, reason));
            FlockLock session = client.getFairLock("a");
            FlockLock leased = client.getFairLock("c");
            CompletableFuture<Void> check = new CompletableFuture<>();
            CompletableFuture<String> holder = onThread(() -> {
                session.lock();
                leased.lock(60, TimeUnit.SECONDS);
                check.get(30, TimeUnit.SECONDS);
                return session.getLeaseLostReason() + " " + leased.getLeaseLostReason();
            });
            FlockClient other = opened(new FlockClient(own[0].factory()));
            other.getFairLock("b").lock(60, TimeUnit.SECONDS);
            CompletableFuture<Boolean> waiter = onThread(() -> client.getFairLock("b").tryLock(30, -1,
                    TimeUnit.SECONDS));
            await("both are held and the wait queues", () -> reasons.isEmpty() && waitersOn(own[0], "b") == 1
                    && infoOn(own[0], "a") != null && infoOn(own[0], "c") != null);
            own[0].close();
            own[0] = TestServer.start(port);
            assertTrue(waiter.get(20, TimeUnit.SECONDS), "the wait was sent again and granted by the new server");
            await("both grants are reported lost", () -> reasons.size() == 2);
            assertEquals("sessionended", reasons.get("a"));
            assertEquals("notowner", reasons.get("c"));
            check.complete(null);
            assertEquals("sessionended notowner", holder.get(10, TimeUnit.SECONDS));
            assertNull(infoOn(own[0], "a"), "the grant that lived with the session was not taken again");
            assertNull(infoOn(own[0], "c"), "nor the leased one");
        } finally {
            own[0].close();
        }
    }

    private static Object infoOn(TestServer server, String key) {
        try (RespConnection c = server.connect()) {
            return c.call("FLOCK.INFO", key);
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    private static long waitersOn(TestServer server, String key) {
        try (RespConnection c = server.connect()) {
            Object info = c.call("FLOCK.INFO", key);
            return info == null ? 0 : (Long) ScenarioTest.fields(info).get("waiters");
        } catch (IOException e) {
            return -1;
        }
    }
}
