package io.flock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** FlockConfig's database, timeouts and address against a plain server. */
class ConfigTest extends ServerTest {

    private FlockConfig config() {
        return new FlockConfig().setAddress("redis://127.0.0.1:" + server.port);
    }

    private boolean exists(int database, String key) throws Exception {
        admin.call("SELECT", Integer.toString(database));
        return (Long) admin.call("EXISTS", key) == 1;
    }

    @Test
    void aLockInDatabase3IsKeptThereAndWaitedForThere() throws Exception {
        FlockLock inDb3 = client(config().setDatabase(3)).getFairLock("k");
        assertTrue(inDb3.tryLock());
        assertTrue(exists(3, "k"), "the key is in database 3");
        assertFalse(exists(0, "k"), "not in database 0");
        assertTrue(client(config()).getFairLock("k").tryLock(), "the same name in database 0 is another lock");
        FlockClient waiter = client(config().setDatabase(3));
        CompletableFuture<Boolean> waited = onThread(() -> waiter.getFairLock("k").tryLock(10, 10,
                TimeUnit.SECONDS));
        FlockLock inspectDb3 = client(config().setDatabase(3)).getFairLock("k");
        TestServer.await("the waiter queues in database 3", () -> (Long) inspectDb3.info().get("waiters") == 1);
        inDb3.unlock();
        assertTrue(waited.get(10, TimeUnit.SECONDS), "granted through its session in database 3");
    }

    @Test
    void theLockDelayGoesWithEveryAcquireAndKeepsTheLockClosedAfterALeaseRunsOut() throws Exception {
        assertThrows(IllegalArgumentException.class, () -> config().setLockDelay(java.time.Duration.ofSeconds(61)));
        FlockLock delayed = client(config().setLockDelay(java.time.Duration.ofMillis(400))).getFairLock("delayed");
        // A long lease, cut short once the holder is read: a loaded machine cannot let it run out before.
        assertTrue(delayed.tryLock(0, 60, TimeUnit.SECONDS));
        @SuppressWarnings("unchecked")
        List<java.util.Map<String, Object>> holders = (List<java.util.Map<String, Object>>) delayed.info().get("holders");
        assertEquals(400L, holders.get(0).get("lock-delay-ms"));
        admin.call("FLOCK.RENEW", "delayed", owner("delayed"), "100");
        TestServer.await("the lease to end into its delay", () -> {
            java.util.Map<String, Object> info = delayed.info();
            return info != null && (Long) info.get("delayed-ms") > 0;
        });
        assertFalse(client(config()).getFairLock("delayed").tryLock(), "closed during the delay");
    }

    @Test
    void aBlockingWaitIsNotCutByTheCommandTimeout() throws Exception {
        assertTrue(client(config()).getFairLock("k").tryLock());
        // without sessions a wait is one blocking FLOCK.ACQUIRE ... WAIT: longer than the command timeout
        FlockClient blocking = opened(new FlockClient(RespConnection.factory(config().setTimeout(100)),
                FlockClient.DEFAULT_WATCHDOG_TIMEOUT_MS, false));
        long start = System.nanoTime();
        assertFalse(blocking.getFairLock("k").tryLock(600, TimeUnit.MILLISECONDS), "it waited and timed out");
        // Far past the 100 ms command timeout. Not "at least 600 ms" of this clock: the server counts the WAIT
        // on its own clock, in whole milliseconds from its reading of the time for the command, so the wait can
        // end before 600 ms of this clock have passed (CI: once on Valkey 9.1).
        assertTrue(System.nanoTime() - start >= TimeUnit.MILLISECONDS.toNanos(500), "it waited its time");
    }

    @Test
    void theSessionsInboxReadIsNotCutByTheCommandTimeout() throws Exception {
        assertTrue(client(config()).getFairLock("k").tryLock());
        FlockClient client = client(config().setTimeout(100));
        assertFalse(client.getFairLock("k").tryLock(600, TimeUnit.MILLISECONDS));
        assertEquals(1, client.session().opened(), "its FLOCK.INBOX blocked past the command timeout, unbroken");
    }

    @Test
    void aReplyThatDoesNotComeEndsAtTheCommandTimeout() throws Exception {
        try (ServerSocket silent = new ServerSocket(0, 50, java.net.InetAddress.getLoopbackAddress())) {
            RespConnection c = opened(new RespConnection(new FlockConfig()
                    .setAddress("redis://127.0.0.1:" + silent.getLocalPort()).setTimeout(200)));
            long start = System.nanoTime();
            assertThrows(SocketTimeoutException.class, () -> c.call("PING"));
            assertTrue(System.nanoTime() - start < TimeUnit.SECONDS.toNanos(2), "ended near 200 ms");
        }
    }

    @Test
    void aConnectThatIsNotAnsweredEndsAtTheConnectTimeout() throws Exception {
        // A listener that never accepts, its backlog full: the kernel drops further SYNs, so a connect hangs.
        try (ServerSocket full = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            List<Socket> queued = new ArrayList<>();
            try {
                InetSocketAddress address = new InetSocketAddress(full.getInetAddress(), full.getLocalPort());
                for (boolean hangs = false; !hangs; ) {
                    assertTrue(queued.size() < 64, "the kernel kept accepting connections past the backlog");
                    Socket s = new Socket();
                    queued.add(s);
                    try {
                        s.connect(address, 200);
                    } catch (SocketTimeoutException e) {
                        hangs = true;
                    }
                }
                FlockClient client = client(new FlockConfig().setAddress("redis://127.0.0.1:" + full.getLocalPort())
                        .setConnectTimeout(300));
                long start = System.nanoTime();
                UncheckedIOException e = assertThrows(UncheckedIOException.class,
                        () -> client.getFairLock("k").tryLock());
                assertInstanceOf(SocketTimeoutException.class, e.getCause());
                assertTrue(System.nanoTime() - start < TimeUnit.SECONDS.toNanos(3), "ended near 300 ms");
            } finally {
                for (Socket s : queued) {
                    s.close();
                }
            }
        }
    }

    @Test
    void theAddressIsRedisOrRedissHostAndPort() {
        assertEquals("rediss://[::1]:6379", new FlockConfig().setAddress("rediss://[::1]").address());
        assertEquals("redis://db.example:7000", new FlockConfig().setAddress("redis://db.example:7000/").address());
        assertThrows(IllegalArgumentException.class, () -> new FlockConfig().setAddress("http://h:1"));
        assertThrows(IllegalArgumentException.class, () -> new FlockConfig().setAddress("redis://u:p@h:1"));
        assertThrows(IllegalArgumentException.class, () -> new FlockConfig().setAddress("redis://h:1/3"));
    }
}
