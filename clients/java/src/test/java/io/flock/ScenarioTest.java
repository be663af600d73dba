package io.flock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.IOException;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.Callable;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.BooleanSupplier;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * The shared client scenarios (clients/scenarios.json, clients/SCENARIOS.md): one test per scenario, played
 * through the public API only. An actor is a thread of its own running the steps given to it; a process is a
 * {@link FlockClient} of its own (connected through a {@link DroppingProxy}, for {@code drop_next_reply}); a
 * cancel is {@link Thread#interrupt()} of the actor waiting in {@code tryLock(wait, ...)}; FLOCK.INFO,
 * FLOCK.FORCERELEASE, CLIENT KILL, DUMP, RESTORE and CONFIG SET go on a raw connection of the runner's own.
 */
class ScenarioTest {
    private static final long DEFAULT_DEADLINE_MS = 10_000;
    private static final long START_ACQUIRE_WAIT_MS = 20_000;

    static TestServer server;

    @BeforeAll
    static void startServer() throws IOException {
        server = TestServer.start();
    }

    @AfterAll
    static void stopServer() throws IOException {
        server.close();
    }

    @TestFactory
    Stream<DynamicTest> scenarios() throws IOException {
        Path file = scenariosFile();
        Map<String, Object> root = object(Json.parse(Files.readString(file, StandardCharsets.UTF_8)), file.toString());
        assertEquals(2L, root.get("version"), file + ": a version this runner does not know");
        List<Object> scenarios = list(root.get("scenarios"));
        assertFalse(scenarios.isEmpty(), file + " has no scenarios");
        return scenarios.stream().map(s -> {
            Map<String, Object> scenario = object(s, "a scenario");
            String name = (String) scenario.get("name");
            List<Object> steps = list(scenario.get("steps"));
            long sessionTimeoutMs = number(scenario, "session_timeout_ms", 0);
            return DynamicTest.dynamicTest(name, () -> new Run(name, sessionTimeoutMs).play(steps));
        });
    }

    /** The client's constants are the ones every client shares (the file's {@code protocol} block). */
    @Test
    void theProtocolConstantsAreTheSharedOnes() throws IOException {
        Path file = scenariosFile();
        Map<String, Object> root = object(Json.parse(Files.readString(file, StandardCharsets.UTF_8)), file.toString());
        Map<String, Object> protocol = object(root.get("protocol"), "the protocol block");
        assertEquals(protocol.get("heartbeat_fraction"), (long) Protocol.HEARTBEAT_FRACTION, "heartbeat_fraction");
        assertEquals(protocol.get("drift_margin_ms"), Protocol.DRIFT_MARGIN_MS, "drift_margin_ms");
        assertEquals(protocol.get("drift_margin_percent"), Protocol.DRIFT_MARGIN_PERCENT, "drift_margin_percent");
        assertEquals(protocol.get("watchdog_lease_ms"), FlockClient.DEFAULT_WATCHDOG_TIMEOUT_MS, "watchdog_lease_ms");
        assertEquals(protocol.get("watchdog_renew_fraction"), (long) Protocol.WATCHDOG_RENEW_FRACTION,
                "watchdog_renew_fraction");
        assertEquals(protocol.get("resends"), (long) FlockClient.RESENDS, "resends");
        assertEquals(protocol.get("cancel_grace_ms"), Protocol.CANCEL_GRACE_MS, "cancel_grace_ms");
        assertEquals(protocol.get("cancel_grace_ms"), FlockLock.CANCEL_GRACE_MS, "the wait's cancel grace");
        List<String> reasons = new ArrayList<>();
        for (LossReason reason : LossReason.values()) {
            reasons.add(reason.reason());
            assertEquals(reason.reason(), reason.toString());
            assertEquals(reason, LossReason.of(reason.reason()));
        }
        assertEquals(protocol.get("loss_reasons"), reasons, "loss_reasons");
        // the margin: 10 ms + 1% of the span, e.g. 14 ms of a 400 ms timeout
        assertEquals(TimeUnit.MILLISECONDS.toNanos(14), Protocol.marginNanos(400));
        assertEquals(TimeUnit.MILLISECONDS.toNanos(310), Protocol.marginNanos(30_000));
        assertEquals(100, Protocol.heartbeatMs(400));
        // the default wait: until granted (lock() waits without limit)
        assertEquals(-1, AbstractFlockLock.FOREVER);
    }

    /**
     * clients/scenarios.json: FLOCK_SCENARIOS if set, else {@code ../scenarios.json} of the client directory (the
     * tests run in clients/java), else the first {@code clients/scenarios.json} up from the working directory or
     * from where the test classes are.
     */
    static Path scenariosFile() throws IOException {
        String given = System.getenv("FLOCK_SCENARIOS");
        if (given != null && !given.isEmpty()) {
            return Paths.get(given);
        }
        List<Path> starts = new ArrayList<>();
        starts.add(Paths.get("").toAbsolutePath());
        try {
            starts.add(Paths.get(ScenarioTest.class.getProtectionDomain().getCodeSource().getLocation().toURI()));
        } catch (URISyntaxException | RuntimeException unknown) {
            // the working directory alone
        }
        for (Path start : starts) {
            for (Path dir = start.normalize(); dir != null; dir = dir.getParent()) {
                if (Files.exists(dir.resolve("build.sh")) && Files.isRegularFile(dir.resolve("../scenarios.json"))) {
                    return dir.resolve("../scenarios.json").normalize();
                }
                if (Files.isRegularFile(dir.resolve("clients/scenarios.json"))) {
                    return dir.resolve("clients/scenarios.json");
                }
            }
        }
        throw new IOException("no clients/scenarios.json above " + starts + " (set FLOCK_SCENARIOS)");
    }

    /** One scenario on the (flushed) server: its processes, actors and proxy, all ended when it ends. */
    static final class Run {
        final String scenario;
        /** The session timeout of every process (0: the server's). */
        final long sessionTimeoutMs;
        final Map<String, Proc> processes = new LinkedHashMap<>();
        final Map<String, Actor> actors = new LinkedHashMap<>();
        RespConnection admin;
        /** drop_next_reply steps so far: each must have lost a reply by the next one and by the end. */
        int drops;
        /** The DUMP of save_key, for restore_key. */
        byte[] saved;
        /** refuse_writes without accept_writes since: the server is shared, so end() accepts them again. */
        boolean writesRefused;

        Run(String scenario, long sessionTimeoutMs) {
            this.scenario = scenario;
            this.sessionTimeoutMs = sessionTimeoutMs;
        }

        /** Replies the processes' proxies dropped. */
        private int dropped() {
            return processes.values().stream().mapToInt(p -> p.proxy.dropped.get()).sum();
        }

        void play(List<Object> steps) throws Exception {
            admin = server.connect();
            try {
                admin.call("FLUSHALL");
                for (int i = 0; i < steps.size(); i++) {
                    Map<String, Object> step = object(steps.get(i), "a step");
                    try {
                        step(step);
                    } catch (AssertionError | Exception e) {
                        throw new AssertionError(scenario + ", step " + (i + 1) + " " + step + ": " + e.getMessage(), e);
                    }
                }
                assertEquals(drops, dropped(), scenario + ": replies the proxy was to drop, and dropped");
            } finally {
                end();
            }
        }

        private void step(Map<String, Object> step) throws Exception {
            String op = (String) step.get("op");
            switch (op) {
                case "acquire": {
                    long waitMs = number(step, "wait_ms", 0);
                    String outcome = await(actor(step).submit(acquire(step, waitMs)), waitMs + DEFAULT_DEADLINE_MS,
                            "the acquire's outcome");
                    assertEquals(step.get("expect"), outcome, "the acquire's outcome");
                    break;
                }
                case "start_acquire": {
                    Actor actor = actor(step);
                    assertNull(actor.started, actor.name + " has a started acquire already");
                    actor.started = actor.submit(acquire(step, number(step, "wait_ms", START_ACQUIRE_WAIT_MS)));
                    break;
                }
                case "await_result": {
                    Actor actor = actor(step);
                    assertTrue(actor.started != null, actor.name + " started no acquire");
                    String outcome = await(actor.started, deadline(step), "the started acquire's outcome");
                    actor.started = null;
                    assertEquals(step.get("expect"), outcome, "the started acquire's outcome");
                    break;
                }
                case "expect_pending": {
                    Actor actor = actor(step);
                    assertTrue(actor.started != null, actor.name + " started no acquire");
                    assertFalse(actor.started.isDone(), actor.name + "'s acquire has an outcome already: "
                            + (actor.started.isDone() ? actor.started.getNow(null) : ""));
                    break;
                }
                case "release": {
                    Actor actor = actor(step);
                    String outcome = await(actor.submit(release(actor, step)), DEFAULT_DEADLINE_MS, "the release");
                    assertEquals(step.getOrDefault("expect", "ok"), outcome, "the release's outcome");
                    break;
                }
                case "cancel": {
                    Actor actor = actor(step);
                    assertTrue(actor.started != null, actor.name + " started no acquire to cancel");
                    actor.thread.interrupt(); // the client's way: lockInterruptibly/tryLock(wait) answer it
                    break;
                }
                case "expect_holds": {
                    Actor actor = actor(step);
                    assertEquals(number(step, "holds", -1), holdsOf(key(step), actor.owner()),
                            "holds of " + actor.name + " (" + actor.owner() + ") in FLOCK.INFO " + key(step));
                    break;
                }
                case "await_waiters": {
                    long count = number(step, "count", 0);
                    String key = step.containsKey("key") ? key(step) : null;
                    long[] seen = {-1};
                    awaitTrue(() -> {
                        seen[0] = key == null ? 0 : waiters(key);
                        return seen[0] == count;
                    }, deadline(step), () -> count + " waiters on " + key + " (last seen " + seen[0] + ")");
                    break;
                }
                case "expect_free": {
                    Object info = admin.call("FLOCK.INFO", key(step));
                    assertNull(info, "FLOCK.INFO " + key(step) + " is not nil: " + fields(info));
                    break;
                }
                case "force_release":
                    admin.call("FLOCK.FORCERELEASE", key(step));
                    break;
                case "await_lost": {
                    Actor actor = actor(step);
                    String key = key(step);
                    long within = deadline(step);
                    String reason = await(actor.submit(() -> awaitLost(actor, key, within)), within + DEFAULT_DEADLINE_MS,
                            "isLeaseLost()");
                    assertTrue(reason != null, "isLeaseLost() stayed false for " + within + " ms");
                    if (step.containsKey("reason")) {
                        assertEquals(step.get("reason"), reason, "the reason the LeaseLostListener was told");
                    }
                    break;
                }
                case "expect_not_lost": {
                    Actor actor = actor(step);
                    String key = key(step);
                    long forMs = number(step, "for_ms", 0);
                    String lost = await(actor.submit(() -> lostWithin(actor, key, forMs)),
                            forMs + DEFAULT_DEADLINE_MS, "isLeaseLost()");
                    assertNull(lost, "isLeaseLost() of " + actor.name);
                    break;
                }
                case "expect_lost_before": {
                    Actor actor = actor(step);
                    Actor granted = actors.get((String) step.get("granted"));
                    assertTrue(granted != null && granted.grantedAt != null, step.get("granted") + " was not granted");
                    Long lostAt = actor.proc.lostAt.get(key(step) + "\0" + actor.thread.getId());
                    assertTrue(lostAt != null, actor.name + "'s hold was not reported lost");
                    assertTrue(lostAt - granted.grantedAt < 0, actor.name + "'s hold was reported lost "
                            + TimeUnit.NANOSECONDS.toMicros(lostAt - granted.grantedAt) + " us after "
                            + granted.name + "'s acquire returned granted");
                    break;
                }
                case "drop_next_reply": {
                    Proc proc = process((String) step.getOrDefault("process", "main"));
                    assertEquals(drops, dropped(), "the previous drop_next_reply never dropped a reply");
                    drops++;
                    proc.proxy.dropRepliesTo((String) step.get("command"), 1);
                    break;
                }
                case "partition": {
                    Proc proc = process((String) step.getOrDefault("process", "main"));
                    proc.proxy.partition();
                    if (step.containsKey("for_ms")) {
                        Thread.sleep(number(step, "for_ms", 0)); // the partition's length is what is tested
                        proc.proxy.heal();
                    }
                    break;
                }
                case "heal":
                    process((String) step.getOrDefault("process", "main")).proxy.heal();
                    break;
                case "kill_process":
                    kill(process((String) step.get("process")));
                    break;
                case "save_key":
                    saved = (byte[]) admin.call("DUMP", key(step));
                    assertTrue(saved != null, key(step) + " does not exist to be saved");
                    break;
                case "restore_key": {
                    assertTrue(saved != null, "no save_key before restore_key");
                    admin.call(FlockClient.bytes("RESTORE"), FlockClient.bytes(key(step)), FlockClient.bytes("0"),
                            saved, FlockClient.bytes("REPLACE"));
                    break;
                }
                case "refuse_writes":
                    writesRefused = true; // before the call: end() must undo even a half-done step
                    admin.call("CONFIG", "SET", "min-replicas-to-write", "1");
                    break;
                case "accept_writes":
                    admin.call("CONFIG", "SET", "min-replicas-to-write", "0");
                    writesRefused = false;
                    break;
                default:
                    fail("unknown op " + op);
            }
        }

        /** The actor's acquire, as its thread runs it: the outcome in the file's words. */
        private Callable<String> acquire(Map<String, Object> step, long waitMs) {
            Actor actor = actor(step);
            String key = key(step);
            String mode = (String) step.getOrDefault("mode", "exclusive");
            long leaseMs = number(step, "lease_ms", -1); // -1: the watchdog's lease
            FlockClient client = actor.proc.client;
            return () -> {
                try {
                    boolean granted;
                    switch (mode) {
                        case "exclusive":
                            granted = client.getFairLock(key).tryLock(waitMs, leaseMs, TimeUnit.MILLISECONDS);
                            break;
                        case "shared":
                            granted = client.getReadWriteLock(key).readLock().tryLock(waitMs, leaseMs,
                                    TimeUnit.MILLISECONDS);
                            break;
                        case "permits":
                            granted = client.getSemaphore(key, (int) number(step, "limit", -1))
                                    .tryAcquire((int) number(step, "permits", -1), waitMs, leaseMs, TimeUnit.MILLISECONDS);
                            break;
                        default:
                            throw new IllegalArgumentException("unknown mode " + mode);
                    }
                    if (granted) {
                        actor.grantedAt = System.nanoTime();
                    }
                    return granted ? "granted" : "busy";
                } catch (InterruptedException e) {
                    return "cancelled";
                } catch (RuntimeException e) {
                    return error(e);
                }
            };
        }

        private Callable<String> release(Actor actor, Map<String, Object> step) {
            String key = key(step);
            String mode = (String) step.getOrDefault("mode", "exclusive");
            FlockClient client = actor.proc.client;
            return () -> {
                try {
                    switch (mode) {
                        case "exclusive":
                            client.getFairLock(key).unlock();
                            break;
                        case "shared":
                            client.getReadWriteLock(key).readLock().unlock();
                            break;
                        case "permits":
                            client.getSemaphore(key, (int) number(step, "limit", -1)).release();
                            break;
                        default:
                            throw new IllegalArgumentException("unknown mode " + mode);
                    }
                    return "ok";
                } catch (RuntimeException e) {
                    return error(e);
                }
            };
        }

        /**
         * "error:CODE" for the server's error as the client raised it: {@link IllegalMonitorStateException} is the
         * Java client's NOTOWNER (unlock of a lock not held, the README's "Errors"); other errors carry the code.
         */
        private static String error(RuntimeException e) {
            if (e instanceof IllegalMonitorStateException) {
                return "error:NOTOWNER";
            }
            String code = RedisError.codeOf(e);
            return code.isEmpty() ? "error: " + e : "error:" + code;
        }

        /** On the actor's thread: isLeaseLost() within {@code withinMs}, then the listener's reason (or null). */
        private String awaitLost(Actor actor, String key, long withinMs) throws InterruptedException {
            FlockLock lock = actor.proc.client.getFairLock(key);
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(withinMs);
            String told = key + "\0" + Thread.currentThread().getId();
            while (true) {
                if (lock.isLeaseLost() && actor.proc.lost.containsKey(told)) {
                    return actor.proc.lost.get(told);
                }
                if (System.nanoTime() - deadline > 0) {
                    return lock.isLeaseLost() ? "(isLeaseLost() true, the listener not told)" : null;
                }
                Thread.sleep(5);
            }
        }

        /**
         * On the actor's thread: the first time isLeaseLost() is true within {@code forMs} (checked every few
         * ms, and once at least), as "lost (reason)"; null if it never is.
         */
        private String lostWithin(Actor actor, String key, long forMs) throws InterruptedException {
            FlockLock lock = actor.proc.client.getFairLock(key);
            long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(forMs);
            while (true) {
                if (lock.isLeaseLost()) {
                    return "lost (" + lock.getLeaseLostReason() + ")";
                }
                if (System.nanoTime() - end >= 0) {
                    return null;
                }
                Thread.sleep(5);
            }
        }

        /**
         * A killed process: its client can open no connection any more, every connection it opened is killed
         * (CLIENT KILL), and then its client is closed, which ends its actors' waits.
         */
        private void kill(Proc proc) throws IOException {
            proc.killed = true;
            for (long id : proc.connections) {
                try {
                    admin.call("CLIENT", "KILL", "ID", Long.toString(id));
                } catch (RedisError alreadyGone) {
                    // closed before (a dropped reply closes its connection)
                }
            }
            proc.client.close();
            for (Actor actor : actors.values()) {
                if (actor.proc == proc) {
                    actor.stop();
                }
            }
        }

        private void end() throws IOException {
            if (writesRefused) {
                // first: the next scenarios' writes must not depend on how this one ended
                admin.call("CONFIG", "SET", "min-replicas-to-write", "0");
            }
            for (Actor actor : actors.values()) {
                actor.stop();
            }
            for (Proc proc : processes.values()) {
                proc.client.close();
            }
            for (Proc proc : processes.values()) {
                proc.proxy.heal();
                proc.proxy.close();
            }
            admin.close();
        }

        private Actor actor(Map<String, Object> step) {
            String name = (String) step.get("actor");
            assertTrue(name != null, "the step names no actor");
            Proc proc = process((String) step.getOrDefault("process", "main"));
            Actor actor = actors.computeIfAbsent(name, n -> new Actor(scenario, n, proc));
            if (step.containsKey("process")) {
                assertEquals(proc, actor.proc, "actor " + name + " belongs to process " + actor.proc.name);
            }
            return actor;
        }

        private Proc process(String name) {
            return processes.computeIfAbsent(name, n -> {
                try {
                    return new Proc(n, new DroppingProxy(server.port), sessionTimeoutMs);
                } catch (IOException e) {
                    throw new java.io.UncheckedIOException(e);
                }
            });
        }

        private String key(Map<String, Object> step) {
            Object key = step.get("key");
            assertTrue(key != null, "the step names no key");
            return scenario + ":" + key;
        }

        private long deadline(Map<String, Object> step) {
            return number(step, "within_ms", DEFAULT_DEADLINE_MS);
        }

        private long waiters(String key) {
            Map<String, Object> info;
            try {
                info = fields(admin.call("FLOCK.INFO", key));
            } catch (IOException e) {
                throw new java.io.UncheckedIOException(e);
            }
            return info == null ? 0 : (Long) info.get("waiters");
        }

        /** The holds of {@code owner} among FLOCK.INFO's holders (0 when it holds none). */
        private long holdsOf(String key, String owner) throws IOException {
            Map<String, Object> info = fields(admin.call("FLOCK.INFO", key));
            if (info == null) {
                return 0;
            }
            for (Object holder : list(info.get("holders"))) {
                Map<String, Object> h = fields(holder);
                if (owner.equals(h.get("owner"))) {
                    return (Long) h.get("holds");
                }
            }
            return 0;
        }
    }

    /**
     * A process: one FlockClient behind a proxy of its own (to lose a reply, to be cut off), whose connections
     * are known by server ID.
     */
    static final class Proc {
        final String name;
        final DroppingProxy proxy;
        final List<Long> connections = new CopyOnWriteArrayList<>();
        /** What the LeaseLostListener was told: "key\0thread id" to reason, and when (nanoTime). */
        final Map<String, String> lost = new ConcurrentHashMap<>();
        final Map<String, Long> lostAt = new ConcurrentHashMap<>();
        final FlockClient client;
        volatile boolean killed;

        Proc(String name, DroppingProxy proxy, long sessionTimeoutMs) {
            this.name = name;
            this.proxy = proxy;
            int port = proxy.port();
            FlockConfig options = new FlockConfig();
            if (sessionTimeoutMs > 0) {
                options.setSessionTimeout(java.time.Duration.ofMillis(sessionTimeoutMs));
            }
            this.client = new FlockClient(() -> {
                if (killed) {
                    throw new IOException("process " + name + " was killed");
                }
                RespConnection c = new RespConnection("127.0.0.1", port);
                try {
                    connections.add((Long) c.call("CLIENT", "ID"));
                } catch (IOException | RuntimeException e) {
                    c.close();
                    throw e;
                }
                return c;
            }, options);
            client.setLeaseLostListener((lock, thread, token, reason) -> {
                lostAt.put(lock + "\0" + thread, System.nanoTime());
                lost.put(lock + "\0" + thread, reason);
            });
        }
    }

    /** An actor: a thread running the steps given to it, one after the other. */
    static final class Actor {
        final String name;
        final Proc proc;
        final Thread thread;
        private final BlockingQueue<Runnable> tasks = new LinkedBlockingQueue<>();
        private volatile boolean stopped;
        /** The outcome of its start_acquire, until await_result reads it. */
        CompletableFuture<String> started;
        /** When its last acquire returned granted (nanoTime). */
        volatile Long grantedAt;

        Actor(String scenario, String name, Proc proc) {
            this.name = name;
            this.proc = proc;
            this.thread = new Thread(this::loop, "scenario " + scenario + " actor " + name);
            thread.setDaemon(true);
            thread.start();
        }

        String owner() {
            return proc.client.getId() + ":" + thread.getId();
        }

        private void loop() {
            while (!stopped) {
                Runnable task;
                try {
                    task = tasks.take();
                } catch (InterruptedException idle) {
                    continue; // a cancel that came after its acquire ended, or stop()
                }
                task.run();
            }
        }

        <T> CompletableFuture<T> submit(Callable<T> body) {
            CompletableFuture<T> result = new CompletableFuture<>();
            tasks.add(() -> {
                try {
                    result.complete(body.call());
                } catch (Throwable e) {
                    result.completeExceptionally(e);
                }
            });
            return result;
        }

        void stop() {
            stopped = true;
            thread.interrupt();
        }
    }

    static <T> T await(CompletableFuture<T> future, long withinMs, String what) throws Exception {
        try {
            return future.get(withinMs, TimeUnit.MILLISECONDS);
        } catch (TimeoutException e) {
            throw new AssertionError("timed out after " + withinMs + " ms waiting for " + what, e);
        } catch (ExecutionException e) {
            if (e.getCause() instanceof Exception) {
                throw (Exception) e.getCause();
            }
            throw e;
        }
    }

    static void awaitTrue(BooleanSupplier condition, long withinMs, java.util.function.Supplier<String> what)
            throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(withinMs);
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() - deadline > 0) {
                throw new AssertionError("timed out after " + withinMs + " ms waiting for " + what.get());
            }
            Thread.sleep(5);
        }
    }

    static long number(Map<String, Object> step, String field, long absent) {
        Object value = step.get(field);
        return value == null ? absent : (Long) value;
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> object(Object value, String what) {
        assertTrue(value instanceof Map, what + " is not a JSON object");
        return (Map<String, Object>) value;
    }

    @SuppressWarnings("unchecked")
    static List<Object> list(Object value) {
        assertTrue(value instanceof List, value + " is not a list");
        return (List<Object>) value;
    }

    /** A RESP2 flat field/value array as a map, strings decoded (null stays null). */
    static Map<String, Object> fields(Object reply) {
        if (reply == null) {
            return null;
        }
        List<Object> flat = list(reply);
        Map<String, Object> fields = new HashMap<>();
        for (int i = 0; i + 1 < flat.size(); i += 2) {
            Object value = flat.get(i + 1);
            fields.put(text(flat.get(i)), value instanceof byte[] ? text(value) : value);
        }
        return fields;
    }

    static String text(Object value) {
        return value instanceof byte[] ? new String((byte[]) value, StandardCharsets.UTF_8) : String.valueOf(value);
    }
}
