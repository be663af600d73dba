package io.flock;

import static io.flock.TestServer.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

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
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.parallel.ResourceLock;
import org.junit.jupiter.api.parallel.Resources;

/**
 * The client through Sentinel (FlockConfig.useSentinelServers): a master and its two replicas with the module and
 * three sentinels watching them (down after 1 s), started after the replicas synced so that they know them at
 * once. Each test starts once the sentinels agree on a master that has both replicas online (a test before it
 * may have failed over).
 */
@Order(1) // among the longest classes: started first (build.sh orders classes so), not left to end the run
class SentinelTest {
    private static final String NAME = "flock";
    private static final List<TestServer> servers = new ArrayList<>();
    /** The master at the start, then its replicas; which one is the master changes with each failover. */
    private static final List<TestServer> data = new ArrayList<>();
    private static final List<TestServer> sentinels = new ArrayList<>();
    private final List<FlockClient> clients = new ArrayList<>();
    private final ExecutorService threads = Executors.newCachedThreadPool();

    @BeforeAll
    static void start() throws IOException {
        TestServer master = started(TestServer.start());
        data.add(master);
        for (int i = 0; i < 2; i++) {
            data.add(started(TestServer.startReplicaOf(master.port)));
        }
        await("the replicas to sync", () -> data.stream().skip(1)
                .allMatch(r -> replication(r).contains("master_link_status:up")));
        String conf = "sentinel monitor " + NAME + " 127.0.0.1 " + master.port + " 2\n"
                + "sentinel down-after-milliseconds " + NAME + " 1000\n"
                + "sentinel failover-timeout " + NAME + " 10000\n";
        for (int i = 0; i < 3; i++) {
            TestServer sentinel = started(TestServer.startSentinel(conf));
            // A sentinel turns an old master that still says it is one into a replica once it has said so for 4
            // publish periods, as its INFO polls see: 10-20 s after a failover with the defaults (2 s and 10 s),
            // 1-2 s with these; the hellos that make the sentinels known to each other come as often. Not a
            // shorter INFO period: a replica whose last INFO is older than 3 of them is no candidate for a
            // failover (NOGOODSLAVE), and a busy machine can delay one by a second.
            call(sentinel, "SENTINEL", "DEBUG", "info-period", "1000", "publish-period", "200");
            sentinels.add(sentinel);
        }
        await("the sentinels to know the replica and each other", Duration.ofSeconds(15), () -> {
            for (TestServer sentinel : sentinels) {
                List<?> fields = (List<?>) call(sentinel, "SENTINEL", "MASTER", NAME);
                if (number(fields, "num-slaves") < 2 || number(fields, "num-other-sentinels") < 2) {
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

    /**
     * The sentinels agree on a master with both replicas online, and each sees both as replicas it can promote
     * (linked, up, their link to the master up, and its last INFO of each showing a replica): a test before may
     * have failed over, and a sentinel sees the demoted master as a replica only after a while. A sentinel whose
     * INFO missed the demotion still counts that server a master since the last failover, and would turn it back
     * into a replica at once if the next failover promoted it.
     */
    @BeforeEach
    void steady() {
        await("the sentinels to agree on a master with both replicas online", Duration.ofSeconds(60), () -> {
            int port = masterPort();
            if (port < 0) {
                return false;
            }
            String info = replication(byPort(port));
            return info.contains("role:master") && info.contains("connected_slaves:2")
                    && info.split("state=online", -1).length == 3
                    && sentinels.stream().allMatch(SentinelTest::seesTwoPromotableReplicas);
        });
    }

    private static boolean seesTwoPromotableReplicas(TestServer sentinel) {
        List<?> replicas = (List<?>) call(sentinel, "SENTINEL", "REPLICAS", NAME);
        return replicas.size() == 2 && replicas.stream().map(r -> (List<?>) r).allMatch(r ->
                field(r, "flags").equals("slave") && field(r, "master-link-status").equals("ok")
                        && field(r, "role-reported").equals("slave"));
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

    /**
     * The server's replication section, or "" while it cannot answer: Sentinel's demotion of an old master
     * kills its normal clients ({@code CLIENT KILL TYPE normal}), a connection of this poll's own too.
     */
    private static String replication(TestServer server) {
        try {
            return TestCluster.text(call(server, "INFO", "replication"));
        } catch (java.io.UncheckedIOException e) {
            return "";
        }
    }

    private static long number(List<?> fields, String name) {
        return Long.parseLong(field(fields, name));
    }

    /** Field {@code name} of a reply of fields and values (SENTINEL MASTER, SENTINEL REPLICAS, FLOCK.INFO). */
    private static String field(List<?> fields, String name) {
        for (int i = 0; i + 1 < fields.size(); i += 2) {
            if (TestCluster.text(fields.get(i)).equals(name)) {
                return TestCluster.text(fields.get(i + 1));
            }
        }
        throw new AssertionError("no " + name + " in " + fields);
    }

    /** The master's port as every sentinel names it now, or -1 while they disagree. */
    private static int masterPort() {
        Set<String> ports = new HashSet<>();
        for (TestServer sentinel : sentinels) {
            ports.add(TestCluster.text(((List<?>) call(sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", NAME)).get(1)));
        }
        return ports.size() == 1 ? Integer.parseInt(ports.iterator().next()) : -1;
    }

    /**
     * SENTINEL FAILOVER, sent again while the sentinel answers NOGOODSLAVE: steady() saw both replicas fit, but a
     * sentinel also wants a replica's last INFO newer than 3 INFO periods, which a busy machine can delay.
     */
    private static void failover() {
        await("a sentinel to start a failover", () -> {
            try {
                call(sentinels.get(0), "SENTINEL", "FAILOVER", NAME);
                return true;
            } catch (RedisError e) {
                if (!"NOGOODSLAVE".equals(e.code())) {
                    throw e;
                }
                return false;
            }
        });
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

    private static TestServer byPort(int port) {
        return data.stream().filter(server -> server.port == port).findFirst()
                .orElseThrow(() -> new AssertionError("no server on port " + port));
    }

    private static TestServer current() {
        return byPort(masterPort());
    }

    /**
     * The sentinels name another master while the one they named before still answers (a failover, before they
     * demote it): once the session is on the master named now, a {@code NOSESSION} from a command connection
     * still on the old one is sent again to the new one instead of ending the session (before: every wait failed
     * so, and each ended the live session).
     */
    @Test
    void aNosessionFromTheMasterTheSentinelsNoLongerNameDoesNotEndTheSession() throws Exception {
        try (TestServer old = TestServer.start(); TestServer next = TestServer.start();
                TestServer sentinel = TestServer.startSentinel("sentinel monitor moved 127.0.0.1 " + old.port + " 1\n")) {
            FlockConfig config = new FlockConfig();
            config.useSentinelServers().setMasterName("moved").addSentinelAddress("redis://127.0.0.1:" + sentinel.port);
            FlockClient client = FlockClient.create(config);
            clients.add(client);
            FlockLock lock = client.getFairLock("moved");
            assertTrue(lock.tryLock(1, 10, TimeUnit.SECONDS), "a session and a command connection on the old master");
            lock.unlock();

            call(sentinel, "SENTINEL", "REMOVE", "moved");
            call(sentinel, "SENTINEL", "MONITOR", "moved", "127.0.0.1", String.valueOf(next.port), "1");
            // The session's connection breaks; the next wait opens one where the sentinel points now.
            String list = TestCluster.text(call(old, "CLIENT", "LIST"));
            String reader = list.lines().filter(l -> l.contains("cmd=flock.inbox")).findFirst()
                    .orElseThrow(() -> new AssertionError("no session reader in " + list));
            call(old, "CLIENT", "KILL", "ID", reader.substring(3, reader.indexOf(' ')));
            await("the session to end on the old master",
                    () -> TestCluster.text(call(old, "INFO", "flock")).contains("flock_sessions:0"));

            assertTrue(lock.tryLock(1, 10, TimeUnit.SECONDS), "granted on the master named now");
            assertNotNull(call(next, "FLOCK.INFO", "moved"), "held on the master named now");
            assertNull(call(old, "FLOCK.INFO", "moved"));
            lock.unlock();
            assertNull(call(next, "FLOCK.INFO", "moved"));
        }
    }

    @Test
    void aLockAndAWaitGoToTheMasterTheSentinelsName() throws Exception {
        TestServer now = current();
        FlockLock held = client().getFairLock("k");
        held.lock();
        FlockClient waiter = client();
        // One thread takes and gives back the waiter's lock: a thread's owner names the thread (a pool may run
        // the unlock on another; the last fresh-clone CI run saw NOTOWNER so).
        ExecutorService waiterThread = Executors.newSingleThreadExecutor();
        try {
            Future<Long> waited =
                    waiterThread.submit(() -> waiter.getFairLock("k").tryLockAndGetToken(10, 5, TimeUnit.SECONDS));
            await("the wait queued on the master", () -> {
                Object info = call(now, "FLOCK.INFO", "k");
                return info != null && number((List<?>) info, "waiters") == 1;
            });
            held.unlock();
            long token = waited.get(10, TimeUnit.SECONDS);
            assertEquals(token, number((List<?>) call(now, "FLOCK.INFO", "k"), "token"), "granted on the master");
            waiterThread.submit(() -> {
                waiter.getFairLock("k").unlock();
                return null;
            }).get();
        } finally {
            waiterThread.shutdownNow();
        }
        assertNull(call(now, "FLOCK.INFO", "k"));
    }

    @Test
    void afterAFailoverANewLockAndWaitWorkOnTheNewMaster() throws Exception {
        FlockClient client = client();
        FlockLock before = client.getFairLock("before");
        before.lock(); // its connections now reach the old master
        before.unlock();
        TestServer old = current();
        failover();
        await("the sentinels to name a new master", Duration.ofSeconds(15), () -> {
            int port = masterPort();
            return port >= 0 && port != old.port;
        });
        TestServer promoted = current();
        // Sentinel demotes the old master (closing its clients) once it has seen it a master for a while
        await("the old master to become a replica", Duration.ofSeconds(45),
                () -> replication(old).contains("role:slave") && replication(old).contains("master_link_status:up"));
        FlockLock after = client.getFairLock("after");
        // A lease of its own: Sentinel may still close the new master's clients as it finishes reconfiguring,
        // which would end a grant that lived with the session there (reported lost, sessionended).
        long token = after.lockAndGetToken(30, TimeUnit.SECONDS);
        assertEquals(token, number((List<?>) call(promoted, "FLOCK.INFO", "after"), "token"), "held on the new master");
        FlockClient waiter = client();
        Future<Long> waited = threads.submit(() -> waiter.getFairLock("after").tryLockAndGetToken(10, 5,
                TimeUnit.SECONDS));
        await("the wait queued on the new master", () -> number((List<?>) call(promoted, "FLOCK.INFO", "after"),
                "waiters") == 1);
        after.unlock();
        assertNotNull(waited.get(10, TimeUnit.SECONDS), "granted through a session on the new master");
    }

    /** One durable grant as its client saw it: token, when the acquire returned, when the release was sent. */
    private record Hold(long token, long acquired, long releasing, String thread) {
    }

    /**
     * Three clients take one lock durably (all 2 replicas) in a loop with 5 ms holds; a {@code SENTINEL
     * FAILOVER} while waiters queue; then the test demotes the old master to a replica of the new one, as
     * Sentinel does itself a second or two later ({@code REPLICAOF} with {@code CLIENT KILL TYPE normal}), so
     * that both replicas acknowledge again and the grants after it are known to be the new master's. Durable
     * grants' tokens only rise in the order the acquires returned, no two durable holds (acquire's return to
     * release's send) overlap, and durable grants resume on the new master.
     */
    @Test
    @ResourceLock(Resources.SYSTEM_OUT) // its summary line, not in what ExampleTest reads an example printed
    void durableGrantsSurviveAFailoverInOrderWithoutOverlapAndResumeOnTheNewMaster() throws Exception {
        List<Hold> holds = new java.util.concurrent.CopyOnWriteArrayList<>(); // streamed while the clients add
        java.util.concurrent.atomic.AtomicInteger notDurable = new java.util.concurrent.atomic.AtomicInteger();
        java.util.concurrent.atomic.AtomicInteger otherErrors = new java.util.concurrent.atomic.AtomicInteger();
        java.util.concurrent.atomic.AtomicBoolean stop = new java.util.concurrent.atomic.AtomicBoolean();
        List<Future<?>> running = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            FlockConfig config = new FlockConfig().setDurableReplicas(2).setDurableTimeout(500);
            config.useSentinelServers().setMasterName(NAME);
            for (TestServer sentinel : sentinels) {
                config.useSentinelServers().addSentinelAddress("redis://127.0.0.1:" + sentinel.port);
            }
            FlockClient client = FlockClient.create(config);
            clients.add(client);
            String thread = "client-" + i;
            running.add(threads.submit(() -> {
                FlockLock lock = client.getFairLock("durable");
                while (!stop.get()) {
                    try {
                        Long token = lock.tryLockAndGetToken(2_000, 2_000, TimeUnit.MILLISECONDS);
                        if (token == null) {
                            continue;
                        }
                        long acquired = System.nanoTime();
                        Thread.sleep(5); // the work done under the lock
                        holds.add(new Hold(token, acquired, System.nanoTime(), thread));
                        try {
                            lock.unlock();
                        } catch (IllegalMonitorStateException | java.io.UncheckedIOException lost) {
                            // released on a master that was demoted meanwhile: its lease ends it
                        }
                    } catch (LockNotDurableException e) {
                        notDurable.incrementAndGet();
                    } catch (InterruptedException e) {
                        return null;
                    } catch (RuntimeException e) {
                        otherErrors.incrementAndGet(); // a reply lost in the failover, given up on
                    }
                }
                return null;
            }));
        }
        TestServer old = current();
        await("10 durable grants before the failover", Duration.ofSeconds(10), () -> holds.size() >= 10);
        await("waiters queued on the master", () -> {
            Object info = call(old, "FLOCK.INFO", "durable");
            return info != null && number((List<?>) info, "waiters") >= 1;
        });
        int before = holds.size();
        failover();
        await("the sentinels to name a new master", Duration.ofSeconds(15), () -> {
            int port = masterPort();
            return port >= 0 && port != old.port;
        });
        TestServer promoted = current();
        try (RespConnection admin = old.connect()) { // what Sentinel sends the old master soon after
            admin.call("REPLICAOF", "127.0.0.1", Integer.toString(promoted.port));
            admin.call("CLIENT", "KILL", "TYPE", "normal");
        }
        long demoted = System.nanoTime();
        await("5 durable grants on the new master", Duration.ofSeconds(20),
                () -> holds.stream().filter(h -> h.acquired() - demoted > 0).count() >= 5);
        stop.set(true);
        for (Future<?> f : running) {
            f.get(10, TimeUnit.SECONDS);
        }
        List<Hold> sorted = new ArrayList<>(holds);
        sorted.sort(java.util.Comparator.comparingLong(Hold::acquired));
        int reentered = 0;
        for (int i = 1; i < sorted.size(); i++) {
            Hold a = sorted.get(i - 1);
            Hold b = sorted.get(i);
            assertTrue(b.acquired() - a.releasing() >= 0, "durable holds overlap: " + a + " and " + b);
            if (b.token() == a.token() && b.thread().equals(a.thread())) {
                // The same owner's grant again: its release went to the old master after the promotion and was
                // lost with it, so the new master still had the grant and the next acquire reentered it.
                reentered++;
                continue;
            }
            assertTrue(b.token() > a.token(), "durable tokens rise in grant order: " + a + " then " + b);
        }
        long after = holds.stream().filter(h -> h.acquired() - demoted > 0).count();
        // a release lost with the old master leaves a hold on the new one; the client gives it back when its
        // thread's next acquire finds the grant again, so the others still get the lock
        assertTrue(holds.stream().filter(h -> h.acquired() - demoted > 0).map(Hold::thread).distinct().count() >= 2,
                "durable grants after the demotion went to more than one client: " + holds);
        // after the demotion the promoted server is the only master: those grants are its own
        assertTrue(replication(old).contains("role:slave"), "the old master is a replica");
        assertTrue(replication(promoted).contains("role:master"), "the promoted server is the master");
        System.out.println("durable failover: " + before + " durable grants before the failover, " + sorted.size()
                + " in all, " + after + " after the demotion; " + notDurable.get() + " NOTDURABLE, "
                + otherErrors.get() + " other errors, " + reentered + " reentered after a release lost with the old master");
    }
}
