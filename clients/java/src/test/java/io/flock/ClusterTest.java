package io.flock;

import static io.flock.TestServer.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The client on a 3-master Redis Cluster (FlockConfig.useClusterServers), started by the tests. */
class ClusterTest {
    private static TestCluster cluster;
    private final List<FlockClient> clients = new ArrayList<>();
    private final ExecutorService threads = Executors.newCachedThreadPool();

    @BeforeAll
    static void startCluster() throws IOException {
        cluster = new TestCluster();
    }

    @AfterAll
    static void stopCluster() throws IOException {
        cluster.close();
    }

    @AfterEach
    void closeAll() throws IOException {
        threads.shutdownNow();
        clients.forEach(FlockClient::close);
        for (RespConnection admin : cluster.admins) {
            admin.call("FLUSHALL");
        }
    }

    private FlockClient client() {
        return client(cluster.config());
    }

    private FlockClient client(FlockConfig config) {
        FlockClient client = FlockClient.create(config);
        clients.add(client);
        return client;
    }

    private static Object info(String key) throws IOException {
        return cluster.adminOf(key).call("FLOCK.INFO", key);
    }

    private static long waiters(String key) throws IOException {
        Object info = info(key);
        if (info == null) {
            return 0;
        }
        List<?> fields = (List<?>) info;
        return (Long) fields.get(fields.indexOf(fields.stream()
                .filter(f -> "waiters".equals(TestCluster.text(f))).findFirst().orElseThrow()) + 1);
    }

    private static Object call(RespConnection node, String... args) {
        try {
            return node.call(args);
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    private static long count(String key) {
        try {
            return waiters(key);
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    @Test
    void theSlotOfAKeyIsTheOneClusterKeyslotSays() throws IOException {
        List<String> keys = List.of("", "a", "orders:42", "{order:42}:a", "{order:42}:b", "x{}y", "{}{a}", "a{b}{c}",
                "{{x}}", "}{", "{a", "ключ", "{tag}" + "x".repeat(300));
        for (String key : keys) {
            assertEquals((long) (Long) cluster.admins.get(0).call("CLUSTER", "KEYSLOT", key),
                    Router.slot(key.getBytes(StandardCharsets.UTF_8)), "the slot of '" + key + "'");
        }
        assertEquals(Router.slot(FlockClient.bytes("{order:42}:a")), Router.slot(FlockClient.bytes("order:42")));
    }

    @Test
    void waitsOnOneLockAreGrantedInTheirOrder() throws Exception {
        String key = cluster.keyOn(1, "fifo");
        FlockLock held = client().getFairLock(key);
        held.lock();
        FlockClient waiter = client();
        List<Integer> order = Collections.synchronizedList(new ArrayList<>());
        List<Future<?>> waits = new ArrayList<>();
        for (int i = 0; i < 4; i++) {
            int n = i;
            waits.add(threads.submit(() -> {
                FlockLock lock = waiter.getFairLock(key);
                lock.lock();
                order.add(n);
                lock.unlock();
                return null;
            }));
            await("waiter " + n + " queued on the key's node", () -> count(key) == n + 1);
        }
        held.unlock();
        for (Future<?> wait : waits) {
            wait.get(10, TimeUnit.SECONDS);
        }
        assertEquals(List.of(0, 1, 2, 3), order);
    }

    @Test
    void waitsOnEveryNodeAtOnceGoThroughASessionPerNode() throws Exception {
        FlockClient holder = client();
        FlockClient waiter = client();
        List<FlockLock> held = new ArrayList<>();
        List<Future<Long>> waits = new ArrayList<>();
        for (int node = 0; node < 3; node++) {
            String key = cluster.keyOn(node, "each");
            FlockLock lock = holder.getFairLock(key);
            lock.lock();
            held.add(lock);
            waits.add(threads.submit(() -> waiter.getFairLock(key).tryLockAndGetToken(10, 5, TimeUnit.SECONDS)));
            await("the wait queued on node " + node, () -> count(key) == 1);
        }
        for (RespConnection node : cluster.admins) { // the holder's lock() opened one too
            await("two sessions on each node", () -> TestCluster.text(call(node, "INFO", "flock"))
                    .contains("flock_sessions:2"));
        }
        assertEquals(3, waiter.router.nodes().size());
        for (Node node : waiter.router.nodes()) {
            assertEquals(1, node.session.opened(), "one session on " + node.address);
        }
        for (FlockLock lock : held) {
            threads.submit(() -> {
                lock.forceUnlock();
                return null;
            }).get();
        }
        for (Future<Long> wait : waits) {
            assertNotNull(wait.get(10, TimeUnit.SECONDS), "granted");
        }
    }

    @Test
    void hashTaggedKeysLiveOnOneNode() throws IOException {
        FlockClient client = client();
        FlockLock a = client.getFairLock("{order:42}:a");
        FlockLock b = client.getFairLock("{order:42}:b");
        assertTrue(a.tryLock());
        assertTrue(b.tryLock());
        RespConnection node = cluster.adminOf("order:42");
        assertNotNull(node.call("FLOCK.INFO", "{order:42}:a"), "held on the tag's node");
        assertNotNull(node.call("FLOCK.INFO", "{order:42}:b"), "held on the tag's node");
        a.unlock();
        b.unlock();
        assertNull(node.call("FLOCK.INFO", "{order:42}:a"));
    }

    @Test
    void aMultiLockOfOneHashTagWaitsAndIsGrantedOnTheTagsNode() throws Exception {
        String from = "{account:42}:from";
        String to = "{account:42}:to";
        FlockLock held = client().getFairLock(to);
        held.lock();
        FlockMultiLock multi = client().getMultiLock(from, to);
        Future<List<Long>> waited = threads.submit(() -> {
            List<Long> tokens = multi.lockAndGetTokens();
            multi.unlock();
            return tokens;
        });
        await("the multi-lock queues at both keys on the tag's node", () -> count(from) == 1 && count(to) == 1);
        held.unlock();
        assertEquals(2, waited.get(10, TimeUnit.SECONDS).size());
        RespConnection node = cluster.adminOf("account:42");
        await("its unlock freed both keys on the tag's node", () -> call(node, "FLOCK.INFO", from) == null
                && call(node, "FLOCK.INFO", to) == null);
    }

    @Test
    void aMultiLockOfKeysInTwoSlotsIsRefusedNamingHashTags() throws IOException {
        String first = cluster.keyOn(0, "account");
        String second = cluster.keyOn(1, "account");
        IllegalArgumentException refused = assertThrows(IllegalArgumentException.class,
                () -> client().getMultiLock(first, second).tryLock());
        assertTrue(refused.getMessage().contains("hash tag"), refused.getMessage());
        assertTrue(refused.getMessage().contains("'" + first + "', '" + second + "'"), refused.getMessage());
        assertEquals("CROSSSLOT", RedisError.codeOf(refused.getCause()));
        assertNull(info(first), "nothing taken");
        assertNull(info(second), "nothing taken");
    }

    /**
     * A session grant's lease left on the key's node rises 4 times (the node moves it to its session's deadline each
     * time it comes due, at most a session timeout apart), so it lived there for longer than its session's timeout,
     * held with its token all along. A 1.5 s session, so that each rise comes well within the 10 s of each wait.
     */
    @Test
    void aSessionGrantLivesOnTheKeysNode() throws IOException {
        FlockClient client = client(cluster.config().setSessionTimeout(java.time.Duration.ofMillis(1500)));
        String key = cluster.keyOn(2, "watchdog");
        FlockLock lock = client.getFairLock(key);
        long token = lock.lockAndGetToken();
        long[] last = {(Long) lock.info().get("ttl-ms")};
        for (int renewals = 0; renewals < 4; renewals++) {
            await("the lease rises on the key's node", () -> {
                Map<String, Object> info = lock.info();
                assertNotNull(info, "still held: renewed on its node");
                assertEquals(token, info.get("token"));
                long ttl = (Long) info.get("ttl-ms");
                boolean rose = ttl > last[0];
                last[0] = ttl;
                return rose;
            });
        }
        assertFalse(lock.isLeaseLost());
        lock.unlock();
        assertNull(info(key));
    }

    @Test
    void aForceReleaseOnTheKeysNodeIsPushedAsALoss() throws Exception {
        FlockClient client = client();
        CompletableFuture<String> reported = new CompletableFuture<>();
        client.setLeaseLostListener((name, thread, token, reason) -> reported.complete(name + " " + reason));
        String key = cluster.keyOn(0, "forced");
        FlockLock lock = client.getFairLock(key);
        lock.lock();
        String other = cluster.keyOn(1, "forced"); // a wait elsewhere: the session per node keeps them apart
        FlockLock elsewhere = client.getFairLock(other);
        elsewhere.lock();
        assertEquals(1L, cluster.adminOf(key).call("FLOCK.FORCERELEASE", key));
        assertEquals(key + " forcereleased", reported.get(10, TimeUnit.SECONDS));
        assertTrue(lock.isLeaseLost());
        assertFalse(elsewhere.isLeaseLost());
        elsewhere.unlock();
    }

    @Test
    void aHeldLockFollowsItsMigratedSlotAndIsReleasedOnTheNewNode() throws Exception {
        FlockClient client = client();
        List<String> lost = Collections.synchronizedList(new ArrayList<>());
        client.setLeaseLostListener((name, thread, token, reason) -> lost.add(name + " " + reason));
        String key = cluster.keyOn(0, "migrated");
        FlockLock lock = client.getFairLock(key);
        long token = lock.lockAndGetToken();
        cluster.migrate(key, 1);
        assertEquals(1, cluster.indexOf(key));
        assertNotNull(cluster.admins.get(1).call("FLOCK.INFO", key), "the grant went with its key");
        await("the grant is watched from the new node's session", () -> client.rewatched.get() == 1);
        assertFalse(lock.isLeaseLost());
        assertEquals(List.of(), lost);
        assertEquals(token, lock.getToken());
        assertTrue(lock.isHeldByCurrentThread());
        lock.unlock();
        assertNull(cluster.admins.get(1).call("FLOCK.INFO", key), "the release reached the new node");
        assertEquals(List.of(), lost);
        cluster.migrate(key, 0); // back, for the other tests' keys
    }
}
