package io.flock;

import static io.flock.TestServer.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.locks.Lock;
import org.junit.jupiter.api.Test;

/** The Lock interface and FLOCK's additions (token, watchdog, lost lease) against a real server. */
class FlockLockTest extends ServerTest {

    @Test
    void ownerIsClientUuidAndThreadId() {
        FlockClient client = client();
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        assertEquals(client.getId() + ":" + Thread.currentThread().getId(), owner("k"));
        lock.unlock();
        assertNull(info("k"));
    }

    @Test
    void reentryAddsHoldsWithTheSameToken() {
        FlockLock lock = client().getFairLock("k");
        long first = lock.lockAndGetToken();
        long second = lock.lockAndGetToken();
        assertEquals(first, second);
        assertEquals(2, holds("k"));
        lock.unlock();
        assertEquals(1, holds("k"));
        assertTrue(lock.isHeldByCurrentThread());
        lock.unlock();
        assertNull(info("k"));
    }

    @Test
    void tryLockFailsWithoutQueueingWhileAnotherThreadHolds() throws Exception {
        FlockLock lock = client().getFairLock("k");
        lock.lock();
        assertEquals(false, onThread(lock::tryLock).get());
        assertEquals(0, waiters("k"));
        lock.unlock();
    }

    @Test
    void tryLockWithTimeWaitsInTheQueueForTheRelease() throws Exception {
        FlockLock lock = client().getFairLock("k");
        lock.lock();
        CompletableFuture<Boolean> waiter = onThread(() -> {
            boolean got = lock.tryLock(10, TimeUnit.SECONDS);
            lock.unlock();
            return got;
        });
        await("the waiter queues", () -> waiters("k") == 1);
        lock.unlock();
        assertTrue(waiter.get(10, TimeUnit.SECONDS));
        await("the waiter released", () -> info("k") == null);
    }

    @Test
    void tryLockWithTimeGivesUpAndLeavesTheQueue() throws Exception {
        FlockLock lock = client().getFairLock("k");
        lock.lock();
        assertFalse(onThread(() -> lock.tryLock(100, TimeUnit.MILLISECONDS)).get(10, TimeUnit.SECONDS));
        assertEquals(0, waiters("k"));
        lock.unlock();
    }

    @Test
    void unlockWhenNotHeldThrowsIllegalMonitorState() {
        FlockLock lock = client().getFairLock("k");
        assertThrows(IllegalMonitorStateException.class, lock::unlock);
        lock.lock();
        lock.unlock();
        assertThrows(IllegalMonitorStateException.class, lock::unlock);
    }

    @Test
    void unlockByAnotherThreadThrowsAndKeepsTheLock() throws Exception {
        FlockLock lock = client().getFairLock("k");
        lock.lock();
        assertTrue(failure(onThread(() -> {
            lock.unlock();
            return null;
        })) instanceof IllegalMonitorStateException);
        assertTrue(lock.isHeldByCurrentThread());
        lock.unlock();
    }

    @Test
    void newConditionIsUnsupported() {
        Lock lock = client().getFairLock("k");
        assertThrows(UnsupportedOperationException.class, lock::newCondition);
    }

    @Test
    void interruptCancelsTheWaitOnTheServer() throws Exception {
        FlockLock lock = client().getFairLock("k");
        lock.lock();
        AtomicReference<Thread> waiterThread = new AtomicReference<>();
        CompletableFuture<Void> waiter = onThread(() -> {
            waiterThread.set(Thread.currentThread());
            lock.lockInterruptibly();
            return null;
        });
        await("the waiter queues", () -> waiters("k") == 1);
        waiterThread.get().interrupt();
        assertTrue(failure(waiter) instanceof InterruptedException);
        assertEquals(0, waiters("k"));
        lock.unlock();
        assertNull(info("k"), "the lock went to nobody: the cancelled waiter left the queue");
    }

    @Test
    void lockInterruptiblyThrowsAtOnceWhenAlreadyInterrupted() {
        FlockLock lock = client().getFairLock("k");
        Thread.currentThread().interrupt();
        assertThrows(InterruptedException.class, lock::lockInterruptibly);
        assertFalse(Thread.interrupted());
        assertNull(info("k"));
    }

    /** The grant and the interrupt race; whichever wins, the lock ends free and the queue empty. */
    @Test
    void interruptRacingAGrantLeavesNothingHeld() throws Exception {
        FlockClient client = client();
        FlockLock lock = client.getFairLock("k");
        for (int round = 0; round < 20; round++) {
            lock.lock();
            AtomicReference<Thread> waiterThread = new AtomicReference<>();
            CompletableFuture<Void> waiter = onThread(() -> {
                waiterThread.set(Thread.currentThread());
                lock.lockInterruptibly();
                lock.unlock();
                return null;
            });
            await("the waiter queues", () -> waiters("k") == 1);
            waiterThread.get().interrupt();
            lock.unlock();
            Throwable outcome = failure(waiter);
            assertTrue(outcome == null || outcome instanceof InterruptedException, String.valueOf(outcome));
            await("the lock is free", () -> info("k") == null);
        }
        assertEquals(0, client.watchdogs());
    }

    @Test
    void aWaitDoesNotBlockTheCommandConnections() throws Exception {
        FlockClient client = client();
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        CompletableFuture<Void> waiter = onThread(() -> {
            lock.lock();
            lock.unlock();
            return null;
        });
        await("the waiter queues", () -> waiters("k") == 1);
        assertTrue(lock.isLocked());
        assertFalse(client.getFairLock("other").isLocked());
        lock.unlock();
        waiter.get(10, TimeUnit.SECONDS);
    }

    /** {@code args} through {@link FlockClient#call}, on a command connection of the client. */
    static Object send(FlockClient client, String... args) throws java.io.IOException {
        byte[][] bytes = new byte[args.length][];
        for (int i = 0; i < args.length; i++) {
            bytes[i] = FlockClient.bytes(args[i]);
        }
        return client.call(bytes);
    }

    /** A wait without a session, of owner {@code owner}: it blocks the command connection it is sent on. */
    CompletableFuture<Object> blockingWait(FlockClient client, String owner) {
        return onThread(() -> send(client, "FLOCK.ACQUIRE", "k", owner, "30000", "WAIT", "0"));
    }

    @Test
    void aCommandBlockedOnTheServerDoesNotHoldUpAnotherThreads() throws Exception {
        FlockClient client = client();
        admin.call("FLOCK.ACQUIRE", "k", "admin", "30000");
        CompletableFuture<Object> blocked = blockingWait(client, "blocked");
        await("the command blocks on the server", () -> waiters("k") == 1);
        CompletableFuture<Boolean> other = onThread(() -> {
            FlockLock lock = client.getFairLock("other");
            boolean taken = lock.tryLock();
            lock.unlock();
            return taken;
        });
        assertTrue(other.get(10, TimeUnit.SECONDS));
        assertFalse(blocked.isDone());
        admin.call("FLOCK.RELEASE", "k", "admin");
        assertTrue(blocked.get(10, TimeUnit.SECONDS) instanceof Long);
    }

    @Test
    void commandsBeyondTheNodesConnectionsWaitForOneToComeBack() throws Exception {
        FlockClient client = client();
        admin.call("FLOCK.ACQUIRE", "k", "admin", "30000");
        assertEquals(0, waiters("k")); // the test's own client connects now: not counted below
        long before = connectedClients();
        List<CompletableFuture<Object>> blocked = new ArrayList<>();
        for (int i = 0; i < Node.LINKS; i++) {
            blocked.add(blockingWait(client, "blocked" + i));
        }
        await("every command connection is blocked", () -> waiters("k") == Node.LINKS);
        CompletableFuture<Object> next = new CompletableFuture<>();
        Thread sender = spawn(() -> {
            try {
                next.complete(send(client, "FLOCK.INFO", "k"));
            } catch (Throwable e) {
                next.completeExceptionally(e);
            }
        });
        await("the next command waits for a connection", () -> sender.getState() == Thread.State.WAITING);
        assertEquals(Node.LINKS, connectedClients() - before);
        assertFalse(next.isDone());
        admin.call("FLOCK.RELEASE", "k", "admin"); // the first blocked wait is granted: its connection comes back
        assertNotNull(next.get(10, TimeUnit.SECONDS));
        admin.call("DEL", "k"); // the other waits end (LOCKDELETED)
        for (CompletableFuture<Object> wait : blocked) {
            Throwable ended = failure(wait);
            assertTrue(ended == null || ended instanceof RedisError, String.valueOf(ended));
        }
        assertEquals(Node.LINKS, connectedClients() - before);
    }

    @Test
    void aBurstOfWaitsWithoutSessionsLeavesAFewIdleConnections() throws Exception {
        int threads = 12;
        FlockClient client = watchdogClient(FlockClient.DEFAULT_WATCHDOG_TIMEOUT_MS);
        FlockLock lock = client.getFairLock("k");
        assertNull(info("k")); // the test's own client connects now: not counted below
        long before = connectedClients();
        lock.lock();
        List<Thread> waiting = new ArrayList<>();
        for (int i = 0; i < threads; i++) {
            waiting.add(spawn(() -> {
                lock.lock();
                lock.unlock();
            }));
        }
        await(threads + " waits block a connection each", () -> waiters("k") == threads);
        assertTrue(connectedClients() - before > threads);
        lock.unlock();
        joinAll(waiting);
        await("the lock is free", () -> info("k") == null);
        // the command connections, the idle wait connections the node keeps and the watchdog's, at most
        await("the wait connections beyond the idle ones close",
                () -> connectedClients() - before <= 2L * Node.LINKS + 1);
    }

    @Test
    void fencingTokensIncreaseWithEveryGrant() {
        FlockLock lock = client().getFairLock("k");
        long previous = 0;
        for (int i = 0; i < 5; i++) {
            long token = lock.lockAndGetToken();
            assertTrue(token > previous);
            assertEquals(token, lock.getToken());
            assertEquals(token, (Long) info("k").get("token"));
            lock.unlock();
            previous = token;
        }
        assertThrows(IllegalMonitorStateException.class, lock::getToken);
    }

    @Test
    void aLockWithoutLeaseTimeLivesWithTheSessionWithoutRenewals() {
        FlockClient client = sessionClient(WATCHDOG_MS);
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        assertEquals(1L, info("k").get("session"), "bound to the session");
        awaitRenewals("k", 3); // the session's heartbeats move it on, for longer than the timeout
        assertTrue(lock.isHeldByCurrentThread());
        assertFalse(lock.isLeaseLost());
        assertEquals(0, client.watchdogs());
        lock.unlock();
        assertNull(info("k"));
    }

    @Test
    void watchdogRenewsTheLeaseUntilUnlockWithoutSessions() {
        FlockClient client = watchdogClient(WATCHDOG_MS);
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        // The lease left only rises when a renewal resets it; three rises span more than one lease.
        awaitRenewals("k", 3);
        assertTrue(lock.isHeldByCurrentThread());
        assertEquals(1, client.watchdogs());
        lock.unlock();
        assertEquals(0, client.watchdogs());
        assertNull(info("k"));
    }

    @Test
    void aLostLeaseIsReportedAndUnlockThenThrows() throws Exception {
        FlockClient client = client(WATCHDOG_MS);
        CompletableFuture<String> reported = new CompletableFuture<>();
        client.setLeaseLostListener((name, thread, token, reason) -> reported.complete(name + " " + reason));
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        assertEquals(1L, admin.call("FLOCK.FORCERELEASE", "k"));
        // Sessions: the server pushes the loss ("forcereleased"); a renewal in flight may find it first.
        String report = reported.get(10, TimeUnit.SECONDS);
        assertTrue(report.equals("k forcereleased") || report.equals("k notowner"), report);
        assertTrue(lock.isLeaseLost());
        assertThrows(IllegalMonitorStateException.class, lock::unlock);
        assertFalse(lock.isLeaseLost());
        assertEquals(0, client.watchdogs());
    }

    @Test
    void aLeaseTimeEndsTheLockWithoutAWatchdog() {
        FlockClient client = client();
        FlockLock lock = client.getFairLock("k");
        lock.lock(200, TimeUnit.MILLISECONDS);
        assertEquals(0, client.watchdogs());
        await("the lease ends", () -> info("k") == null);
        assertThrows(IllegalMonitorStateException.class, lock::unlock);
    }

    @Test
    void waitersAreGrantedInQueueOrder() throws Exception {
        FlockClient client = client();
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        List<Integer> order = Collections.synchronizedList(new ArrayList<>());
        List<Thread> waiters = queueInTurn("k", 5, n -> () -> {
            lock.lock();
            order.add(n);
            lock.unlock();
        });
        lock.unlock();
        joinAll(waiters);
        assertEquals(List.of(0, 1, 2, 3, 4), order);
    }

    @Test
    void forceUnlockReleasesWhoeverHolds() throws Exception {
        FlockClient client = client();
        FlockLock lock = client.getFairLock("k");
        onThread(() -> {
            lock.lock();
            return null;
        }).get(10, TimeUnit.SECONDS);
        assertTrue(lock.isLocked());
        assertTrue(lock.forceUnlock());
        assertFalse(lock.isLocked());
        assertFalse(lock.forceUnlock());
        assertEquals(0, client.watchdogs());
        assertNotNull(lock.tryLockAndGetToken());
        lock.unlock();
    }
}
