package io.flock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import org.junit.jupiter.api.Test;

/**
 * The seam the README's Jedis, Lettuce and Spring one-liners plug into. Those jars are not on the build
 * machines, so these tests plug in connections of our own that behave as those libraries do at the seam:
 * error replies as their own exception type carrying the server's message (JedisDataException,
 * RedisCommandExecutionException), or wrapped once more with another message (Spring's translation).
 */
class AdapterTest extends ServerTest {

    /** The built-in connection with its error replies rethrown by {@code translate}. */
    FlockClient clientThrowing(Function<RedisError, RuntimeException> translate) {
        ConnectionFactory factory = () -> {
            RespConnection resp = server.connect();
            return FlockConnection.of(args -> {
                try {
                    return resp.call(args);
                } catch (RedisError e) {
                    throw translate.apply(e);
                }
            }, resp);
        };
        return opened(new FlockClient(factory));
    }

    /** The built-in connection with its commands rewritten by {@code args} and its replies by {@code reply}. */
    FlockClient clientRewriting(java.util.function.UnaryOperator<byte[][]> args,
            java.util.function.UnaryOperator<Object> reply) {
        ConnectionFactory factory = () -> {
            RespConnection resp = server.connect();
            return FlockConnection.of(a -> reply.apply(resp.call(args.apply(a))), resp);
        };
        return opened(new FlockClient(factory));
    }

    /** Jedis gives status replies as bytes: a session wait's WAITING is understood so too. */
    @Test
    void aStatusReplyAsBytesIsUnderstood() throws Exception {
        FlockClient client = clientRewriting(a -> a,
                r -> r instanceof String ? ((String) r).getBytes(java.nio.charset.StandardCharsets.UTF_8) : r);
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        CompletableFuture<Boolean> waiter = onThread(() -> {
            boolean got = lock.tryLock(10, TimeUnit.SECONDS);
            lock.unlock();
            return got;
        });
        TestServer.await("the waiter queues", () -> waiters("k") == 1);
        lock.unlock();
        assertTrue(waiter.get(10, TimeUnit.SECONDS));
    }

    /**
     * The client's own deadline: here the server is asked to wait a minute (the adapter stretches WAIT), so
     * only the local deadline (the wait plus a margin) ends the wait: FLOCK.CANCEL, then the cancelled event.
     */
    @Test
    void theLocalDeadlineCancelsAWaitTheServerDidNotEnd() throws Exception {
        FlockClient client = clientRewriting(a -> {
            for (int i = 0; i + 1 < a.length; i++) {
                if (new String(a[i], java.nio.charset.StandardCharsets.UTF_8).equals("WAIT")) {
                    a[i + 1] = FlockClient.bytes("60000");
                }
            }
            return a;
        }, r -> r);
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        CompletableFuture<Boolean> waiter = onThread(() -> lock.tryLock(100, TimeUnit.MILLISECONDS));
        TestServer.await("the waiter queues", () -> waiters("k") == 1);
        assertEquals(false, waiter.get(FlockLock.LOCAL_DEADLINE_MARGIN_MS + 8_000, TimeUnit.MILLISECONDS));
        assertEquals(0, waiters("k"));
        lock.unlock();
        assertNull(info("k"));
    }

    /** A module without sessions (an older FLOCK): the client falls back to blocking waits. */
    @Test
    void aServerWithoutSessionsGetsBlockingWaits() throws Exception {
        ConnectionFactory factory = () -> {
            RespConnection resp = server.connect();
            return FlockConnection.of(a -> {
                if (new String(a[0], java.nio.charset.StandardCharsets.UTF_8).equalsIgnoreCase("FLOCK.SESSION")) {
                    throw new RedisError("ERR unknown command 'FLOCK.SESSION', with args beginning with: ");
                }
                return resp.call(a);
            }, resp);
        };
        FlockClient client = opened(new FlockClient(factory));
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        assertEquals(false, client.usesSessions());
        CompletableFuture<Boolean> waiter = onThread(() -> {
            boolean got = lock.tryLock(10, TimeUnit.SECONDS);
            lock.unlock();
            return got;
        });
        TestServer.await("the waiter queues", () -> waiters("k") == 1);
        lock.unlock();
        assertTrue(waiter.get(10, TimeUnit.SECONDS));
    }

    @Test
    void aDriverStyleErrorIsUnderstood() {
        lockWorksThrough(clientThrowing(e -> new IllegalStateException(e.getMessage())));
    }

    @Test
    void aWrappedErrorIsUnderstood() {
        lockWorksThrough(clientThrowing(e -> new RuntimeException("Error in execution", new IllegalStateException(e.getMessage()))));
    }

    private void lockWorksThrough(FlockClient client) {
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        assertTrue(lock.isHeldByCurrentThread());
        lock.unlock();
        assertNull(info("k"));
        assertThrows(IllegalMonitorStateException.class, lock::unlock);
        FlockMultiLock multi = client.getMultiLock("k", "l");
        multi.lock();
        multi.unlock();
        assertNull(info("l"));
        assertThrows(IllegalMonitorStateException.class, multi::unlock, "RELEASEALL's NOTOWNER understood");
    }

    @Test
    void anInterruptCancelsAWaitThroughAnAdapter() throws Exception {
        FlockClient client = clientThrowing(e -> new IllegalStateException(e.getMessage()));
        FlockLock lock = client.getFairLock("k");
        lock.lock();
        CompletableFuture<Thread> started = new CompletableFuture<>();
        CompletableFuture<Void> done = new CompletableFuture<>();
        spawn(() -> {
            started.complete(Thread.currentThread());
            try {
                lock.lockInterruptibly();
                done.complete(null);
            } catch (Throwable e) {
                done.completeExceptionally(e);
            }
        });
        TestServer.await("the waiter queues", () -> waiters("k") == 1);
        started.get().interrupt();
        ExecutionException failed = assertThrows(ExecutionException.class, () -> done.get(10, TimeUnit.SECONDS));
        assertTrue(failed.getCause() instanceof InterruptedException);
        assertEquals(0, waiters("k"));
        lock.unlock();
    }
}
