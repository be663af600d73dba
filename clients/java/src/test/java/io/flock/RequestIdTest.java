package io.flock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

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

    /** A session wait whose WAITING reply is lost: the resend takes over its own place, one grant comes. */
    @Test
    void aResentSessionWaitKeepsItsPlace() throws Exception {
        FlockLock direct = client().getFairLock("k");
        direct.lock();
        FlockLock before = client().getFairLock("k");
        ServerTest.Holder first = new Holder(before);
        TestServer.await("the first waiter queues", () -> waiters("k") == 1);
        proxy.dropRepliesTo("FLOCK.ACQUIRE", 1);
        Holder resent = new Holder(lock);
        TestServer.await("a WAITING reply is lost", () -> proxy.dropped.get() == 1);
        FlockLock after = client().getFairLock("k");
        TestServer.await("the resend queued once", () -> waiters("k") == 2);
        Holder last = new Holder(after);
        TestServer.await("the last waiter queues", () -> waiters("k") == 3);
        direct.unlock();
        long t1 = first.token();
        first.unlock();
        long t2 = resent.token();
        resent.unlock();
        long t3 = last.token();
        last.unlock();
        assertEquals(true, t1 < t2 && t2 < t3, "granted in queue order");
        TestServer.await("the lock is free", () -> info("k") == null);
    }

    @Test
    void aResentRenewalKeepsTheLease() throws Exception {
        // the watchdog renews locks taken without a session
        FlockClient client = opened(new FlockClient(RespConnection.factory("127.0.0.1", proxy.port()),
                WATCHDOG_MS, false));
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

    /**
     * A grant whose every reply was lost (a failover ended the resends) is a hold the thread does not know of:
     * its next grant, a reentry of that hold, gives it back, so that one unlock frees the lock. Before, each
     * acquire and unlock of the thread left that hold, and in the Sentinel failover test its thread kept the
     * lock from the others.
     */
    @Test
    void aGrantWhoseRepliesWereAllLostIsGivenBackByTheThreadsNextGrant() {
        proxy.dropRepliesTo("FLOCK.ACQUIRE", FlockClient.RESENDS + 1);
        assertThrows(UncheckedIOException.class, lock::tryLock);
        assertEquals(1, holds("k"), "granted by the first send, unknown to the thread");
        assertTrue(lock.tryLock(), "a reentry of that grant");
        assertEquals(1, holds("k"), "the hold the thread did not know of was given back");
        lock.unlock();
        assertEquals(null, info("k"), "one unlock frees the lock");
    }

    /**
     * A hold the thread does not know of beside its own (here added by another connection under its owner, as
     * a failover can leave one: the give-back of a durable check, a re-watch's extra hold): the unlock of the
     * thread's last hold releases it too, so the lock is free for the others. Before, the thread kept it
     * while it reentered (the Java Sentinel failover test on Valkey 9.1).
     */
    @Test
    void theUnlockOfTheThreadsLastHoldReleasesHoldsItDoesNotKnowOf() throws IOException {
        lock.lock();
        admin.call("FLOCK.ACQUIRE", "k", owner("k"), "30000");
        assertEquals(2, holds("k"));
        lock.unlock();
        assertEquals(null, info("k"), "the thread's last unlock frees the lock");
        lock.lock();
        lock.lock();
        lock.unlock();
        assertEquals(1, holds("k"), "a reentry's unlock keeps the thread's other hold");
        lock.unlock();
        assertEquals(null, info("k"));
    }
}
