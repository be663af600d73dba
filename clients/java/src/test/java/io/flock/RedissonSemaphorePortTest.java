package io.flock;

import static io.flock.TestServer.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * Redisson's own semaphore tests (redisson/src/test/java/org/redisson/RedissonSemaphoreTest.java, and two of
 * RedissonPermitExpirableSemaphoreTest.java), ported to FLOCK with the upstream names, as {@link
 * RedissonPortTest} ports the lock tests: sleeps used as synchronisation become waits for what the server
 * shows, elapsed-time assertions are dropped, leases of seconds become sub-second. FLOCK's semaphore differs
 * on purpose: permits belong to the thread that acquired them (a release by another thread is
 * IllegalMonitorStateException, never a new permit), a thread holds one grant of n permits (acquiring again
 * with the same n is one more hold, another n an error), and the limit m is given at getSemaphore and fixed
 * while the key exists (no trySetPermits, addPermits, drainPermits). A {@code FLOCK:} comment marks each place
 * where that changes what the test asserts.
 */
class RedissonSemaphorePortTest extends ServerTest {

    /** Upstream's unsynchronised counter under a semaphore of one permit: a lost update means two were inside. */
    static void countUnderOnePermit(FlockClient client, AtomicInteger lockedCounter) throws InterruptedException {
        FlockSemaphore s1 = client.getSemaphore("test", 1);
        s1.acquire();
        int value = lockedCounter.get();
        Thread.yield();
        lockedCounter.set(value + 1);
        s1.release();
    }

    @Test
    void testZero() {
        FlockSemaphore s = client().getSemaphore("test", 1);
        // FLOCK: upstream takes and releases 0 permits of a semaphore nobody set (0 available). FLOCK's
        // requests take 1..m permits (docs/commands.md), so 0 is an ERR that changes nothing, and the limit is
        // the one given at getSemaphore.
        RedisError zero = assertThrows(RedisError.class, () -> s.tryAcquire(0, 10, TimeUnit.MINUTES));
        assertEquals("ERR", zero.code());
        assertNull(info("test"));
        assertEquals(1, s.availablePermits());
    }

    @Test
    void testAcquireWithoutSetPermits() throws Exception {
        FlockSemaphore s = client().getSemaphore("test", 2);
        // FLOCK: upstream's two release() calls create the 2 permits that acquire(2) then takes. FLOCK's permits
        // belong to their holder and the limit comes from getSemaphore: a release by a thread holding none is
        // IllegalMonitorStateException and changes nothing.
        assertThrows(IllegalMonitorStateException.class, s::release);
        assertThrows(IllegalMonitorStateException.class, s::release);
        s.acquire(2);
        assertEquals(0, s.availablePermits());
        s.release();
    }

    /** Upstream's trySetPermits(1, 2 s) (a key that expires with its permits) is not ported: no such method. */
    @Test
    void testTrySetPermits() throws Exception {
        FlockClient client = client();
        // FLOCK: upstream's trySetPermits(10) is true, a later trySetPermits(15) false. FLOCK has no
        // trySetPermits: the ACQUIRE that creates the key fixes the limit given at getSemaphore, another limit
        // is WrongModeException while the key exists, that is while anyone holds or waits. After its last
        // holder left the key is gone (as after upstream's delete()), and a new limit starts.
        FlockSemaphore s = client.getSemaphore("test", 10);
        assertEquals(10, s.availablePermits());
        s.acquire();
        assertThrows(WrongModeException.class, () -> client.getSemaphore("test", 15).tryAcquire());
        assertEquals(9, s.availablePermits());
        s.release();
        assertNull(info("test"));
        assertEquals(0L, admin.call("EXISTS", "test"));
        FlockSemaphore one = client.getSemaphore("test", 1);
        assertTrue(one.tryAcquire());
        assertEquals(0, one.availablePermits());
        one.release();
    }

    @Test
    void testBlockingAcquire() throws Exception {
        FlockClient client = client();
        FlockSemaphore s = client.getSemaphore("test", 1);
        s.acquire();
        // FLOCK: upstream's other thread release()s a permit it never acquired, and this thread's second
        // acquire() takes it. FLOCK's permits belong to their holder: the other thread's release() is refused,
        // so here the other thread queues for the permit and gets it when this thread releases it.
        onOtherThread(() -> assertThrows(IllegalMonitorStateException.class, client.getSemaphore("test", 1)::release));
        assertEquals(0, s.availablePermits());
        Holder other = new Holder(s.permits(1));
        await("the other thread queues", () -> waiters("test") == 1);
        s.release();
        other.token();
        assertFalse(s.tryAcquire());
        assertEquals(0, s.availablePermits());
        other.unlock();
    }

    @Test
    void testBlockingNAcquire() throws Exception {
        FlockSemaphore s = client().getSemaphore("test", 5);
        // FLOCK: upstream's thread holds 3 and acquires 4 more after another thread release()s two it never
        // held, leaving 0. A FLOCK thread holds one grant of n permits (another n is an ERR), and only the
        // holder gives them back: here another thread holds the 3, and acquire(4) waits until they return
        // together, leaving 1.
        Holder three = new Holder(s.permits(3));
        three.token();
        assertEquals(2, s.availablePermits());
        Holder four = new Holder(s.permits(4));
        await("acquire(4) queues", () -> waiters("test") == 1);
        assertFalse(four.isGranted());
        three.unlock();
        four.token();
        assertEquals(1, s.availablePermits());
        four.unlock();
    }

    @Test
    void testTryNAcquire() throws Exception {
        FlockSemaphore s = client().getSemaphore("test", 5);
        // FLOCK: as testBlockingNAcquire, the 3 permits are another thread's grant, and tryAcquire(4, wait)
        // gets 4 once they return together (upstream: two released by a thread that never held them, 0 left).
        Holder three = new Holder(s.permits(3));
        three.token();
        assertFalse(s.tryAcquire(4));
        CompletableFuture<Integer> four = onThread(() -> {
            assertTrue(s.tryAcquire(4, 10, TimeUnit.SECONDS));
            int left = s.availablePermits();
            s.release();
            return left;
        });
        await("tryAcquire(4, wait) queues", () -> waiters("test") == 1);
        three.unlock();
        assertEquals(1, four.get(10, TimeUnit.SECONDS));
    }

    @Test
    void testReleaseWithoutPermits() {
        FlockSemaphore s = client().getSemaphore("test", 1);
        // FLOCK: upstream's release() on a semaphore nobody holds adds a permit (1 available). FLOCK's release
        // by a thread holding none is IllegalMonitorStateException and changes nothing; the 1 available is the
        // limit given at getSemaphore.
        assertThrows(IllegalMonitorStateException.class, s::release);
        assertNull(info("test"));
        assertEquals(1, s.availablePermits());
    }

    @Test
    void testReleaseAcquire() throws Exception {
        FlockSemaphore s = client().getSemaphore("test", 10);
        s.acquire();
        assertEquals(9, s.availablePermits());
        s.release();
        assertEquals(10, s.availablePermits());
        s.acquire(5);
        assertEquals(5, s.availablePermits());
        // FLOCK: upstream's release(5); FLOCK's release() gives back the thread's whole grant of 5 at once.
        s.release();
        assertEquals(10, s.availablePermits());
    }

    @Test
    void testConcurrency_SingleInstance() throws Exception {
        FlockClient client = client();
        AtomicInteger lockedCounter = new AtomicInteger();
        int iterations = 15;
        concurrently(iterations, i -> client, c -> countUnderOnePermit(c, lockedCounter));
        assertEquals(iterations, lockedCounter.get());
    }

    /** Upstream: 4 clients x 10 rounds of acquire(1) or acquire(Integer.MAX_VALUE) of MAX_VALUE permits. */
    @Test
    void testConcurrencyLoopMax_MultiInstance() throws Exception {
        int iterations = 10;
        AtomicInteger lockedCounter = new AtomicInteger();
        concurrently(4, i -> client(), c -> {
            FlockSemaphore s = c.getSemaphore("test", Integer.MAX_VALUE);
            for (int i = 0; i < iterations; i++) {
                int v = ThreadLocalRandom.current().nextBoolean() ? 1 : Integer.MAX_VALUE;
                s.acquire(v);
                lockedCounter.incrementAndGet();
                s.release();
            }
        });
        assertEquals(4 * iterations, lockedCounter.get());
        assertNull(info("test"));
    }

    /** Upstream: 16 clients x 100 rounds, each holding 10 ms; here 8 x 25, yielding while inside. */
    @Test
    void testConcurrencyLoop_MultiInstance() throws Exception {
        int iterations = 25;
        AtomicInteger lockedCounter = new AtomicInteger();
        concurrently(8, i -> client(), c -> {
            for (int i = 0; i < iterations; i++) {
                countUnderOnePermit(c, lockedCounter);
            }
        });
        assertEquals(8 * iterations, lockedCounter.get());
    }

    @Test
    void testConcurrency_MultiInstance_1_permits() throws Exception {
        int iterations = 30;
        AtomicInteger lockedCounter = new AtomicInteger();
        concurrently(iterations, i -> client(), c -> countUnderOnePermit(c, lockedCounter));
        assertEquals(iterations, lockedCounter.get());
    }

    // --- RedissonPermitExpirableSemaphoreTest ---

    /** Upstream: a permit with a 2 s lease; another thread's acquire() gets it when the lease ends (timed). */
    @Test
    void testExpire() throws Exception {
        FlockClient client = client();
        FlockSemaphore s = client.getSemaphore("test", 1);
        s.acquire(1, 300, TimeUnit.MILLISECONDS);
        takeAndGiveBack(client);
        // FLOCK: upstream's tryRelease(permitId) answers false for the expired permit; FLOCK has no permit IDs,
        // and the thread's release() throws IllegalMonitorStateException, as unlock() after a lease ended.
        assertThrows(IllegalMonitorStateException.class, s::release);
    }

    @Test
    void testExpireTryAcquire() throws Exception {
        FlockClient client = client();
        FlockSemaphore s = client.getSemaphore("test", 1);
        assertTrue(s.tryAcquire(1, 100, 300, TimeUnit.MILLISECONDS));
        takeAndGiveBack(client);
        // FLOCK: as in testExpire, release() of the expired permit throws instead of tryRelease's false.
        assertThrows(IllegalMonitorStateException.class, s::release);
    }

    /** Another thread's acquire() and release() of the semaphore "test" of one permit. */
    private void takeAndGiveBack(FlockClient client) throws Exception {
        onOtherThread(() -> {
            FlockSemaphore s = client.getSemaphore("test", 1);
            s.acquire();
            s.release();
        });
    }
}
