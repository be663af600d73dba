package io.flock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.IOException;
import java.io.UncheckedIOException;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** A command whose reply is lost is resent with the same request ID on a fresh connection, and applies once. */
class RequestIdTest extends ServerTest {
    DroppingProxy proxy;
    FlockLock lock;

    @BeforeEach
    void proxied() throws IOException {
        proxy = opened(new DroppingProxy(server.port));
        lock = opened(new FlockClient(RespConnection.factory("127.0.0.1", proxy.port()))).getFairLock("k");
    }

    @Test
    void aResentReleaseReleasesOnce() {
        lock.lock();
        lock.lock();
        assertEquals(2, holds("k"));
        proxy.dropRepliesTo("FLOCK.RELEASE", 1);
        lock.unlock();
        assertEquals(1, proxy.dropped.get());
        assertEquals(1, holds("k"), "the resend answered the first reply instead of releasing again");
        lock.unlock();
        assertEquals(null, info("k"));
    }

    @Test
    void aResentAcquireAddsNoHold() {
        proxy.dropRepliesTo("FLOCK.ACQUIRE", 1);
        long token = lock.lockAndGetToken();
        assertEquals(1, proxy.dropped.get());
        assertEquals(1, holds("k"));
        assertEquals(token, (Long) info("k").get("token"));
        lock.unlock();
        assertEquals(null, info("k"));
    }

    @Test
    void aResentRenewalKeepsTheLease() throws Exception {
        FlockClient client = opened(new FlockClient(RespConnection.factory("127.0.0.1", proxy.port()), 600));
        FlockLock renewed = client.getFairLock("k");
        renewed.lock();
        proxy.dropRepliesTo("FLOCK.RENEW", 1);
        TestServer.await("a renewal's reply is lost", () -> proxy.dropped.get() == 1);
        awaitRenewals("k", 1);
        assertEquals(false, renewed.isLeaseLost());
        renewed.unlock();
    }

    @Test
    void aResentSharedReleaseReleasesOnce() {
        FlockLock read = opened(new FlockClient(RespConnection.factory("127.0.0.1", proxy.port())))
                .getReadWriteLock("k").readLock();
        read.lock();
        read.lock();
        proxy.dropRepliesTo("FLOCK.RELEASE", 1);
        read.unlock();
        assertEquals(1, proxy.dropped.get());
        assertEquals(1, holds("k"), "the resend answered the first reply instead of releasing again");
        assertEquals("shared", mode("k"));
        read.unlock();
        assertEquals(null, info("k"));
    }

    @Test
    void resendsAreLimited() {
        lock.lock();
        proxy.dropRepliesTo("FLOCK.RELEASE", FlockClient.RESENDS + 1);
        assertThrows(UncheckedIOException.class, lock::unlock);
        assertEquals(FlockClient.RESENDS + 1, proxy.dropped.get());
        assertEquals(0, holds("k"), "applied once, by the first send");
    }
}
