package io.flock;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * {@code fenced(...)}: a command run through FLOCK.FENCED with the grant's token, refused STALE (nothing run, the
 * lock lost) once the grant ended. Most holders here have no session and a fixed lease, so that nothing tells
 * their client of a FLOCK.FORCERELEASE from another connection: the server's refusal is how it learns.
 */
class FencedTest extends ServerTest {
    /** The FLOCK.FENCED commands {@link #unwatchedClient()}'s connections sent. */
    private final AtomicInteger fencedSent = new AtomicInteger();

    /** A client without sessions whose connections count the FLOCK.FENCED they send. */
    private FlockClient unwatchedClient() {
        ConnectionFactory direct = server.factory();
        ConnectionFactory counting = () -> {
            FlockConnection conn = direct.connect();
            return FlockConnection.of(args -> {
                if ("FLOCK.FENCED".equals(FlockLock.text(args[0]))) {
                    fencedSent.incrementAndGet();
                }
                return conn.call(args);
            }, conn);
        };
        return opened(new FlockClient(counting, 30_000, false));
    }

    private Object get(String key) throws IOException {
        Object value = admin.call("GET", key);
        return value == null ? null : new String((byte[]) value, StandardCharsets.UTF_8);
    }

    @Test
    void aWriteAndAReadRunThroughFencedWhileTheLockIsHeld() throws IOException {
        FlockLock lock = unwatchedClient().getFairLock("{k}:lock");
        lock.lock(30, TimeUnit.SECONDS);
        assertEquals("OK", lock.fenced("SET", "{k}:row", "held"));
        assertArrayEquals("held".getBytes(StandardCharsets.UTF_8), (byte[]) lock.fenced("GET", "{k}:row"));
        assertEquals(1L, lock.fenced("HSET", "{k}:hash".getBytes(StandardCharsets.UTF_8), "n", 42));
        assertEquals("held", get("{k}:row"));
        assertEquals(3, fencedSent.get());
        assertFalse(lock.isLeaseLost());
        lock.unlock();
        assertNull(info("{k}:lock"));
    }

    @Test
    void theCommandsOwnErrorPassesAsItCameAndLosesNothing() throws IOException {
        FlockLock lock = unwatchedClient().getFairLock("{k}:lock");
        lock.lock(30, TimeUnit.SECONDS);
        lock.fenced("SET", "{k}:row", "not a number");
        RuntimeException own = assertThrows(RuntimeException.class, () -> lock.fenced("INCR", "{k}:row"));
        assertEquals(RedisError.class, own.getClass(), "the command's error, not a lock error: " + own);
        assertEquals("ERR", ((RedisError) own).code(), own.getMessage());
        assertFalse(lock.isLeaseLost(), "the command's own error loses nothing");
        assertNull(lock.getLeaseLostReason());
        assertEquals("not a number", get("{k}:row"));
        lock.unlock();
        assertNull(info("{k}:lock"));
    }

    @Test
    void afterAForceReleaseFencedIsRefusedStaleTheLockIsLostAndNothingMoreIsSent() throws IOException {
        FlockClient client = unwatchedClient();
        List<String> told = new CopyOnWriteArrayList<>();
        client.setLeaseLostListener((name, thread, token, reason) -> told.add(name + " " + thread + " " + reason));
        FlockLock lock = client.getFairLock("{k}:lock");
        lock.lock(30, TimeUnit.SECONDS);
        long token = lock.getToken();
        lock.fenced("SET", "{k}:row", "held");
        assertEquals(1L, admin.call("FLOCK.FORCERELEASE", "{k}:lock"));
        assertFalse(lock.isLeaseLost(), "no session: the client was not told");

        StaleTokenException stale = assertThrows(StaleTokenException.class,
                () -> lock.fenced("SET", "{k}:row", "late"));
        assertTrue(stale.getMessage().startsWith("STALE token " + token + " "), stale.getMessage());
        assertEquals("STALE", RedisError.codeOf(stale.getCause()), String.valueOf(stale.getCause()));
        assertTrue(lock.isLeaseLost());
        assertEquals(LossReason.NOTOWNER, lock.getLeaseLostReason());
        assertEquals(List.of("{k}:lock " + Thread.currentThread().getId() + " notowner"), told);
        assertEquals(2, fencedSent.get());

        StaleTokenException known = assertThrows(StaleTokenException.class,
                () -> lock.fenced("SET", "{k}:row", "later"));
        assertTrue(known.getMessage().contains("was not sent"), known.getMessage());
        assertEquals(2, fencedSent.get(), "known lost: not sent");
        assertEquals("held", get("{k}:row"), "neither late write ran");
        assertEquals(1, told.size(), "told once");

        IllegalMonitorStateException unlock = assertThrows(IllegalMonitorStateException.class, lock::unlock);
        assertTrue(unlock.getMessage().contains("STALE"), unlock.getMessage());
        assertEquals(IllegalMonitorStateException.class,
                assertThrows(IllegalMonitorStateException.class, () -> lock.fenced("GET", "{k}:row")).getClass(),
                "after the unlock the thread holds nothing: not held, not stale");
    }

    /** A client with a session is told of the force-release: fenced() then sends nothing. */
    @Test
    void aLossPushedThroughTheSessionRefusesFencedWithoutSending() throws Exception {
        FlockClient client = client();
        FlockLock lock = client.getFairLock("{k}:lock");
        lock.lock();
        lock.fenced("SET", "{k}:row", "held");
        long before = fencedCalls();
        assertEquals(1L, admin.call("FLOCK.FORCERELEASE", "{k}:lock"));
        TestServer.await("the loss is pushed", lock::isLeaseLost);
        assertEquals(LossReason.FORCERELEASED, lock.getLeaseLostReason());
        assertThrows(StaleTokenException.class, () -> lock.fenced("SET", "{k}:row", "late"));
        assertEquals(before, fencedCalls(), "nothing sent");
        assertEquals(LossReason.FORCERELEASED, lock.getLeaseLostReason(), "the reason it was lost stays");
        assertEquals("held", get("{k}:row"));
    }

    /** The server's count of FLOCK.FENCED calls, refused ones too. */
    private long fencedCalls() throws IOException {
        String stats = new String((byte[]) admin.call("INFO", "commandstats"), StandardCharsets.UTF_8);
        for (String line : stats.split("\r\n")) {
            if (line.startsWith("cmdstat_flock.fenced:")) {
                long calls = 0;
                for (String field : line.substring(line.indexOf(':') + 1).split(",")) {
                    String[] kv = field.split("=");
                    if (kv[0].equals("calls") || kv[0].equals("rejected_calls")) {
                        calls += Long.parseLong(kv[1]);
                    }
                }
                return calls;
            }
        }
        return 0;
    }

    @Test
    void fencedOnALockNotHeldThrowsNotHeldAndSendsNothing() throws Exception {
        FlockClient client = unwatchedClient();
        FlockLock lock = client.getFairLock("{k}:lock");
        IllegalMonitorStateException never = assertThrows(IllegalMonitorStateException.class,
                () -> lock.fenced("SET", "{k}:row", "x"));
        assertFalse(never instanceof StaleTokenException, "never held: not stale");
        lock.lock(30, TimeUnit.SECONDS);
        onOtherThread(() -> assertEquals(IllegalMonitorStateException.class,
                assertThrows(IllegalMonitorStateException.class, () -> lock.fenced("SET", "{k}:row", "x")).getClass(),
                "another thread's grant is not this one's"));
        lock.unlock();
        assertEquals(IllegalMonitorStateException.class,
                assertThrows(IllegalMonitorStateException.class, () -> lock.fenced("SET", "{k}:row", "x")).getClass());
        assertEquals(0, fencedSent.get());
        assertNull(get("{k}:row"));
        assertThrows(IllegalArgumentException.class, lock::fenced);
        assertThrows(IllegalArgumentException.class, () -> lock.fenced("SET", "{k}:row", List.of("x")));
    }

    /** FLOCK.FENCED has no request ID: a lost reply is not resent, so the command ran once. */
    @Test
    void aLostReplyIsNotResent() throws Exception {
        DroppingProxy proxy = opened(new DroppingProxy(server.port));
        FlockLock lock = opened(new FlockClient(RespConnection.factory("127.0.0.1", proxy.port()), 30_000, false))
                .getFairLock("{k}:lock");
        lock.lock(30, TimeUnit.SECONDS);
        proxy.dropRepliesTo("FLOCK.FENCED", 1);
        assertThrows(UncheckedIOException.class, () -> lock.fenced("INCR", "{k}:counter"));
        assertEquals(1, proxy.dropped.get());
        assertEquals("1", get("{k}:counter"), "run once: the client did not send it again");
        assertFalse(lock.isLeaseLost(), "a lost reply loses nothing");
        assertEquals(2L, lock.fenced("INCR", "{k}:counter"));
        lock.unlock();
    }

    @Test
    void readLocksAndSemaphoresFenceWithTheirOwnGrantsToken() throws Exception {
        FlockClient client = unwatchedClient();
        FlockReadWriteLock rw = client.getReadWriteLock("{k}:rw");
        rw.readLock().lock(30, TimeUnit.SECONDS);
        assertEquals("OK", rw.readLock().fenced("SET", "{k}:row", "read"));
        onOtherThread(() -> {
            rw.readLock().lock(30, TimeUnit.SECONDS);
            assertEquals("OK", rw.readLock().fenced("SET", "{k}:row", "another reader"));
            rw.readLock().unlock();
        });
        rw.readLock().unlock();
        rw.writeLock().lock(30, TimeUnit.SECONDS);
        assertEquals("OK", rw.writeLock().fenced("SET", "{k}:row", "written"));
        rw.writeLock().unlock();

        FlockSemaphore slots = client.getSemaphore("{k}:slots", 3);
        slots.acquire(2, 30, TimeUnit.SECONDS);
        assertEquals(1L, slots.fenced("INCR", "{k}:counter"));
        assertEquals(1L, admin.call("FLOCK.FORCERELEASE", "{k}:slots"));
        assertThrows(StaleTokenException.class, () -> slots.fenced("INCR", "{k}:counter"));
        assertTrue(slots.isLeaseLost());
        assertThrows(IllegalMonitorStateException.class, slots::release);
        assertEquals("written", get("{k}:row"));
        assertEquals("1", get("{k}:counter"));
    }

    @Test
    void aMultiLockFencesWithTheTokenOfTheKeyNamed() throws Exception {
        FlockClient client = unwatchedClient();
        FlockMultiLock both = client.getMultiLock("{k}:a", "{k}:b");
        both.lock(30, TimeUnit.SECONDS);
        assertEquals("OK", both.fenced("{k}:a", "SET", "{k}:row", "a"));
        assertEquals(2L, both.fenced("{k}:b", "APPEND", "{k}:row", "b"));
        assertThrows(IllegalArgumentException.class, () -> both.fenced("{k}:c", "GET", "{k}:row"));
        assertEquals(1L, admin.call("FLOCK.FORCERELEASE", "{k}:a"));
        assertThrows(StaleTokenException.class, () -> both.fenced("{k}:a", "SET", "{k}:row", "late"));
        assertArrayEquals("ab".getBytes(StandardCharsets.UTF_8), (byte[]) both.fenced("{k}:b", "GET", "{k}:row"),
                "the other key's grant still holds");
        assertTrue(both.isLeaseLost());
        assertThrows(IllegalMonitorStateException.class, both::unlock);
        assertNull(info("{k}:b"), "the unlock released the key still held");
        assertEquals("ab", get("{k}:row"));
    }
}
