package io.flock;

import static io.flock.TestServer.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * Redisson's own multi-lock tests (redisson/src/test/java/org/redisson/RedissonMultiLockTest.java), ported to
 * FLOCK with the upstream names. Upstream builds {@code new RedissonMultiLock(lock1, lock2, lock3)} (or
 * {@code getMultiLock}) from {@code getLock}s; here {@code getMultiLock} of the client's locks. The differences,
 * on purpose: sleeps used as synchronisation become waits for what the server shows; {@code test}, upstream on
 * three servers (a lock on each), runs on one, since FLOCK's multi-lock is one request to one server;
 * {@code isHeldByThread(id)} has no FLOCK equivalent and is left out of {@code testLockUnlock}.
 */
class RedissonMultiLockPortTest extends ServerTest {

    @Test
    void testLockUnlock() {
        FlockClient client = client();
        FlockLock lock1 = client.getLock("lock1");
        FlockLock lock2 = client.getLock("lock2");
        FlockLock lock3 = client.getLock("lock3");

        FlockMultiLock lock = client.getMultiLock(lock1, lock2, lock3);
        try {
            lock.lock(10, TimeUnit.SECONDS);
            assertTrue(lock.isHeldByCurrentThread());
        } finally {
            lock.unlock();
        }
        assertFalse(lock.isHeldByCurrentThread());
    }

    @Test
    void testWaitAndLeaseTimeouts() throws Exception {
        FlockClient client = client();
        FlockLock lock1 = client.getLock("lock1");
        FlockLock lock2 = client.getLock("lock2");
        FlockLock lock3 = client.getLock("lock3");

        AtomicInteger counter = new AtomicInteger();
        List<CompletableFuture<Void>> tasks = new ArrayList<>();
        for (int i = 0; i < 10; i++) {
            tasks.add(onThread(() -> {
                FlockMultiLock lock = client.getMultiLock(lock1, lock2, lock3);
                boolean res = lock.tryLock(-1, 10, TimeUnit.SECONDS);
                if (res) {
                    counter.incrementAndGet();
                }
                return null;
            }));
        }
        for (CompletableFuture<Void> task : tasks) {
            task.get(10, TimeUnit.SECONDS);
        }
        assertEquals(1, counter.get());
    }

    @Test
    void testMultiThreads() throws Exception {
        FlockClient client = client();
        FlockLock lock1 = client.getLock("lock1");
        FlockLock lock2 = client.getLock("lock2");
        FlockLock lock3 = client.getLock("lock3");

        CompletableFuture<Void> locked = new CompletableFuture<>();
        CompletableFuture<Void> release = new CompletableFuture<>();
        CompletableFuture<Void> t = onThread(() -> {
            FlockMultiLock lock = client.getMultiLock(lock1, lock2, lock3);
            lock.lock();
            locked.complete(null);
            release.get();
            lock.unlock();
            return null;
        });
        locked.get(10, TimeUnit.SECONDS);

        CompletableFuture<Void> main = onThread(() -> {
            FlockMultiLock lock = client.getMultiLock(lock1, lock2, lock3);
            lock.lock();
            lock.unlock();
            return null;
        });
        await("the second multi-lock waits", () -> waiters("lock1") == 1);
        release.complete(null); // upstream: the first thread's sleep ends
        t.get(10, TimeUnit.SECONDS);
        main.get(10, TimeUnit.SECONDS);
    }

    @Test
    void test() throws Exception {
        FlockClient client1 = client();
        FlockClient client2 = client();
        FlockLock lock1 = client1.getLock("lock1");
        FlockLock lock2 = client1.getLock("lock2");
        FlockLock lock3 = client1.getLock("lock3");

        FlockMultiLock lock = client1.getMultiLock(lock1, lock2, lock3);
        lock.lock();

        onOtherThread(() -> {
            FlockMultiLock other = client1.getMultiLock(lock1, lock2, lock3);
            assertFalse(other.tryLock());
            assertFalse(other.tryLock());
        });
        // FLOCK: another client's multi-lock of the same names is refused the same way
        assertFalse(onThread(() -> client2.getMultiLock("lock1", "lock2", "lock3").tryLock()).get(10,
                TimeUnit.SECONDS));

        lock.unlock();
    }
}
