package io.flock;

import java.net.URI;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * How {@link FlockClient#create(FlockConfig)} reaches its server, named as Redisson's
 * {@code Config.useSingleServer()} options: address ({@code redis://} or, for TLS, {@code rediss://}), ACL user
 * and password, database, connect and command timeouts, the watchdog's lease, and TLS trust and client
 * certificate. Every connection the client opens (commands, watchdog, session, blocking waits) connects with
 * these, then sends {@code AUTH} and {@code SELECT} before anything else.
 *
 * <pre>{@code
 * FlockClient client = FlockClient.create(new FlockConfig()
 *         .setAddress("rediss://redis.example.com:6380")
 *         .setUsername("app").setPassword("secret")
 *         .setDatabase(3)
 *         .setConnectTimeout(10_000).setTimeout(3_000));
 * }</pre>
 *
 * <p>The setters return this config; a client copies nothing, so change a config only before creating clients
 * from it.
 */
public final class FlockConfig {
    /** Redisson's default connectTimeout, in milliseconds. */
    public static final int DEFAULT_CONNECT_TIMEOUT_MS = 10_000;
    /** Redisson's default (command) timeout, in milliseconds. */
    public static final int DEFAULT_TIMEOUT_MS = 3_000;
    /** How long a durable grant waits for its replicas by default, in milliseconds (Redisson's slavesSyncTimeout). */
    public static final int DEFAULT_DURABLE_TIMEOUT_MS = 1_000;

    String host = "127.0.0.1";
    int port = 6379;
    boolean ssl;
    String username;
    String password;
    int database;
    int connectTimeoutMs = DEFAULT_CONNECT_TIMEOUT_MS;
    int timeoutMs = DEFAULT_TIMEOUT_MS;
    long lockWatchdogTimeoutMs = FlockClient.DEFAULT_WATCHDOG_TIMEOUT_MS;
    /** 0: the server's {@code flock.session-timeout-ms}. */
    long sessionTimeoutMs;
    /** -1: the server's {@code flock.lock-delay-ms}. */
    long lockDelayMs = -1;
    int durableReplicas;
    int durableTimeoutMs = DEFAULT_DURABLE_TIMEOUT_MS;
    Path sslTruststore;
    String sslTruststorePassword;
    Path sslCaCertificate;
    Path sslKeystore;
    String sslKeystorePassword;
    boolean sslEnableEndpointIdentification = true;
    /** Set by {@link #useClusterServers()}: the client routes each key to its slot's node. */
    ClusterServers cluster;
    /** Set by {@link #useSentinelServers()}: the client asks these sentinels for the master. */
    SentinelServers sentinel;

    /** A config for {@code redis://127.0.0.1:6379} with Redisson's default timeouts. */
    public FlockConfig() {
    }

    /**
     * The server: {@code redis://host:port} or, for TLS, {@code rediss://host:port} (port 6379 when left out,
     * an IPv6 host in brackets). User, password and database are set on their own, not in the address.
     *
     * @param address {@code redis://host[:port]} or {@code rediss://host[:port]}
     * @return this config
     * @throws IllegalArgumentException if the address is not of that form
     */
    public FlockConfig setAddress(String address) {
        Address a = Address.parse(address);
        host = a.host();
        port = a.port();
        ssl = a.ssl();
        return this;
    }

    /**
     * The ACL user to {@code AUTH} as ({@code AUTH username password}); needs a password. Without one, a password
     * alone authenticates the {@code default} user ({@code requirepass}).
     *
     * @param username an ACL user name, or null for the default user
     * @return this config
     */
    public FlockConfig setUsername(String username) {
        this.username = username;
        return this;
    }

    /**
     * The password to {@code AUTH} with on every connection; null (the default) sends no {@code AUTH}.
     *
     * @param password the {@code requirepass} password, or the ACL user's
     * @return this config
     */
    public FlockConfig setPassword(String password) {
        this.password = password;
        return this;
    }

    /**
     * The database every connection {@code SELECT}s, and so where the locks' keys live (default 0).
     *
     * @param database a database number of the server (0 to its {@code databases} - 1)
     * @return this config
     */
    public FlockConfig setDatabase(int database) {
        if (database < 0) {
            throw new IllegalArgumentException("database must be 0 or more: " + database);
        }
        this.database = database;
        return this;
    }

    /**
     * How long opening a connection may take: the TCP connect, and then the TLS handshake (default
     * {@value #DEFAULT_CONNECT_TIMEOUT_MS}).
     *
     * @param connectTimeoutMs milliseconds, more than 0
     * @return this config
     */
    public FlockConfig setConnectTimeout(int connectTimeoutMs) {
        if (connectTimeoutMs <= 0) {
            throw new IllegalArgumentException("connect timeout must be more than 0 ms: " + connectTimeoutMs);
        }
        this.connectTimeoutMs = connectTimeoutMs;
        return this;
    }

    /**
     * How long a command's reply may take once it is sent (default {@value #DEFAULT_TIMEOUT_MS}; 0: no limit).
     * A reply that does not come in time is a lost reply: the connection is closed and the command resent as
     * any lost reply. A command that blocks on the server ({@code FLOCK.ACQUIRE ... WAIT t} without
     * {@code INBOX}) gets its own time {@code t} on top ({@code t} 0: no limit), so waits are never cut by it.
     * The commands the client sends for itself have limits of their own instead: the session's
     * {@code FLOCK.INBOX} reads until the session's deadline, a watchdog renewal until its grant's, its own
     * releases a quarter of the session timeout, a cancel 2 s.
     *
     * @param timeoutMs milliseconds, 0 for no limit
     * @return this config
     */
    public FlockConfig setTimeout(int timeoutMs) {
        if (timeoutMs < 0) {
            throw new IllegalArgumentException("timeout must be 0 (no limit) or more: " + timeoutMs);
        }
        this.timeoutMs = timeoutMs;
        return this;
    }

    /**
     * The session timeout T (default: the server's {@code flock.session-timeout-ms}, 10 s unless configured): how
     * long the client's session lives on the server without being heard from. A lock taken without a lease time
     * lives with the session (no lease, no renewals); the session's reader is heard from every T/4, and when no
     * heartbeat confirmed the session for T (less a drift margin of 10 ms + 1%) its locks are reported lost
     * ({@link LossReason#UNCONFIRMED}), before the server can give them to anyone else. So a process cut off
     * from the server, or paused, holds its locks for at most about T. Shorter: losses known and locks passed on
     * sooner, more heartbeats; a pause (GC, a frozen VM) or a silence of the network longer than about T/2 may cost the locks.
     *
     * @param timeout from 100 ms to 1 hour (the server's limits), in whole milliseconds
     * @return this config
     * @throws IllegalArgumentException if {@code timeout} is outside those limits
     */
    public FlockConfig setSessionTimeout(java.time.Duration timeout) {
        this.sessionTimeoutMs = millisWithin(timeout, 100, 3_600_000, "session timeout must be 100 ms to 1 hour");
        return this;
    }

    /**
     * The lock-delay of every grant ({@code FLOCK.ACQUIRE ... LOCKDELAY ms}; default: the server's
     * {@code flock.lock-delay-ms}, 0 unless set): when a grant ends without being released (its lease ran out,
     * its session ended), the server grants the lock to nobody for that long, so that a holder that lost it
     * unawares (paused past its lease, cut off) has stopped before the next one starts. For a resource that
     * cannot check a fencing token; one that can is fenced ({@link FlockLock#fenced}). See docs/commands.md,
     * "Lock-delay".
     *
     * @param delay from 0 (none) to 1 minute, in whole milliseconds
     * @return this config
     * @throws IllegalArgumentException if {@code delay} is outside those limits
     */
    public FlockConfig setLockDelay(java.time.Duration delay) {
        this.lockDelayMs = millisWithin(delay, 0, 60_000, "lock delay must be 0 to 1 minute");
        return this;
    }

    /** {@code d} in whole milliseconds if from {@code min} to {@code max}; else refused with {@code rule}. */
    private static long millisWithin(java.time.Duration d, long min, long max, String rule) {
        long ms = d.toMillis();
        if (ms < min || ms > max) {
            throw new IllegalArgumentException(rule + ": " + d);
        }
        return ms;
    }

    /**
     * The lease of a lock taken without a lease time, renewed every third of it (default
     * {@value FlockClient#DEFAULT_WATCHDOG_TIMEOUT_MS}): Redisson's {@code lockWatchdogTimeout}.
     *
     * @param lockWatchdogTimeoutMs milliseconds, at least 3
     * @return this config
     */
    public FlockConfig setLockWatchdogTimeout(long lockWatchdogTimeoutMs) {
        this.lockWatchdogTimeoutMs = lockWatchdogTimeoutMs;
        return this;
    }

    /**
     * Durable grants (default 0: off): a grant counts only once {@code replicas} replicas of its key's node (on a
     * Cluster) or of the master (one server, Sentinel) have it. After each grant (a try, a wait, a reentry; of
     * a lock, a read or write lock, a semaphore's permits) the client sends, in one round trip on a connection
     * to that node, {@code FLOCK.RENEW key owner lease-ms ID <id>} and {@code WAIT replicas timeout}; when
     * {@code WAIT} answers fewer (or the grant is gone), it gives the hold back ({@code FLOCK.RELEASE}) and the
     * acquire throws {@link LockNotDurableException}. The {@code RENEW} is there because {@code WAIT} counts the
     * acknowledgements of the connection's own last write, and a grant handed over in another client's command
     * (a wait's) was not this connection's write.
     *
     * <p>Name every replica of the deployment: unlike Redisson's {@code checkLockSyncedSlaves} (every replica
     * the master has now), this is a count, because in a graceful failover the old master keeps serving with
     * fewer replicas attached, and a grant one of them acknowledged can be lost with it. What each setting
     * survived in the project's failover test is in docs/durability.md. It makes every acquire wait for the
     * replicas (about a replica round trip), and an acquire fails while fewer replicas are attached.
     *
     * @param replicas how many replicas must acknowledge each grant; 0 turns durable grants off
     * @return this config
     * @throws IllegalArgumentException if {@code replicas} is less than 0
     */
    public FlockConfig setDurableReplicas(int replicas) {
        if (replicas < 0) {
            throw new IllegalArgumentException("durable replicas must be 0 (off) or more: " + replicas);
        }
        this.durableReplicas = replicas;
        return this;
    }

    /**
     * How long a durable grant waits for its replicas' acknowledgements ({@code WAIT}'s timeout; default
     * {@value #DEFAULT_DURABLE_TIMEOUT_MS}), as Redisson's {@code slavesSyncTimeout}. An acquire that does not get
     * them in time gives its hold back and throws {@link LockNotDurableException} after about this long.
     *
     * @param durableTimeoutMs milliseconds, more than 0
     * @return this config
     * @throws IllegalArgumentException if {@code durableTimeoutMs} is not more than 0
     */
    public FlockConfig setDurableTimeout(int durableTimeoutMs) {
        if (durableTimeoutMs <= 0) {
            throw new IllegalArgumentException("durable timeout must be more than 0 ms: " + durableTimeoutMs);
        }
        this.durableTimeoutMs = durableTimeoutMs;
        return this;
    }

    /**
     * A trust store (PKCS12 or JKS) with the certificates that may sign the server's, for {@code rediss://};
     * without it or {@link #setSslCaCertificate} the JDK's default trust ({@code cacerts}) applies.
     *
     * @param truststore the trust store file
     * @param password its password, or null
     * @return this config
     */
    public FlockConfig setSslTruststore(Path truststore, String password) {
        this.sslTruststore = truststore;
        this.sslTruststorePassword = password;
        return this;
    }

    /**
     * A PEM file of CA certificates that may sign the server's (as the server's {@code tls-ca-cert-file}), for
     * {@code rediss://}; an alternative to {@link #setSslTruststore}.
     *
     * @param caCertificate the PEM file
     * @return this config
     */
    public FlockConfig setSslCaCertificate(Path caCertificate) {
        this.sslCaCertificate = caCertificate;
        return this;
    }

    /**
     * A key store (PKCS12 or JKS) with this client's certificate and key, for servers that verify clients
     * ({@code tls-auth-clients yes}): mutual TLS.
     *
     * @param keystore the key store file
     * @param password its password (also the key's)
     * @return this config
     */
    public FlockConfig setSslKeystore(Path keystore, String password) {
        this.sslKeystore = keystore;
        this.sslKeystorePassword = password;
        return this;
    }

    /**
     * Whether the server's certificate must name the host of the address (default true, as HTTPS). Turn it off
     * only for tests or when the certificate names no host you connect by: any certificate the trust accepts
     * is then taken.
     *
     * @param enable false to accept a trusted certificate for any host name
     * @return this config
     */
    public FlockConfig setSslEnableEndpointIdentification(boolean enable) {
        this.sslEnableEndpointIdentification = enable;
        return this;
    }

    /**
     * Makes this a Redis Cluster config, as Redisson's {@code Config.useClusterServers()}: give the seed nodes
     * with {@link ClusterServers#addNodeAddress}. Every other option of this config (user, password, timeouts,
     * TLS, watchdog) applies to every node; the database is 0, the only one a Cluster has.
     *
     * @return the cluster options, to add seed nodes to
     */
    public ClusterServers useClusterServers() {
        sentinel = null;
        if (cluster == null) {
            cluster = new ClusterServers(this);
        }
        return cluster;
    }

    /**
     * Makes this a Sentinel config, as Redisson's {@code Config.useSentinelServers()}: the client asks the
     * sentinels for the master of {@link SentinelServers#setMasterName} on every connection it opens. Every
     * other option of this config applies to the master; sentinels are asked without {@code AUTH} and
     * {@code SELECT}, with this config's timeouts and TLS.
     *
     * @return the sentinel options
     */
    public SentinelServers useSentinelServers() {
        cluster = null;
        if (sentinel == null) {
            sentinel = new SentinelServers(this);
        }
        return sentinel;
    }

    /** The seed nodes of a Redis Cluster (Redisson's {@code ClusterServersConfig}). */
    public static final class ClusterServers {
        private final FlockConfig config;
        final List<Address> nodes = new ArrayList<>();

        private ClusterServers(FlockConfig config) {
            this.config = config;
        }

        /**
         * Seed nodes: any reachable one gives the slot map ({@code CLUSTER SLOTS}); the others are found there.
         * {@code rediss://} makes every connection TLS.
         *
         * @param addresses {@code redis://host:port} or {@code rediss://host:port}, one or more
         * @return these options
         * @throws IllegalArgumentException if an address is not of that form
         */
        public ClusterServers addNodeAddress(String... addresses) {
            for (String address : addresses) {
                Address a = Address.parse(address);
                nodes.add(a);
                config.ssl = a.ssl();
            }
            return this;
        }
    }

    /** The sentinels and the master's name (Redisson's {@code SentinelServersConfig}). */
    public static final class SentinelServers {
        private final FlockConfig config;
        final List<Address> sentinels = new ArrayList<>();
        String masterName;

        private SentinelServers(FlockConfig config) {
            this.config = config;
        }

        /**
         * The name the sentinels monitor the master by ({@code sentinel monitor <name> ...}).
         *
         * @param masterName the monitored master's name
         * @return these options
         */
        public SentinelServers setMasterName(String masterName) {
            this.masterName = masterName;
            return this;
        }

        /**
         * Sentinels, asked in turn ({@code SENTINEL GET-MASTER-ADDR-BY-NAME}) until one names the master.
         * {@code rediss://} makes every connection, to the master too, TLS.
         *
         * @param addresses {@code redis://host:port} or {@code rediss://host:port}, one or more
         * @return these options
         * @throws IllegalArgumentException if an address is not of that form
         */
        public SentinelServers addSentinelAddress(String... addresses) {
            for (String address : addresses) {
                Address a = Address.parse(address);
                sentinels.add(a);
                config.ssl = a.ssl();
            }
            return this;
        }
    }

    /** This config's timeouts and TLS options without credentials and database: how sentinels are asked. */
    FlockConfig forSentinels() {
        FlockConfig c = new FlockConfig();
        c.ssl = ssl;
        c.connectTimeoutMs = connectTimeoutMs;
        c.timeoutMs = timeoutMs;
        c.sslTruststore = sslTruststore;
        c.sslTruststorePassword = sslTruststorePassword;
        c.sslCaCertificate = sslCaCertificate;
        c.sslKeystore = sslKeystore;
        c.sslKeystorePassword = sslKeystorePassword;
        c.sslEnableEndpointIdentification = sslEnableEndpointIdentification;
        return c;
    }

    /** A {@code redis://} or {@code rediss://} address: host, port and whether it is TLS. */
    record Address(String host, int port, boolean ssl) {
        static Address parse(String address) {
            URI uri;
            try {
                uri = new URI(address);
            } catch (java.net.URISyntaxException e) {
                throw new IllegalArgumentException("not a redis:// or rediss:// address: " + address, e);
            }
            String scheme = String.valueOf(uri.getScheme()).toLowerCase(Locale.ROOT);
            if (!scheme.equals("redis") && !scheme.equals("rediss") || uri.getHost() == null) {
                throw new IllegalArgumentException("not a redis://host:port or rediss://host:port address: " + address);
            }
            if (uri.getRawUserInfo() != null || !(uri.getRawPath() == null || uri.getRawPath().isEmpty()
                    || uri.getRawPath().equals("/")) || uri.getRawQuery() != null) {
                throw new IllegalArgumentException("only scheme, host and port go in the address (" + address
                        + "): give user, password and database with setUsername, setPassword and setDatabase");
            }
            String h = uri.getHost();
            return new Address(h.startsWith("[") && h.endsWith("]") ? h.substring(1, h.length() - 1) : h,
                    uri.getPort() < 0 ? 6379 : uri.getPort(), scheme.equals("rediss"));
        }

        /** {@code host:port}, as MOVED and CLUSTER SLOTS name a node. */
        @Override
        public String toString() {
            return (host.contains(":") ? "[" + host + "]" : host) + ":" + port;
        }

        /** As {@link #parse} takes it. */
        String uri() {
            return (ssl ? "rediss://" : "redis://") + this;
        }
    }

    /** The address as given to {@link #setAddress} would give it back, for messages. */
    String address() {
        return new Address(host, port, ssl).uri();
    }
}
