package io.flock;

import java.io.IOException;
import java.util.List;
import java.util.function.Function;

/**
 * Connections to the master that Redis Sentinel names: each new connection asks the sentinels first
 * ({@code SENTINEL GET-MASTER-ADDR-BY-NAME}), so a connection opened after a failover reaches the new master.
 */
final class Sentinels {
    private Sentinels() {
    }

    /**
     * Opens connections to the master the sentinels name now. A {@code READONLY} or {@code UNBLOCKED} reply on
     * such a connection means its server stopped being the master: the connection is closed and the reply
     * counts as lost (an {@link IOException}), so that the command is resent with its request ID on a new
     * connection, to the master the sentinels name then, and a session reader opens a new session there. So does a
     * {@code NOSESSION} on a connection opened before the sentinels named another master: a master a failover
     * deposed answers until the sentinels demote it, and there a session opened on the new master is unknown;
     * taken as the session's end, it would end the live session.
     */
    static ConnectionFactory factory(FlockConfig config, Function<FlockConfig.Address, ConnectionFactory> factories) {
        FlockConfig.SentinelServers sentinel = config.sentinel;
        if (sentinel.masterName == null || sentinel.sentinels.isEmpty()) {
            throw new IllegalArgumentException(
                    "useSentinelServers() needs setMasterName and a sentinel (addSentinelAddress)");
        }
        Function<FlockConfig.Address, ConnectionFactory> toSentinels = RespConnection.factories(config.forSentinels());
        Named named = new Named();
        return () -> {
            FlockConfig.Address address = master(sentinel, toSentinels);
            long epoch = named.saw(address);
            return new MasterConnection(factories.apply(address).connect(), named, epoch);
        };
    }

    /** The master the sentinels named last, and how many times they named another one than before. */
    private static final class Named {
        private FlockConfig.Address last;
        private long epoch;

        synchronized long saw(FlockConfig.Address address) {
            if (last != null && !last.equals(address)) {
                epoch++;
            }
            last = address;
            return epoch;
        }

        synchronized long epoch() {
            return epoch;
        }
    }

    /** A connection to the master: a reply saying it stopped being one is a lost reply. */
    private static final class MasterConnection implements FlockConnection, Pipelined, Timed {
        private final FlockConnection master;
        private final Named named;
        /** The sentinels' {@link Named#epoch} when it was opened. */
        private final long epoch;

        MasterConnection(FlockConnection master, Named named, long epoch) {
            this.master = master;
            this.named = named;
            this.epoch = epoch;
        }

        @Override
        public Object call(byte[]... args) throws IOException {
            try {
                return master.call(args);
            } catch (RuntimeException e) {
                throw demoted(e);
            }
        }

        @Override
        public Object call(int timeoutMs, byte[]... args) throws IOException {
            try {
                return Timed.call(master, timeoutMs, args);
            } catch (RuntimeException e) {
                throw demoted(e);
            }
        }

        @Override
        public List<Object> pipeline(byte[][]... commands) throws IOException {
            List<Object> replies;
            if (master instanceof Pipelined) {
                replies = ((Pipelined) master).pipeline(commands);
            } else {
                replies = new java.util.ArrayList<>();
                for (byte[][] command : commands) {
                    try {
                        replies.add(master.call(command));
                    } catch (java.io.UncheckedIOException e) {
                        throw e;
                    } catch (RuntimeException e) {
                        replies.add(e);
                    }
                }
            }
            for (Object reply : replies) {
                if (reply instanceof RuntimeException) {
                    RuntimeException e = demoted((RuntimeException) reply);
                    if (e != reply) {
                        throw e;
                    }
                }
            }
            return replies;
        }

        /**
         * READONLY or UNBLOCKED, or NOSESSION from a master the sentinels no longer name: the connection closed
         * and the reply lost (thrown); else {@code e} itself.
         */
        private RuntimeException demoted(RuntimeException e) throws IOException {
            String code = RedisError.codeOf(e);
            if (code.equals("READONLY") || code.equals("UNBLOCKED")) {
                master.close();
                throw new IOException("the server stopped being the master (" + e.getMessage() + ")", e);
            }
            if (code.equals("NOSESSION") && named.epoch() != epoch) {
                master.close();
                throw new IOException("answered by a master the sentinels no longer name (" + e.getMessage() + ")", e);
            }
            return e;
        }

        @Override
        public void close() throws IOException {
            master.close();
        }
    }

    /** The master's address, from the first sentinel that names it. */
    private static FlockConfig.Address master(FlockConfig.SentinelServers sentinel,
            Function<FlockConfig.Address, ConnectionFactory> toSentinels) throws IOException {
        IOException failed = new IOException("no sentinel named master '" + sentinel.masterName + "' of "
                + sentinel.sentinels);
        for (FlockConfig.Address address : sentinel.sentinels) {
            try (FlockConnection conn = toSentinels.apply(address).connect()) {
                Object reply = conn.call(FlockClient.bytes("SENTINEL"), FlockClient.bytes("GET-MASTER-ADDR-BY-NAME"),
                        FlockClient.bytes(sentinel.masterName));
                if (reply instanceof List && ((List<?>) reply).size() == 2) {
                    List<?> hostPort = (List<?>) reply;
                    return new FlockConfig.Address(FlockLock.text(hostPort.get(0)),
                            Integer.parseInt(FlockLock.text(hostPort.get(1))), address.ssl());
                }
            } catch (IOException | RuntimeException e) {
                failed.addSuppressed(e);
            }
        }
        throw failed;
    }
}
