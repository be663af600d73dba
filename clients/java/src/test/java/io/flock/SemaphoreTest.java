package io.flock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/** getSemaphore: the limit holds, FIFO without overtaking, WRONGMODE, reentry, leases and the watchdog. */
class SemaphoreTest extends ServerTest {

    @Test
    void theLimitHoldsUnderManyConcurrentHolders() throws Exception {
        int limit = 3;
        AtomicInteger inside = new AtomicInteger();
        AtomicInteger most = new AtomicInteger();
        List<CompletableFuture<Integer>> workers = new ArrayList<>();
        for (int w = 0; w < 8; w++) {
            FlockSemaphore semaphore = client().getSemaphore("s", limit);
            workers.add(onThread(() -> {
                for (int round = 0; round < 5; round++) {
                    semaphore.acquire();
                    most.accumulateAndGet(inside.incrementAndGet(), Math::max);
                    inside.decrementAndGet();
                    semaphore.release();
                }
                return 5;
            }));
        }
        int rounds = 0;
        for (CompletableFuture<Integer> worker : workers) {
            rounds += worker.get(20, TimeUnit.SECONDS);
        }
        assertEquals(40, rounds);
        assertTrue(most.get() <= limit, "at most " + limit + " held at once, saw " + most.get());
        assertNull(info("s"));
    }

    @Test
    void aFullSemaphoreRefusesATry() throws Exception {
        FlockSemaphore semaphore = client().getSemaphore("s", 3);
        List<Holder> holders = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            holders.add(new Holder(semaphore.permits(1)));
        }
        for (Holder h : holders) {
            h.token();
        }
        assertEquals(0, semaphore.availablePermits());
        assertFalse(semaphore.tryAcquire());
        assertEquals(3, holderCount("s"));
        holders.get(0).unlock();
        assertEquals(1, semaphore.availablePermits());
        assertTrue(semaphore.tryAcquire());
        semaphore.release();
        holders.get(1).unlock();
        holders.get(2).unlock();
        assertNull(info("s"));
    }

    @Test
    void aBigRequestAtTheHeadIsNotOvertaken() throws Exception {
        FlockSemaphore semaphore = client().getSemaphore("s", 3);
        Holder first = new Holder(semaphore.permits(2));
        first.token();
        Holder big = new Holder(semaphore.permits(2));
        TestServer.await("the big request queues", () -> waiters("s") == 1);
        assertEquals(1, semaphore.availablePermits());
        assertFalse(onThread(semaphore::tryAcquire).get(10, TimeUnit.SECONDS), "a try does not pass the big request");
        Holder small = new Holder(semaphore.permits(1));
        TestServer.await("the small request queues behind it", () -> waiters("s") == 2);
        assertFalse(small.isGranted(), "one permit is free, but the big request waits first");
        first.unlock();
        long bigToken = big.token();
        assertTrue(small.token() > bigToken, "both fit once the first leaves, in queue order");
        assertEquals(0, semaphore.availablePermits());
        big.unlock();
        small.unlock();
        assertNull(info("s"));
    }

    @Test
    void theWrongModeIsRefused() throws Exception {
        FlockClient client = client();
        client.getFairLock("lock").lock();
        WrongModeException onALock = assertThrows(WrongModeException.class, () -> client.getSemaphore("lock", 3).tryAcquire());
        assertEquals("WRONGMODE", onALock.code());
        FlockSemaphore semaphore = client.getSemaphore("s", 3);
        semaphore.acquire();
        assertThrows(WrongModeException.class, () -> client.getSemaphore("s", 5).tryAcquire(), "another limit");
        assertThrows(WrongModeException.class, () -> client.getFairLock("s").tryLock(), "a lock on a semaphore");
        assertThrows(WrongModeException.class, () -> client.getReadWriteLock("s").readLock().tryLock());
        assertEquals("semaphore", mode("s"));
        assertEquals(1, holds("s"), "nothing changed");
        semaphore.release();
        client.getFairLock("lock").unlock();
    }

    @Test
    void reentryTakesTheSamePermits() throws Exception {
        FlockSemaphore semaphore = client().getSemaphore("s", 3);
        semaphore.acquire(2);
        long token = semaphore.getToken();
        semaphore.acquire(2);
        assertEquals(token, semaphore.getToken());
        assertEquals(2, holds("s"));
        assertEquals(1, semaphore.availablePermits());
        RedisError otherCount = assertThrows(RedisError.class, () -> semaphore.tryAcquire(1));
        assertEquals("ERR", otherCount.code());
        semaphore.release();
        assertEquals(1, semaphore.availablePermits(), "one hold left keeps both permits");
        semaphore.release();
        assertEquals(3, semaphore.availablePermits());
        assertThrows(IllegalMonitorStateException.class, semaphore::release);
    }

    @Test
    void aLeaseTimeGivesThePermitsBack() throws Exception {
        FlockSemaphore semaphore = client().getSemaphore("s", 2);
        // 1 s: the permits are still held when availablePermits() asks, on a busy machine too (100 ms was not)
        semaphore.acquire(2, 1_000, TimeUnit.MILLISECONDS);
        assertEquals(0, semaphore.availablePermits());
        TestServer.await("the lease ends", () -> semaphore.availablePermits() == 2);
        assertThrows(IllegalMonitorStateException.class, semaphore::release);
    }

    @Test
    void theSessionKeepsSemaphorePermitsAlive() throws Exception {
        FlockSemaphore semaphore = sessionClient(WATCHDOG_MS).getSemaphore("s", 2);
        keptAlive(semaphore.permits(1).client, "s", semaphore.permits(1), semaphore::acquire, semaphore::release);
    }

    @Test
    void theWatchdogKeepsASemaphoreLeaseAliveWithoutSessions() throws Exception {
        FlockSemaphore semaphore = watchdogClient(WATCHDOG_MS).getSemaphore("s", 2);
        keptAlive(semaphore.permits(1).client, "s", semaphore.permits(1), semaphore::acquire, semaphore::release);
    }
}
