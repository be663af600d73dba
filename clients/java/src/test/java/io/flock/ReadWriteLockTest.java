package io.flock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** getReadWriteLock: readers share, writers exclude, one FIFO queue, a writer may read, a reader cannot upgrade. */
class ReadWriteLockTest extends ServerTest {

    @Test
    void readersShare() throws Exception {
        FlockReadWriteLock rw = client().getReadWriteLock("k");
        rw.readLock().lock();
        FlockLock otherClientsRead = client().getReadWriteLock("k").readLock();
        Holder other = new Holder(otherClientsRead);
        other.token();
        assertEquals("shared", mode("k"));
        assertEquals(2, holderCount("k"));
        assertTrue(rw.readLock().isHeldByCurrentThread());
        assertEquals(1, rw.readLock().getHoldCount());
        rw.readLock().unlock();
        assertEquals(1, holderCount("k"));
        assertFalse(rw.readLock().isHeldByCurrentThread());
        other.unlock();
        assertNull(info("k"));
    }

    @Test
    void aQueuedWriterBlocksLaterReaders() throws Exception {
        FlockReadWriteLock rw = client().getReadWriteLock("k");
        rw.readLock().lock();
        Holder writer = new Holder(rw.writeLock());
        TestServer.await("the writer queues", () -> waiters("k") == 1);
        assertFalse(onThread(() -> rw.readLock().tryLock()).get(10, TimeUnit.SECONDS),
                "a reader's try does not pass the waiting writer although only readers hold the key");
        Holder laterReader = new Holder(rw.readLock());
        TestServer.await("the later reader queues behind the writer", () -> waiters("k") == 2);
        rw.readLock().unlock();
        long writeToken = writer.token();
        assertEquals("exclusive", mode("k"));
        assertFalse(laterReader.isGranted());
        writer.unlock();
        assertTrue(laterReader.token() > writeToken, "granted after the writer, in queue order");
        assertEquals("shared", mode("k"));
        laterReader.unlock();
    }

    @Test
    void theWriterIsGrantedWhenTheLastReaderLeaves() throws Exception {
        FlockReadWriteLock rw = client().getReadWriteLock("k");
        Holder first = new Holder(rw.readLock());
        Holder second = new Holder(rw.readLock());
        first.token();
        second.token();
        Holder writer = new Holder(rw.writeLock());
        TestServer.await("the writer queues", () -> waiters("k") == 1);
        first.unlock();
        assertEquals(1, waiters("k"), "one reader still holds it: the writer waits on");
        assertFalse(writer.isGranted());
        second.unlock();
        writer.token();
        assertEquals("exclusive", mode("k"));
        writer.unlock();
        assertNull(info("k"));
    }

    @Test
    void aWriterMayAlsoRead() {
        FlockReadWriteLock rw = client().getReadWriteLock("k");
        long token = rw.writeLock().lockAndGetToken();
        assertEquals(token, rw.readLock().lockAndGetToken(), "a read by the writer is one more hold on its grant");
        assertEquals(2, holds("k"));
        assertEquals("exclusive", mode("k"));
        rw.readLock().unlock();
        assertTrue(rw.writeLock().isHeldByCurrentThread());
        rw.writeLock().unlock();
        assertNull(info("k"));
    }

    @Test
    void aReaderCannotUpgrade() {
        FlockReadWriteLock rw = client().getReadWriteLock("k");
        long token = rw.readLock().lockAndGetToken();
        UpgradeException refused = assertThrows(UpgradeException.class, () -> rw.writeLock().lock());
        assertEquals("UPGRADE", refused.code());
        assertThrows(UpgradeException.class, () -> rw.writeLock().tryLock());
        assertEquals(1, holds("k"), "nothing changed");
        assertEquals(0, waiters("k"));
        assertEquals("shared", mode("k"));
        assertEquals(token, rw.readLock().getToken());
        rw.readLock().unlock();
        assertTrue(rw.writeLock().tryLock(), "after the read holds are gone the write lock is free");
        rw.writeLock().unlock();
    }

    @Test
    void theSessionKeepsAReadLockAlive() throws Exception {
        FlockLock read = sessionClient(WATCHDOG_MS).getReadWriteLock("k").readLock();
        keptAlive(read.client, "k", read, read::lock, read::unlock);
    }

    @Test
    void theWatchdogKeepsAReadLeaseAliveWithoutSessions() throws Exception {
        FlockLock read = watchdogClient(WATCHDOG_MS).getReadWriteLock("k").readLock();
        keptAlive(read.client, "k", read, read::lock, read::unlock);
    }

    @Test
    void forceUnlockRemovesEveryReader() throws Exception {
        FlockReadWriteLock rw = client().getReadWriteLock("k");
        rw.readLock().lock();
        Holder other = new Holder(client().getReadWriteLock("k").readLock());
        other.token();
        assertTrue(rw.writeLock().forceUnlock());
        assertNull(info("k"));
        assertThrows(IllegalMonitorStateException.class, rw.readLock()::unlock);
        assertThrows(Exception.class, other::unlock, "its unlock finds the hold gone");
    }
}
