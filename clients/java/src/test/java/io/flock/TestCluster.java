package io.flock;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * Three Cluster masters (and, if asked, a replica of each) with the module, each with a third of the slots, made
 * by hand as the Python and Rust tests do: SET-CONFIG-EPOCH, ADDSLOTSRANGE, MEET, then waiting until every node
 * says cluster_state:ok and tells the same story of every node's role and slots.
 */
final class TestCluster implements AutoCloseable {
    final List<TestServer> nodes = new ArrayList<>();
    /** An admin connection to each node, in the order of {@link #nodes}. */
    final List<RespConnection> admins = new ArrayList<>();
    /** With {@code TestCluster(true)}: the replica of each master, in the order of {@link #nodes}. */
    final List<TestServer> replicas = new ArrayList<>();

    TestCluster() throws IOException {
        this(false);
    }

    /** {@code withReplicas}: a replica of each master too (CLUSTER MEET, CLUSTER REPLICATE), synced. */
    TestCluster(boolean withReplicas) throws IOException {
        try {
            int[] bounds = {0, 5461, 10923, 16384};
            for (int i = 0; i < 3; i++) {
                TestServer node = TestServer.startClusterNode();
                nodes.add(node);
                admins.add(node.connect());
                admins.get(i).call("CLUSTER", "SET-CONFIG-EPOCH", Integer.toString(i + 1));
                admins.get(i).call("CLUSTER", "ADDSLOTSRANGE", Integer.toString(bounds[i]),
                        Integer.toString(bounds[i + 1] - 1));
            }
            // every pair meets at once: meeting one node and learning of the others from its gossip took seconds
            for (int i = 1; i < 3; i++) {
                for (int j = 0; j < i; j++) {
                    admins.get(i).call("CLUSTER", "MEET", "127.0.0.1", Integer.toString(nodes.get(j).port));
                }
            }
            TestServer.await("the cluster to be ok on every node", Duration.ofSeconds(20), this::settled);
            if (withReplicas) {
                for (int i = 0; i < 3; i++) {
                    TestServer replica = TestServer.startClusterNode();
                    replicas.add(replica);
                    try (RespConnection c = replica.connect()) {
                        for (TestServer other : all()) {
                            if (other != replica) {
                                c.call("CLUSTER", "MEET", "127.0.0.1", Integer.toString(other.port));
                            }
                        }
                    }
                }
                for (int i = 0; i < 3; i++) {
                    String masterId = text(admins.get(i).call("CLUSTER", "MYID"));
                    TestServer replica = replicas.get(i);
                    TestServer.await("the replica to know its master", Duration.ofSeconds(20), () -> {
                        try (RespConnection c = replica.connect()) {
                            c.call("CLUSTER", "REPLICATE", masterId);
                            return true;
                        } catch (IOException | RedisError notYet) {
                            return false; // ERR Unknown node: the gossip has not brought it yet
                        }
                    });
                }
                // online on the masters too: after a diskless sync a master counts its replica (in WAIT) only
                // from the replica's first ACK
                TestServer.await("the replicas to sync", Duration.ofSeconds(20), () -> replicas.stream()
                        .allMatch(r -> replication(r).contains("master_link_status:up"))
                        && nodes.stream().allMatch(m -> replication(m).contains("state=online")));
                TestServer.await("every node to know the replicas as such", Duration.ofSeconds(20), this::settled);
            }
        } catch (IOException | RuntimeException | Error e) {
            close();
            throw e;
        }
    }

    /**
     * Whether the cluster has settled: every node (replicas too) says cluster_state:ok and tells the same story
     * of every node's role, master and slots, with no link down and no node failing or still in its handshake.
     * Until then a node's view may lag: a master that still takes a new replica for a master refuses it its
     * vote in a CLUSTER FAILOVER, a replica that does not know a master's slots does not count its vote.
     */
    private boolean settled() {
        try {
            Set<List<String>> first = null;
            for (TestServer server : all()) {
                try (RespConnection c = server.connect()) {
                    if (!text(c.call("CLUSTER", "INFO")).contains("cluster_state:ok")) {
                        return false;
                    }
                    Set<List<String>> view = new HashSet<>();
                    for (String line : text(c.call("CLUSTER", "NODES")).split("\n")) {
                        String[] f = line.trim().split(" ");
                        List<String> flags = List.of(f[2].split(","));
                        if (!f[7].equals("connected") || flags.contains("fail") || flags.contains("fail?")
                                || flags.contains("handshake") || flags.contains("noaddr")) {
                            return false;
                        }
                        List<String> node = new ArrayList<>(List.of(f[0], flags.contains("master") ? "master" : "slave",
                                f[3]));
                        node.addAll(List.of(f).subList(8, f.length));
                        view.add(node);
                    }
                    if (view.size() != nodes.size() + replicas.size() || first != null && !first.equals(view)) {
                        return false;
                    }
                    first = view;
                }
            }
            return true;
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    private List<TestServer> all() {
        List<TestServer> all = new ArrayList<>(nodes);
        all.addAll(replicas);
        return all;
    }

    /** A config with every node as a seed. */
    FlockConfig config() {
        FlockConfig config = new FlockConfig();
        for (TestServer node : nodes) {
            config.useClusterServers().addNodeAddress("redis://127.0.0.1:" + node.port);
        }
        return config;
    }

    /** Which node (0, 1, 2) serves {@code key}'s slot now, as node 0 sees it (with replicas: which shard). */
    int indexOf(String key) throws IOException {
        long slot = (Long) admins.get(0).call("CLUSTER", "KEYSLOT", key);
        for (Object range : (List<?>) admins.get(0).call("CLUSTER", "SLOTS")) {
            List<?> r = (List<?>) range;
            if ((Long) r.get(0) <= slot && slot <= (Long) r.get(1)) {
                long port = (Long) ((List<?>) r.get(2)).get(1);
                for (int i = 0; i < nodes.size(); i++) {
                    if (nodes.get(i).port == port || i < replicas.size() && replicas.get(i).port == port) {
                        return i; // a shard: its first master, or the replica promoted in its place
                    }
                }
            }
        }
        throw new AssertionError("slot " + slot + " is not served");
    }

    /** A key {@code prefix:<n>} that node {@code index} serves. */
    String keyOn(int index, String prefix) throws IOException {
        for (int n = 0; ; n++) {
            if (indexOf(prefix + ":" + n) == index) {
                return prefix + ":" + n;
            }
        }
    }

    /** The admin connection of the node that serves {@code key}. */
    RespConnection adminOf(String key) throws IOException {
        return admins.get(indexOf(key));
    }

    /**
     * Moves {@code key}'s slot, with its keys, to node {@code to}: SETSLOT IMPORTING and MIGRATING, MIGRATE ...
     * KEYS, then SETSLOT NODE on every node.
     */
    void migrate(String key, int to) throws IOException {
        int from = indexOf(key);
        RespConnection src = admins.get(from);
        RespConnection dst = admins.get(to);
        String slot = Long.toString((Long) src.call("CLUSTER", "KEYSLOT", key));
        String srcId = text(src.call("CLUSTER", "MYID"));
        String dstId = text(dst.call("CLUSTER", "MYID"));
        dst.call("CLUSTER", "SETSLOT", slot, "IMPORTING", srcId);
        src.call("CLUSTER", "SETSLOT", slot, "MIGRATING", dstId);
        List<String> migrate = new ArrayList<>(List.of("MIGRATE", "127.0.0.1", Integer.toString(nodes.get(to).port),
                "", "0", "5000", "KEYS"));
        for (Object k : (List<?>) src.call("CLUSTER", "GETKEYSINSLOT", slot, "100")) {
            migrate.add(text(k));
        }
        src.call(migrate.toArray(new String[0]));
        for (RespConnection admin : admins) {
            admin.call("CLUSTER", "SETSLOT", slot, "NODE", dstId);
        }
    }

    /** INFO replication of {@code server}. */
    static String replication(TestServer server) {
        try (RespConnection c = server.connect()) {
            return text(c.call("INFO", "replication"));
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    static String text(Object reply) {
        return reply instanceof byte[] ? new String((byte[]) reply, StandardCharsets.UTF_8) : String.valueOf(reply);
    }

    @Override
    public void close() throws IOException {
        for (RespConnection admin : admins) {
            admin.close();
        }
        for (TestServer node : nodes) {
            node.close();
        }
        for (TestServer replica : replicas) {
            replica.close();
        }
    }
}
