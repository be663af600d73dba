package io.flock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.Test;

/** Two threads that take two locks in opposite orders: the second wait is a DeadlockException, not a timeout. */
class DeadlockTest extends ServerTest {
    @Test
    void aWaitThatWouldDeadlockThrowsDeadlockExceptionAtOnceAndQueuesNothing() throws Exception {
        FlockClient client = client();
        FlockLock first = client.getFairLock("dl:1");
        FlockLock second = client.getFairLock("dl:2");
        first.lock();
        CompletableFuture<Boolean> b = onThread(() -> {
            second.lock();
            try {
                boolean got = first.tryLock(10, TimeUnit.SECONDS);
                if (got) {
                    first.unlock();
                }
                return got;
            } finally {
                second.unlock();
            }
        });
        TestServer.await("the other thread to queue for dl:1", () -> waiters("dl:1") == 1);
        DeadlockException refused = assertThrows(DeadlockException.class, () -> second.tryLock(5, TimeUnit.SECONDS));
        assertEquals("DEADLOCK", refused.code());
        assertTrue(refused.getMessage().contains(" -> "), refused.getMessage());
        assertEquals(0, waiters("dl:2"), "nothing queued");
        first.unlock();
        assertTrue(b.get(10, TimeUnit.SECONDS), "the other thread goes on once this one lets go");
    }
}
