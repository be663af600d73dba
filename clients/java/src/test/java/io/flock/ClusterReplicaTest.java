package io.flock;

import static io.flock.TestServer.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;

/** The client on a 3-master Redis Cluster with a replica per master: durable grants and a CLUSTER FAILOVER. */
@Order(1) // among the longest classes: started first (build.sh orders classes so), not left to end the run
class ClusterReplicaTest {
    private static TestCluster cluster;
    private final List<FlockClient> clients = new ArrayList<>();
    private final ExecutorService threads = Executors.newCachedThreadPool();

    @BeforeAll
    static void startCluster() throws IOException {
        cluster = new TestCluster(true);
    }

    @AfterAll
    static void stopCluster() throws IOException {
        cluster.close();
    }

    @AfterEach
    void closeAll() {
        threads.shutdownNow();
        clients.forEach(FlockClient::close);
    }

    /**
     * A client whose grants need {@code durableReplicas} acknowledgements: 1 waits up to 10 s for its replica's
     * (it returns once it comes), 2 of the 1 there is fails after 1 s, long enough for that one's to count on a
     * busy machine (DurableTest saw 300 ms too short).
     */
    private FlockClient client(int durableReplicas) {
        FlockClient client = FlockClient.create(cluster.config().setDurableReplicas(durableReplicas)
                .setDurableTimeout(durableReplicas > 1 ? 1_000 : 10_000));
        clients.add(client);
        return client;
    }

    /** {@code args} on {@code server}, after READONLY (so that a replica answers for its keys, not MOVED). */
    private static Object call(TestServer server, String... args) {
        try (RespConnection c = server.connect()) {
            c.call("READONLY");
            return c.call(args);
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    private static boolean isMaster(TestServer server) {
        return TestCluster.replication(server).contains("role:master");
    }

    /** Shard {@code i}'s master now, and its replica. */
    private static TestServer master(int i) {
        return isMaster(cluster.nodes.get(i)) ? cluster.nodes.get(i) : cluster.replicas.get(i);
    }

    private static TestServer replica(int i) {
        return master(i) == cluster.nodes.get(i) ? cluster.replicas.get(i) : cluster.nodes.get(i);
    }

    private static long field(TestServer server, String key, String name) {
        List<?> info = (List<?>) call(server, "FLOCK.INFO", key);
        assertNotNull(info, "FLOCK.INFO " + key + " on " + server.port);
        for (int i = 0; i + 1 < info.size(); i += 2) {
            if (TestCluster.text(info.get(i)).equals(name)) {
                return (Long) info.get(i + 1);
            }
        }
        throw new AssertionError("no " + name + " in FLOCK.INFO");
    }

    @Test
    void aDurableGrantWaitsForTheReplicaOfItsKeysNodeOnEachNode() throws IOException {
        FlockClient one = client(1);
        for (int i = 0; i < 3; i++) {
            String key = cluster.keyOn(i, "durable");
            Long token = one.getFairLock(key).tryLockAndGetToken();
            assertNotNull(token, key);
            assertEquals(token, field(replica(i), key, "token"), "the replica of node " + i + " has " + key);
        }
        String key = cluster.keyOn(1, "two");
        LockNotDurableException e = assertThrows(LockNotDurableException.class,
                () -> client(2).getFairLock(key).tryLock());
        assertEquals(1, e.getReplicasReached());
        assertNull(call(master(1), "FLOCK.INFO", key), "the hold was given back");
    }

    @Test
    void aWaiterWhoseNodeFailsOverIsGrantedByTheNewMaster() throws Exception {
        String key = cluster.keyOn(1, "failover");
        TestServer old = master(1);
        TestServer promoted = replica(1);
        FlockLock held = client(0).getFairLock(key);
        held.lock(2, TimeUnit.SECONDS);
        await("the grant on the replica", () -> call(promoted, "FLOCK.INFO", key) != null);
        FlockClient waiter = client(0);
        Future<Long> waited = threads.submit(() -> waiter.getFairLock(key).tryLockAndGetToken(20, 5, TimeUnit.SECONDS));
        await("the wait to queue", () -> field(old, key, "waiters") == 1);
        call(promoted, "CLUSTER", "FAILOVER");
        await("the replica to take over", Duration.ofSeconds(15), () -> isMaster(promoted) && !isMaster(old));
        try {
            held.unlock(); // to the new master (MOVED), where the grant was replicated
        } catch (IllegalMonitorStateException demoted) {
            // Valkey 9.1 pushes the holder's grant lost ("demoted") when its node becomes a replica: the client
            // forgets it and the new master ends it with its 2 s lease
        }
        Long token = waited.get(15, TimeUnit.SECONDS);
        assertNotNull(token, "granted");
        assertEquals(token, field(promoted, key, "token"), "by the new master");
    }
}
