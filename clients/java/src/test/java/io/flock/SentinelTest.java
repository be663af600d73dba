package io.flock;

import static io.flock.TestServer.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The client through Sentinel (FlockConfig.useSentinelServers): a master and its replica with the module and
 * three sentinels watching them (down after 1 s), started after the replica synced so that they know it at once.
 */
class SentinelTest {
    private static final String NAME = "flock";
    private static final List<TestServer> servers = new ArrayList<>();
    private static TestServer master;
    private static TestServer replica;
    private static final List<TestServer> sentinels = new ArrayList<>();
    private final List<FlockClient> clients = new ArrayList<>();
    private final ExecutorService threads = Executors.newCachedThreadPool();

    @BeforeAll
    static void start() throws IOException {
        master = started(TestServer.start());
        replica = started(TestServer.startReplicaOf(master.port));
        await("the replica to sync", () -> replication(replica).contains("master_link_status:up"));
        String conf = "sentinel monitor " + NAME + " 127.0.0.1 " + master.port + " 2\n"
                + "sentinel down-after-milliseconds " + NAME + " 1000\n"
                + "sentinel failover-timeout " + NAME + " 10000\n";
        for (int i = 0; i < 3; i++) {
            sentinels.add(started(TestServer.startSentinel(conf)));
        }
        await("the sentinels to know the replica and each other", Duration.ofSeconds(15), () -> {
            for (TestServer sentinel : sentinels) {
                List<?> fields = (List<?>) call(sentinel, "SENTINEL", "MASTER", NAME);
                if (number(fields, "num-slaves") < 1 || number(fields, "num-other-sentinels") < 2) {
                    return false;
                }
            }
            return true;
        });
    }

    @AfterAll
    static void stop() throws IOException {
        for (int i = servers.size() - 1; i >= 0; i--) {
            servers.get(i).close();
        }
    }

    @AfterEach
    void closeAll() {
        threads.shutdownNow();
        clients.forEach(FlockClient::close);
    }

    private static TestServer started(TestServer server) {
        servers.add(server);
        return server;
    }

    private static Object call(TestServer server, String... args) {
        try (RespConnection c = server.connect()) {
            return c.call(args);
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    private static String replication(TestServer server) {
        return TestCluster.text(call(server, "INFO", "replication"));
    }

    private static long number(List<?> fields, String name) {
        for (int i = 0; i + 1 < fields.size(); i += 2) {
            if (TestCluster.text(fields.get(i)).equals(name)) {
                return Long.parseLong(TestCluster.text(fields.get(i + 1)));
            }
        }
        throw new AssertionError("no " + name + " in SENTINEL MASTER");
    }

    /** The master's port as every sentinel names it now, or -1 while they disagree. */
    private static int masterPort() {
        Set<String> ports = new HashSet<>();
        for (TestServer sentinel : sentinels) {
            ports.add(TestCluster.text(((List<?>) call(sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", NAME)).get(1)));
        }
        return ports.size() == 1 ? Integer.parseInt(ports.iterator().next()) : -1;
    }

    private FlockClient client() {
        FlockConfig config = new FlockConfig();
        config.useSentinelServers().setMasterName(NAME);
        for (TestServer sentinel : sentinels) {
            config.useSentinelServers().addSentinelAddress("redis://127.0.0.1:" + sentinel.port);
        }
        FlockClient client = FlockClient.create(config);
        clients.add(client);
        return client;
    }

    private static TestServer current() {
        return masterPort() == master.port ? master : replica;
    }

    @Test
    void aLockAndAWaitGoToTheMasterTheSentinelsName() throws Exception {
        TestServer now = current();
        FlockLock held = client().getFairLock("k");
        held.lock();
        FlockClient waiter = client();
        Future<Long> waited = threads.submit(() -> waiter.getFairLock("k").tryLockAndGetToken(10, 5, TimeUnit.SECONDS));
        await("the wait queued on the master", () -> {
            Object info = call(now, "FLOCK.INFO", "k");
            return info != null && number((List<?>) info, "waiters") == 1;
        });
        held.unlock();
        long token = waited.get(10, TimeUnit.SECONDS);
        assertEquals(token, number((List<?>) call(now, "FLOCK.INFO", "k"), "token"), "granted on the master");
        threads.submit(() -> {
            waiter.getFairLock("k").unlock();
            return null;
        }).get();
        assertNull(call(now, "FLOCK.INFO", "k"));
    }

    @Test
    void afterAFailoverANewLockAndWaitWorkOnTheNewMaster() throws Exception {
        FlockClient client = client();
        FlockLock before = client.getFairLock("before");
        before.lock(); // its connections now reach the old master
        before.unlock();
        TestServer old = current();
        TestServer promoted = old == master ? replica : master;
        call(sentinels.get(0), "SENTINEL", "FAILOVER", NAME);
        await("the sentinels to name the new master", Duration.ofSeconds(15), () -> masterPort() == promoted.port);
        // Sentinel demotes the old master (closing its clients) once it has seen it a master for a while
        await("the old master to become a replica", Duration.ofSeconds(45),
                () -> replication(old).contains("role:slave") && replication(old).contains("master_link_status:up"));
        FlockLock after = client.getFairLock("after");
        long token = after.lockAndGetToken();
        assertEquals(token, number((List<?>) call(promoted, "FLOCK.INFO", "after"), "token"), "held on the new master");
        FlockClient waiter = client();
        Future<Long> waited = threads.submit(() -> waiter.getFairLock("after").tryLockAndGetToken(10, 5,
                TimeUnit.SECONDS));
        await("the wait queued on the new master", () -> number((List<?>) call(promoted, "FLOCK.INFO", "after"),
                "waiters") == 1);
        after.unlock();
        assertNotNull(waited.get(10, TimeUnit.SECONDS), "granted through a session on the new master");
    }
}
