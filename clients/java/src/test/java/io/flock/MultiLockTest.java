package io.flock;

import static io.flock.TestServer.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

/** FlockClient.getMultiLock: several keys in one FLOCK.ACQUIREALL / FLOCK.RELEASEALL, all or none. */
class MultiLockTest extends ServerTest {

    /** The owner the current thread of {@code client} acquires as. */
    private static String ownerOf(FlockClient client) {
        return client.getId() + ":" + Thread.currentThread().getId();
    }

    private long token(String key) {
        return (Long) info(key).get("token");
    }

    /** The key's exclusive holder, or null (also for a free key kept for a waiting multi-lock). */
    private String holder(String key) {
        Object owner = info(key) == null ? null : info(key).get("owner");
        return owner == null ? null : TestCluster.text(owner);
    }

    @Test
    void aTryTakesEveryKeyOrNone() throws Exception {
        FlockClient client = client();
        FlockMultiLock multi = client.getMultiLock("a", "b", "c");
        Holder other = new Holder(client().getLock("b"));
        other.token();
        assertFalse(multi.tryLock(), "b is busy");
        assertNull(info("a"), "a was not taken");
        assertNull(info("c"), "c was not taken");
        assertEquals(0, waiters("b"), "a try queues nowhere");
        other.unlock();
        List<Long> tokens = multi.tryLockAndGetTokens();
        assertNotNull(tokens);
        assertEquals(List.of(token("a"), token("b"), token("c")), tokens, "each key's token, in key order");
        for (String key : List.of("a", "b", "c")) {
            assertEquals(ownerOf(client), owner(key), "the thread's own owner, as its single locks'");
        }
        assertEquals(tokens, multi.getTokens());
        assertTrue(multi.isHeldByCurrentThread());
        multi.unlock();
        assertNull(info("a"));
        assertNull(info("b"));
        assertNull(info("c"));
    }

    @Test
    void aWaitIsGrantedWhenItsLastKeyFreesAheadOfASingleLockQueuedBehindIt() throws Exception {
        Holder onA = new Holder(client().getLock("a"));
        Holder onB = new Holder(client().getLock("b"));
        onA.token();
        onB.token();
        FlockClient client = client();
        FlockMultiLock multi = client.getMultiLock("a", "b", "c");
        CompletableFuture<String> multiOwner = new CompletableFuture<>();
        CompletableFuture<Void> release = new CompletableFuture<>();
        CompletableFuture<List<Long>> granted = onThread(() -> {
            multiOwner.complete(ownerOf(client));
            List<Long> tokens = multi.lockAndGetTokens();
            release.get();
            multi.unlock();
            return tokens;
        });
        await("the multi-lock queues at every key", () -> waiters("a") == 1 && waiters("b") == 1
                && waiters("c") == 1);
        assertNull(holder("c"), "c is free, kept for the waiting multi-lock");
        assertFalse(client().getLock("c").isLocked(), "nobody holds c (FLOCK.INFO shows its queue, owner nil)");
        assertEquals(-2, client().getLock("c").remainTimeToLive());
        Holder single = new Holder(client().getLock("c"));
        await("a single lock queues for c behind it", () -> waiters("c") == 2);
        FlockLock tryer = client().getLock("c");
        assertFalse(onThread(tryer::tryLock).get(10, TimeUnit.SECONDS), "a try does not cut in ahead of it");

        onA.unlock();
        assertNull(holder("a"), "a free is not enough: the wait needs b too");
        assertEquals(1, waiters("a"), "it keeps its place at a");
        assertFalse(granted.isDone());

        onB.unlock();
        String owner = multiOwner.get(10, TimeUnit.SECONDS);
        await("the multi-lock is granted every key", () -> owner.equals(owner("a")) && owner.equals(owner("b"))
                && owner.equals(owner("c")));
        assertFalse(single.isGranted(), "the single lock queued behind waits on");
        assertEquals(1, waiters("c"));

        release.complete(null);
        long multiToken = granted.get(10, TimeUnit.SECONDS).get(2);
        assertTrue(single.token() > multiToken, "c went to the single lock after the multi-lock");
        single.unlock();
        await("every key free", () -> info("a") == null && info("b") == null && info("c") == null);
    }

    @Test
    void aKeyTheThreadHoldsIsReentered() {
        FlockClient client = client();
        FlockLock a = client.getLock("a");
        long token = a.lockAndGetToken();
        FlockMultiLock multi = client.getMultiLock("a", "b");
        List<Long> tokens = multi.lockAndGetTokens();
        assertEquals(token, tokens.get(0), "a reentry keeps a's token");
        assertEquals(2, holds("a"));
        assertEquals(1, holds("b"));
        assertEquals(tokens.get(1), client.getLock("b").getToken(), "b is an ordinary hold of the thread");
        multi.unlock();
        assertEquals(1, holds("a"), "the single lock's hold stays");
        assertNull(info("b"));
        assertEquals(token, a.getToken());
        a.unlock();
        assertNull(info("a"));
    }

    @Test
    void unlockReleasesEveryKeyOnce() {
        FlockMultiLock multi = client().getMultiLock("a", "b", "c");
        multi.lock();
        multi.lock();
        assertEquals(2, holds("b"));
        multi.unlock();
        assertEquals(1, holds("a"));
        assertEquals(1, holds("b"));
        assertEquals(1, holds("c"));
        multi.unlock();
        assertNull(info("a"));
        assertNull(info("b"));
        assertNull(info("c"));
        assertThrows(IllegalMonitorStateException.class, multi::unlock);
    }

    /** RELEASEALL refuses the lot (NOTOWNER) when a key was lost: the keys still held are released anyway. */
    @Test
    void unlockAfterAKeyWasLostReleasesTheOthersAndThrowsForIt() throws IOException {
        FlockMultiLock multi = client().getMultiLock("a", "b", "c");
        multi.lock();
        admin.call("FLOCK.FORCERELEASE", "b");
        IllegalMonitorStateException e = assertThrows(IllegalMonitorStateException.class, multi::unlock);
        assertTrue(e.getMessage().contains("'b'"), e.getMessage());
        assertNull(info("a"), "a released all the same");
        assertNull(info("c"), "c released all the same");
    }

    @Test
    void aWaitThatWouldCloseACycleThrowsDeadlockExceptionAndQueuesNothing() throws Exception {
        FlockClient client = client();
        FlockLock b = client.getLock("b");
        b.lock();
        CompletableFuture<Boolean> other = onThread(() -> {
            FlockLock a = client.getLock("a");
            a.lock();
            try {
                boolean got = client.getLock("b").tryLock(10, TimeUnit.SECONDS);
                if (got) {
                    client.getLock("b").unlock();
                }
                return got;
            } finally {
                a.unlock();
            }
        });
        await("the other thread holds a and waits for b", () -> waiters("b") == 1 && info("a") != null);
        DeadlockException refused = assertThrows(DeadlockException.class,
                () -> client.getMultiLock("c", "a").tryLock(5, TimeUnit.SECONDS));
        assertEquals("DEADLOCK", refused.code());
        assertNull(info("c"), "nothing queued at c");
        assertEquals(0, waiters("a"), "nothing queued at a");
        b.unlock();
        assertTrue(other.get(10, TimeUnit.SECONDS), "the other thread goes on once this one lets go");
    }

    @Test
    void theWatchdogRenewsEveryKeyUntilUnlock() {
        FlockClient client = client(WATCHDOG_MS);
        FlockMultiLock multi = client.getMultiLock("a", "b");
        multi.lock();
        assertEquals(2, client.watchdogs());
        awaitRenewals("a", 2);
        awaitRenewals("b", 2);
        multi.unlock();
        assertEquals(0, client.watchdogs());
    }

    @Test
    void aLeaseTimeEndsEveryKeyWithoutAWatchdog() {
        FlockClient client = client();
        FlockMultiLock multi = client.getMultiLock("a", "b");
        multi.lock(1_000, TimeUnit.MILLISECONDS); // still held at the next line on a busy machine too
        assertEquals(0, client.watchdogs());
        assertTrue((Long) info("a").get("ttl-ms") <= 1_000);
        await("both leases end", () -> info("a") == null && info("b") == null);
        assertThrows(IllegalMonitorStateException.class, multi::unlock);
    }

    @Test
    void aTimedWaitThatRunsOutTakesNothingAndLeavesEveryQueue() throws Exception {
        Holder other = new Holder(client().getLock("b"));
        other.token();
        FlockMultiLock multi = client().getMultiLock("a", "b");
        assertFalse(onThread(() -> multi.tryLock(200, TimeUnit.MILLISECONDS)).get(10, TimeUnit.SECONDS));
        // the server answers the timeout first and takes the wait's entries out right after
        await("the wait leaves every queue, having taken nothing", () -> info("a") == null && waiters("b") == 0);
        other.unlock();
    }

    @Test
    void anInterruptLeavesEveryQueue() throws Exception {
        Holder other = new Holder(client().getLock("b"));
        other.token();
        FlockMultiLock multi = client().getMultiLock("a", "b");
        AtomicReference<Thread> waiter = new AtomicReference<>();
        CompletableFuture<Void> waited = onThread(() -> {
            waiter.set(Thread.currentThread());
            multi.lockInterruptibly();
            return null;
        });
        await("the multi-lock queues", () -> waiters("a") == 1 && waiters("b") == 1);
        waiter.get().interrupt();
        assertInstanceOf(InterruptedException.class, failure(waited));
        await("the wait leaves every queue", () -> info("a") == null && waiters("b") == 0);
        other.unlock();
        assertNull(info("b"), "nothing was granted to it");
    }

    @Test
    void readLocksAreTakenTogetherShared() throws Exception {
        FlockClient client = client();
        FlockMultiLock readers = client.getMultiLock(client.getReadWriteLock("a").readLock(),
                client.getReadWriteLock("b").readLock());
        readers.lock();
        onOtherThread(() -> {
            assertTrue(readers.tryLock(), "another reader too");
            readers.unlock();
        });
        assertEquals("shared", mode("a"));
        assertEquals("shared", mode("b"));
        assertFalse(onThread(() -> client.getMultiLock("a", "b").tryLock()).get(10, TimeUnit.SECONDS),
                "a writer waits for the readers");
        readers.unlock();
        assertNull(info("a"));
        assertNull(info("b"));
    }

    @Test
    void locksThatOneRequestCannotTakeAreRefused() {
        FlockClient client = client();
        assertThrows(IllegalArgumentException.class, () -> client.getMultiLock(new String[0]));
        assertThrows(IllegalArgumentException.class, () -> client.getMultiLock("a", "a"));
        assertThrows(IllegalArgumentException.class, () -> client.getMultiLock(client.getLock("a"),
                client().getLock("b")), "another client's lock");
        assertThrows(IllegalArgumentException.class, () -> client.getMultiLock(client.getLock("a"),
                client.getReadWriteLock("b").readLock()), "two modes");
        assertThrows(IllegalArgumentException.class, () -> client.getMultiLock(
                client.getSemaphore("s", 3).permits(1)), "a semaphore");
    }

    @Test
    void lostRepliesAreResentAndApplyOnce() throws Exception {
        DroppingProxy proxy = opened(new DroppingProxy(server.port));
        FlockClient proxied = opened(new FlockClient(RespConnection.factory("127.0.0.1", proxy.port())));
        FlockMultiLock multi = proxied.getMultiLock("a", "b");

        proxy.dropRepliesTo("FLOCK.ACQUIREALL", 1);
        List<Long> tokens = multi.tryLockAndGetTokens();
        assertEquals(1, proxy.dropped.get());
        assertEquals(List.of(token("a"), token("b")), tokens, "the resend answered the first grant's tokens");
        assertEquals(1, holds("a"), "and added no hold");
        assertEquals(1, holds("b"));

        proxy.dropRepliesTo("FLOCK.RELEASEALL", 1);
        multi.lock();
        multi.unlock();
        assertEquals(2, proxy.dropped.get());
        assertEquals(1, holds("a"), "the resend answered the first reply instead of releasing again");
        assertEquals(1, holds("b"));
        multi.unlock();
        assertNull(info("a"));

        Holder other = new Holder(client().getLock("b"));
        other.token();
        proxy.dropRepliesTo("FLOCK.ACQUIREALL", 1);
        CompletableFuture<List<Long>> waited = onThread(() -> {
            List<Long> granted = multi.lockAndGetTokens();
            multi.unlock();
            return granted;
        });
        await("the multi-lock waits", () -> waiters("b") == 1);
        other.unlock();
        assertEquals(2, waited.get(10, TimeUnit.SECONDS).size());
        assertEquals(3, proxy.dropped.get(), "the grant's reply was lost; its resend got the tokens");
        await("its one unlock freed both keys", () -> info("a") == null && info("b") == null);
    }

    /**
     * A wait's resend that reaches the server before it sees the first connection close is refused QUEUED (the
     * owner waits there already): the client sends it again once that wait is gone. Here the first wait is made
     * by hand, under the thread's owner, on a connection the test then closes.
     */
    @Test
    void aWaitRefusedQueuedWhileItsOwnerStillWaitsElsewhereIsSentAgain() throws Exception {
        Holder other = new Holder(client().getLock("b"));
        other.token();
        FlockClient client = client();
        FlockMultiLock multi = client.getMultiLock("a", "b");
        CompletableFuture<String> threadOwner = new CompletableFuture<>();
        CompletableFuture<Void> go = new CompletableFuture<>();
        CompletableFuture<List<Long>> waited = onThread(() -> {
            threadOwner.complete(ownerOf(client));
            go.get();
            List<Long> tokens = multi.lockAndGetTokens();
            multi.unlock();
            return tokens;
        });
        RespConnection elsewhere = opened(server.connect());
        String elsewhereId = "id=" + elsewhere.call("CLIENT", "ID") + " ";
        String owner = threadOwner.get(10, TimeUnit.SECONDS);
        onThread(() -> elsewhere.call("FLOCK.ACQUIREALL", "2", "a", "b", owner, "30000", "WAIT", "0"));
        await("the first wait queues", () -> waiters("b") == 1);
        go.complete(null);
        await("the thread's wait is refused QUEUED", () -> errors("QUEUED") >= 1);
        elsewhere.close();
        await("the server drops the first wait and the thread's queues", () -> !clients().contains(elsewhereId)
                && clients().contains("cmd=flock.acquireall") && waiters("b") == 1);
        other.unlock();
        assertEquals(2, waited.get(10, TimeUnit.SECONDS).size());
        await("both keys free", () -> info("a") == null && info("b") == null);
    }

    /** How many error replies of code {@code code} the server gave (INFO errorstats). */
    private long errors(String code) {
        try {
            String stats = TestCluster.text(admin.call("INFO", "errorstats"));
            int at = stats.indexOf("errorstat_" + code + ":count=");
            if (at < 0) {
                return 0;
            }
            String count = stats.substring(at + ("errorstat_" + code + ":count=").length()).split("\\s")[0];
            return Long.parseLong(count);
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    private String clients() {
        try {
            return TestCluster.text(admin.call("CLIENT", "LIST"));
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }
}
