package io.flock;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReferenceArray;
import java.util.function.Function;

/**
 * Which {@link Node} each key's commands go to. One server, or the master a Sentinel names (asked again on
 * every connection opened): one node. A Redis Cluster: the master of the key's slot, from {@code CLUSTER
 * SLOTS} of any node known (the seeds at first), updated by {@code MOVED} and, after a node stopped
 * answering (a failover), asked again.
 */
final class Router implements AutoCloseable {
    static final int SLOTS = 16384;
    /** Redirects followed for one command before its MOVED or ASK error stands (a map that keeps changing). */
    static final int MAX_REDIRECTS = 16;
    /**
     * How long a command whose server stopped answering is sent again (the map asked again, or the sentinels)
     * before its I/O error stands: a failover takes the node timeout plus an election, or Sentinel's
     * down-after plus its promotion.
     */
    static final long FAILOVER_MS = 30_000;
    /** Between attempts while a failover is under way. */
    static final long FAILOVER_PAUSE_MS = 100;
    private static final byte[][] CLUSTER_SLOTS = {FlockClient.bytes("CLUSTER"), FlockClient.bytes("SLOTS")};

    private final FlockClient client;
    /** The node of a one-server or Sentinel client; null for a Cluster. */
    private final Node single;
    private final boolean failsOver;
    private final Function<FlockConfig.Address, ConnectionFactory> factories;
    private final List<FlockConfig.Address> seeds;
    private final Map<String, Node> nodes = new ConcurrentHashMap<>();
    /** The address of each slot's master; null until the map was first asked. */
    private volatile AtomicReferenceArray<FlockConfig.Address> slots;

    /** One server: {@code factory} opens its connections; a lost reply is resent as ever, no failover. */
    Router(FlockClient client, ConnectionFactory factory) {
        this(client, new Node(client, "", factory), false, null, List.of());
    }

    private Router(FlockClient client, Node single, boolean failsOver,
            Function<FlockConfig.Address, ConnectionFactory> factories, List<FlockConfig.Address> seeds) {
        this.client = client;
        this.single = single;
        this.failsOver = failsOver;
        this.factories = factories;
        this.seeds = seeds;
    }

    /** The router of {@code config}: a Cluster's, a Sentinel's or one server's. */
    static Router of(FlockClient client, FlockConfig config) {
        Function<FlockConfig.Address, ConnectionFactory> factories = RespConnection.factories(config);
        if (config.cluster != null) {
            if (config.cluster.nodes.isEmpty() || config.database != 0) {
                throw new IllegalArgumentException("useClusterServers() needs a seed node (addNodeAddress) and "
                        + "database 0, a Cluster's only one");
            }
            return new Router(client, null, true, factories, List.copyOf(config.cluster.nodes));
        }
        if (config.sentinel != null) {
            return new Router(client, new Node(client, "", Sentinels.factory(config, factories)), true, null,
                    List.of());
        }
        return new Router(client, factories.apply(new FlockConfig.Address(config.host, config.port, config.ssl)));
    }

    /** True for a Cluster or Sentinel client: a node may fail over to another. */
    boolean failsOver() {
        return failsOver;
    }

    /** The node of a one-server or Sentinel client (tests). */
    Node single() {
        if (single == null) {
            throw new IllegalStateException("a Cluster client has a node per master");
        }
        return single;
    }

    /** Every node opened so far. */
    Collection<Node> nodes() {
        return single != null ? List.of(single) : nodes.values();
    }

    /** Where {@code key}'s next command goes; a null key (a command without one): any node. */
    Route route(byte[] key) throws IOException {
        return new Route(key);
    }

    /**
     * Sends {@code args} for {@code key} on the link {@code link} picks of its node, following redirects and
     * (if {@code waitForFailover}) a failover.
     */
    Object call(byte[] key, byte[][] args, Function<Node, Channel> link, boolean waitForFailover) throws IOException {
        return route(key).call(args, link, waitForFailover);
    }

    /**
     * The renewals of {@code key}'s node, as the slot map known now says (asking nothing: the timer calls it);
     * a key whose node is not known yet shares the first node's.
     */
    Serial renewerOf(byte[] key) {
        if (single != null) {
            return single.renewer;
        }
        AtomicReferenceArray<FlockConfig.Address> map = slots;
        FlockConfig.Address address = map == null ? null : map.get(slot(key));
        return address != null ? node(address).renewer : node(seeds.get(0)).renewer;
    }

    private Node nodeFor(byte[] key) throws IOException {
        if (single != null) {
            return single;
        }
        AtomicReferenceArray<FlockConfig.Address> map = slots;
        if (map == null) {
            map = refresh();
        }
        FlockConfig.Address address = key == null ? seeds.get(0) : map.get(slot(key));
        if (address == null) {
            address = refresh().get(slot(key));
            if (address == null) {
                throw new IOException("no Cluster node serves slot " + slot(key) + " (CLUSTER SLOTS)");
            }
        }
        return node(address);
    }

    private Node node(FlockConfig.Address address) {
        return nodes.computeIfAbsent(address.toString(), a -> new Node(client, a, factories.apply(address)));
    }

    /**
     * Asks {@code CLUSTER SLOTS} of the nodes known, then the seeds, on a connection of its own, until one
     * answers; the map it gives replaces the old one.
     */
    private synchronized AtomicReferenceArray<FlockConfig.Address> refresh() throws IOException {
        Set<FlockConfig.Address> candidates = new LinkedHashSet<>();
        AtomicReferenceArray<FlockConfig.Address> old = slots;
        for (int i = 0; old != null && i < SLOTS; i++) {
            if (old.get(i) != null) {
                candidates.add(old.get(i));
            }
        }
        candidates.addAll(seeds);
        IOException failed = new IOException("no Cluster node answered CLUSTER SLOTS: " + candidates);
        for (FlockConfig.Address candidate : candidates) {
            try (FlockConnection conn = factories.apply(candidate).connect()) {
                AtomicReferenceArray<FlockConfig.Address> map = parseSlots(conn.call(CLUSTER_SLOTS), candidate);
                slots = map;
                return map;
            } catch (IOException e) {
                failed.addSuppressed(e);
            }
        }
        throw failed;
    }

    /** {@code CLUSTER SLOTS}: [start, end, [host, port, id, ...] (the master), replicas...] per range. */
    static AtomicReferenceArray<FlockConfig.Address> parseSlots(Object reply, FlockConfig.Address asked) {
        AtomicReferenceArray<FlockConfig.Address> map = new AtomicReferenceArray<>(SLOTS);
        for (Object range : (List<?>) reply) {
            List<?> r = (List<?>) range;
            List<?> master = (List<?>) r.get(2);
            String host = FlockLock.text(master.get(0));
            // An empty or "?" host: the node does not know its own address; it is the one asked.
            FlockConfig.Address address = new FlockConfig.Address(host.isEmpty() || host.equals("?") ? asked.host()
                    : host, ((Long) master.get(1)).intValue(), asked.ssl());
            for (long slot = (Long) r.get(0); slot <= (Long) r.get(1); slot++) {
                map.set((int) slot, address);
            }
        }
        return map;
    }

    @Override
    public void close() {
        for (Node node : nodes()) {
            node.close();
        }
    }

    /** The key's hash slot, as the Redis Cluster spec says: CRC16 of the key, or of its first non-empty {...}. */
    static int slot(byte[] key) {
        int open = indexOf(key, '{', 0);
        if (open >= 0) {
            int close = indexOf(key, '}', open + 1);
            if (close > open + 1) {
                return crc16(key, open + 1, close) & (SLOTS - 1);
            }
        }
        return crc16(key, 0, key.length) & (SLOTS - 1);
    }

    private static int indexOf(byte[] key, char c, int from) {
        for (int i = from; i < key.length; i++) {
            if (key[i] == c) {
                return i;
            }
        }
        return -1;
    }

    /** CRC16-CCITT (XMODEM): polynomial 0x1021, initial 0, no reflection. */
    private static int crc16(byte[] data, int from, int to) {
        int crc = 0;
        for (int i = from; i < to; i++) {
            crc ^= (data[i] & 0xff) << 8;
            for (int bit = 0; bit < 8; bit++) {
                crc = (crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1;
            }
            crc &= 0xffff;
        }
        return crc;
    }

    /**
     * Where one key's commands go next: its slot's node, or the one a redirect named. After a command, the
     * node that answered it (a re-watch sends its ACQUIRE with that node's session).
     */
    final class Route {
        private final byte[] key;
        private final long failoverDeadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(FAILOVER_MS);
        private Node node;
        /** The node answered ASK: the next command goes there after ASKING. */
        private boolean asking;
        private int redirects;

        private Route(byte[] key) throws IOException {
            this.key = key;
            this.node = nodeFor(key);
        }

        Node node() {
            return node;
        }

        /** Sends on {@code link}'s connection of the node: ASKING first after an ASK. */
        Object send(byte[][] args, Function<Node, Channel> link) throws IOException {
            return FlockClient.callResending(link.apply(node), args, asking);
        }

        /** {@link #send}, once: a lost reply is the caller's to resend (the command may have been applied). */
        Object sendOnce(byte[][] args, Function<Node, Channel> link) throws IOException {
            return link.apply(node).call(args, asking);
        }

        /**
         * {@code args} on {@code link}'s connection of the node within {@code timeoutMs}, once (the caller
         * resends), following MOVED and ASK: a command the client sends for itself, given the time until the
         * deadline it serves.
         */
        Object callTimed(byte[][] args, Function<Node, Channel> link, int timeoutMs) throws IOException {
            while (true) {
                try {
                    return link.apply(node).call(args, asking, timeoutMs);
                } catch (RuntimeException e) {
                    if (!redirected(e)) {
                        throw e;
                    }
                }
            }
        }

        /**
         * {@code commands} in one round trip on a durable-grant connection of the node (ASKING first after an
         * ASK); the replies in order, error replies in their places. Sent once: the caller resends.
         */
        List<Object> pipeline(byte[][]... commands) throws IOException {
            return node.durableLinks.pipeline(asking, commands);
        }

        /**
         * {@link #send}, following redirects and, on a Cluster or Sentinel with {@code waitForFailover}, a
         * failover. (The watchdog thread does not wait for one: it would hold up the renewals of other nodes'
         * grants; its next round tries again.)
         */
        Object call(byte[][] args, Function<Node, Channel> link, boolean waitForFailover) throws IOException {
            while (true) {
                try {
                    return send(args, link);
                } catch (IOException e) {
                    if (!waitForFailover || !failedOver()) {
                        throw e;
                    }
                } catch (RuntimeException e) {
                    if (!redirected(e)) {
                        throw e;
                    }
                }
            }
        }

        /**
         * After an error reply: true if it was MOVED (the map updated, the key's node now the one named) or ASK
         * (the named node, for the next command only), unless there were too many.
         */
        boolean redirected(RuntimeException error) {
            String code = RedisError.codeOf(error);
            if (single != null || !code.equals("MOVED") && !code.equals("ASK") || ++redirects > MAX_REDIRECTS) {
                return false;
            }
            // "MOVED <slot> <host>:<port>"; an empty host is the host of the node that answered
            String[] words = new RedisError(error).getMessage().split(" ");
            String target = words[2];
            int colon = target.lastIndexOf(':');
            String host = colon == 0 ? node.address.substring(0, node.address.lastIndexOf(':')) : target.substring(0, colon);
            if (host.startsWith("[") && host.endsWith("]")) {
                host = host.substring(1, host.length() - 1);
            }
            FlockConfig.Address address = new FlockConfig.Address(host, Integer.parseInt(target.substring(colon + 1)),
                    seeds.get(0).ssl());
            asking = code.equals("ASK");
            if (!asking && slots != null) {
                slots.set(Integer.parseInt(words[1]), address);
            }
            node = Router.this.node(address);
            return true;
        }

        /**
         * A wait on the key ended {@code LOCKDELETED}: true if the key's node now redirects it (its slot was
         * migrated with the key), the route then at the node named; false for a real deletion.
         */
        boolean keyMoved() {
            try {
                send(new byte[][] {FlockClient.bytes("FLOCK.INFO"), key}, n -> n.commands);
                return false;
            } catch (IOException e) {
                return false;
            } catch (RuntimeException e) {
                return redirected(e);
            }
        }

        /**
         * After a lost reply (resent already): true, after a pause, while a failover may be under way (a
         * Cluster or Sentinel client, within {@link #FAILOVER_MS}); a Cluster's map is asked again first.
         */
        boolean failedOver() {
            if (!failsOver || System.nanoTime() - failoverDeadline > 0) {
                return false;
            }
            try {
                Thread.sleep(FAILOVER_PAUSE_MS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return false;
            }
            reroute();
            return true;
        }

        /** A Cluster: asks the map again and goes to the key's node in it (the same one if nobody answers). */
        void reroute() {
            asking = false;
            if (single != null) {
                return; // a Sentinel's node asks the sentinels on its next connection
            }
            try {
                refresh();
                node = nodeFor(key);
            } catch (IOException unreachable) {
                // no node answered: the next attempt finds out again
            }
        }
    }
}
