import io.flock.FlockClient;
import io.flock.FlockConfig;
import io.flock.FlockLock;
import io.flock.RespConnection;
import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

/**
 * `make bench-clients` (scripts/bench-clients.sh): what the Java client costs over the raw FLOCK commands it sends,
 * and whether a holder cut off by a partition knows it lost its locks before the next waiter is granted. Prints
 * Markdown table rows. Arguments: port, then {@code overhead}, {@code contended} or {@code first}.
 *
 * <ul>
 *   <li>{@code overhead}: one thread, one lock, uncontended pairs through the API ({@code tryLock()} and
 *       {@code lock()}, each with {@code unlock()}) against the raw commands on one socket
 *       ({@code FLOCK.ACQUIRE key owner 0 INBOX sid}, the session opened on another, with and without the
 *       {@code ID <uuid>} the client adds; and {@code FLOCK.ACQUIRE key owner 30000}; each with
 *       {@code FLOCK.RELEASE}), in alternating rounds.
 *   <li>{@code contended}: 8 threads on one lock, each holding it 100 us (busy), in alternating runs through
 *       {@code lock()}/{@code unlock()} of one client and with raw blocking {@code FLOCK.ACQUIRE ... WAIT 0} on a
 *       socket per thread.
 *   <li>{@code first}: a client whose connections go through scripts/partition-proxy.py (or the script
 *       PARTITION_PROXY names) holds K locks, a waiter queues behind each on a direct socket, the proxy cuts the
 *       holder off at a random point: per lock, the waiter's grant time less the time the LeaseLostListener was
 *       told.
 * </ul>
 */
public class ClientBench {
    /** A bare RESP2 socket: the raw commands, with no client code in between. */
    static final class Raw implements AutoCloseable {
        final Socket socket;
        final OutputStream out;
        final InputStream in;

        Raw(int port) throws IOException {
            socket = new Socket("127.0.0.1", port);
            socket.setTcpNoDelay(true);
            out = new BufferedOutputStream(socket.getOutputStream());
            in = new BufferedInputStream(socket.getInputStream());
        }

        Object call(String... args) throws IOException {
            StringBuilder b = new StringBuilder().append('*').append(args.length).append("\r\n");
            for (String a : args) {
                b.append('$').append(a.getBytes(StandardCharsets.UTF_8).length).append("\r\n").append(a).append("\r\n");
            }
            out.write(b.toString().getBytes(StandardCharsets.UTF_8));
            out.flush();
            return read();
        }

        private String line() throws IOException {
            StringBuilder b = new StringBuilder();
            for (int c; (c = in.read()) != '\r'; ) {
                if (c < 0) {
                    throw new IOException("closed");
                }
                b.append((char) c);
            }
            in.read();
            return b.toString();
        }

        private Object read() throws IOException {
            String head = line();
            String rest = head.substring(1);
            switch (head.charAt(0)) {
                case '+':
                    return rest;
                case '-':
                    throw new IOException(rest);
                case ':':
                    return Long.parseLong(rest);
                case '$': {
                    int len = Integer.parseInt(rest);
                    if (len < 0) {
                        return null;
                    }
                    byte[] data = in.readNBytes(len);
                    in.readNBytes(2);
                    return new String(data, StandardCharsets.UTF_8);
                }
                case '*': {
                    int len = Integer.parseInt(rest);
                    List<Object> items = new ArrayList<>();
                    for (int i = 0; i < len; i++) {
                        items.add(read());
                    }
                    return items;
                }
                default:
                    throw new IOException("bad reply " + head);
            }
        }

        @Override
        public void close() throws IOException {
            socket.close();
        }
    }

    interface Pair {
        void run() throws Exception;
    }

    static double pct(double[] sorted, double q) {
        return sorted[(int) Math.round((sorted.length - 1) * q)];
    }

    static double[] sorted(List<Double> v) {
        double[] a = v.stream().mapToDouble(Double::doubleValue).toArray();
        Arrays.sort(a);
        return a;
    }

    static double mean(List<Double> v) {
        return v.stream().mapToDouble(Double::doubleValue).average().orElse(Double.NaN);
    }

    static final PrintStream OUT = System.out;

    /** Whether the JIT compiled for more than 20 ms while {@code work} ran (warm-ups go on until it did not). */
    static boolean jitBusy(java.util.concurrent.Callable<?> work) throws Exception {
        var jit = java.lang.management.ManagementFactory.getCompilationMXBean();
        long before = jit.getTotalCompilationTime();
        work.call();
        return jit.getTotalCompilationTime() - before > 20;
    }

    // --- overhead ---

    static void overhead(int port) throws Exception {
        final int rounds = 10;
        final int perRound = 500;
        final int warmupRounds = 1;
        try (FlockClient client = FlockClient.create("127.0.0.1", port);
                Raw session = new Raw(port);
                Raw conn = new Raw(port)) {
            FlockLock tryLock = client.getFairLock("o:api");
            FlockLock waitLock = client.getFairLock("o:wait");
            String sid = (String) session.call("FLOCK.SESSION", "TIMEOUT", "3600000");
            String owner = "bench:1";
            Pair[] methods = {
                () -> {
                    if (!tryLock.tryLock()) {
                        throw new IllegalStateException("busy");
                    }
                    tryLock.unlock();
                },
                () -> {
                    waitLock.lock();
                    waitLock.unlock();
                },
                // what tryLock() and unlock() send: with a fresh ID <uuid> each
                () -> {
                    conn.call("FLOCK.ACQUIRE", "o:ids", owner, "0", "INBOX", sid, "ID", UUID.randomUUID().toString());
                    conn.call("FLOCK.RELEASE", "o:ids", owner, "ID", UUID.randomUUID().toString());
                },
                () -> {
                    conn.call("FLOCK.ACQUIRE", "o:raw", owner, "0", "INBOX", sid);
                    conn.call("FLOCK.RELEASE", "o:raw", owner);
                },
                () -> {
                    conn.call("FLOCK.ACQUIRE", "o:plain", owner, "30000");
                    conn.call("FLOCK.RELEASE", "o:plain", owner);
                },
            };
            List<List<Double>> times = new ArrayList<>();
            for (int m = 0; m < methods.length; m++) {
                times.add(new ArrayList<>());
            }
            // warm-up, uncounted: every method in turn until the JIT is done with them (30 s at most)
            long warmStart = System.nanoTime();
            long warmUntil = warmStart + TimeUnit.SECONDS.toNanos(30);
            while (jitBusy(() -> {
                long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(1);
                while (System.nanoTime() < until) {
                    for (Pair method : methods) {
                        for (int i = 0; i < perRound; i++) {
                            method.run();
                        }
                    }
                }
                return null;
            }) && System.nanoTime() < warmUntil) {
                // again
            }
            System.err.printf("Java overhead: warmed up for %.0f s%n", (System.nanoTime() - warmStart) / 1e9);
            for (int round = 0; round < warmupRounds + rounds; round++) {
                for (int i = 0; i < perRound; i++) {
                    for (int k = 0; k < methods.length; k++) {
                        // one pair of each in turn, each time in another order, so that the machine's other work
                        // weighs on all alike; the first round is a warm-up too
                        int m = (k + i) % methods.length;
                        long start = System.nanoTime();
                        methods[m].run();
                        if (round >= warmupRounds) {
                            times.get(m).add((System.nanoTime() - start) / 1e3);
                        }
                    }
                }
            }
            double[][] t = new double[methods.length][];
            for (int m = 0; m < methods.length; m++) {
                t[m] = sorted(times.get(m));
            }
            OUT.printf("| Java | %d | %s | %s | %s | %s | %s | %s | %s |%n", t[0].length,
                    cell(t[0]), cell(t[1]), cell(t[2]), cell(t[3]), cell(t[4]), ratio(t[0], t[3]), ratio(t[0], t[2]));
        }
    }

    static String cell(double[] t) {
        return String.format("%.1f / %.1f", pct(t, 0.5), pct(t, 0.99));
    }

    static String ratio(double[] a, double[] b) {
        return String.format("%.2fx / %.2fx", pct(a, 0.5) / pct(b, 0.5), pct(a, 0.99) / pct(b, 0.99));
    }

    // --- contended ---

    static final int THREADS = 8;
    static final long HOLD_NANOS = 100_000;

    /** One thread's lock: acquire, then release. */
    interface Worker {
        void acquire() throws Exception;

        void release() throws Exception;
    }

    interface WorkerFactory {
        Worker make(int i) throws Exception;
    }

    static void busy(long nanos) {
        long start = System.nanoTime();
        while (System.nanoTime() - start < nanos) {
            Thread.onSpinWait();
        }
    }

    /**
     * A run of {@link #THREADS} threads: grants per second, and per grant the hand-off (from the previous
     * holder's release call to this thread's acquire returning), in us.
     */
    record Run(double grantsPerSecond, List<Double> handoffs) {
    }

    static Run runThreads(long runMs, WorkerFactory factory) throws Exception {
        AtomicBoolean stop = new AtomicBoolean();
        AtomicLong grants = new AtomicLong();
        AtomicLong releaseSent = new AtomicLong();
        CyclicBarrier start = new CyclicBarrier(THREADS + 1);
        List<Thread> threads = new ArrayList<>();
        List<Exception> failures = new ArrayList<>();
        List<Double> handoffs = new ArrayList<>();
        for (int i = 0; i < THREADS; i++) {
            Worker w = factory.make(i);
            Thread t = new Thread(() -> {
                List<Double> myHandoffs = new ArrayList<>();
                try {
                    start.await();
                    while (!stop.get()) {
                        w.acquire();
                        long got = System.nanoTime();
                        long sent = releaseSent.get();
                        if (sent != 0) {
                            myHandoffs.add((got - sent) / 1e3);
                        }
                        grants.incrementAndGet();
                        busy(HOLD_NANOS);
                        releaseSent.set(System.nanoTime());
                        w.release();
                    }
                } catch (Exception e) {
                    synchronized (failures) {
                        failures.add(e);
                    }
                }
                synchronized (handoffs) {
                    handoffs.addAll(myHandoffs);
                }
            });
            t.start();
            threads.add(t);
        }
        start.await();
        long began = System.nanoTime();
        Thread.sleep(runMs);
        long counted = grants.get();
        long elapsed = System.nanoTime() - began;
        stop.set(true);
        for (Thread t : threads) {
            t.join();
        }
        if (!failures.isEmpty()) {
            throw failures.get(0);
        }
        return new Run(counted / (elapsed / 1e9), handoffs);
    }

    static void contended(int port) throws Exception {
        final int repeats = 3;
        final long runMs = 3000;
        List<Double> api = new ArrayList<>();
        List<Double> raw = new ArrayList<>();
        List<Double> ratios = new ArrayList<>();
        List<Double> apiHandoffs = new ArrayList<>();
        List<Double> rawHandoffs = new ArrayList<>();
        List<Double> session = new ArrayList<>();
        List<Double> sessionHandoffs = new ArrayList<>();
        try (FlockClient client = FlockClient.create("127.0.0.1", port); RawSession rawSession = new RawSession(port)) {
            FlockLock lock = client.getFairLock("c:api");
            // Warm-up, uncounted, until the JIT is done: it compiles the client's code for 10 s and more on 2
            // busy cores, and until then its compiler threads take more CPU than the client's own (a 3 s run
            // right after a 1 s warm-up measured the API at 0.69x of the raw session form, after 15 s at 1.07x).
            long warmStart = System.nanoTime();
            long warmUntil = warmStart + TimeUnit.SECONDS.toNanos(40);
            do {
                runThreads(2000, i -> rawWorker(port, i));
                runThreads(2000, i -> rawSession.worker(port, i));
            } while (jitBusy(() -> runThreads(2000, i -> apiWorker(lock))) && System.nanoTime() < warmUntil);
            System.err.printf("Java contended: warmed up for %.0f s%n", (System.nanoTime() - warmStart) / 1e9);
            for (int r = 0; r < repeats; r++) {
                Run rr = runThreads(runMs, i -> rawWorker(port, i));
                Run a = runThreads(runMs, i -> apiWorker(lock));
                Run s = runThreads(runMs, i -> rawSession.worker(port, i));
                raw.add(rr.grantsPerSecond());
                api.add(a.grantsPerSecond());
                session.add(s.grantsPerSecond());
                ratios.add(a.grantsPerSecond() / rr.grantsPerSecond());
                rawHandoffs.addAll(rr.handoffs());
                apiHandoffs.addAll(a.handoffs());
                sessionHandoffs.addAll(s.handoffs());
            }
        }
        double[] q = sorted(ratios);
        OUT.printf("| Java | %d | %d x %d s | %.0f | %.0f | %.0f | %.2fx (%.2fx to %.2fx) | %.0f / %.0f / %.0f |%n",
                THREADS, repeats, runMs / 1000, pct(sorted(api), 0.5), pct(sorted(session), 0.5),
                pct(sorted(raw), 0.5), pct(q, 0.5), q[0], q[q.length - 1], mean(apiHandoffs), mean(sessionHandoffs),
                mean(rawHandoffs));
    }

    /**
     * The session's way with the raw commands the client sends and no client code: a thread reads
     * {@code FLOCK.INBOX} and hands each grant to its waiting thread (a queue per owner), each thread sends
     * {@code FLOCK.ACQUIRE key owner 0 WAIT 0 INBOX sid ID <uuid>} and {@code FLOCK.RELEASE key owner ID <uuid>}
     * on a socket of its own.
     */
    static final class RawSession implements AutoCloseable {
        final Raw conn;
        final String sid;
        final Map<String, java.util.concurrent.BlockingQueue<Long>> granted = new ConcurrentHashMap<>();
        final Thread reader;

        RawSession(int port) throws IOException {
            conn = new Raw(port);
            sid = (String) conn.call("FLOCK.SESSION", "TIMEOUT", "3600000");
            reader = new Thread(() -> {
                try {
                    while (true) {
                        Object reply = conn.call("FLOCK.INBOX", "0");
                        if (reply == null) {
                            continue;
                        }
                        for (Object e : (List<?>) reply) {
                            List<?> event = (List<?>) e;
                            if ("granted".equals(event.get(0))) {
                                granted.get((String) event.get(2)).add(Long.parseLong(String.valueOf(event.get(3))));
                            }
                        }
                    }
                } catch (IOException closed) {
                    // closed at the end
                }
            });
            reader.setDaemon(true);
            reader.start();
        }

        Worker worker(int port, int i) throws IOException {
            Raw cmd = new Raw(port);
            String owner = "session:" + i;
            java.util.concurrent.BlockingQueue<Long> mine = new java.util.concurrent.LinkedBlockingQueue<>();
            granted.put(owner, mine);
            return new Worker() {
                @Override
                public void acquire() throws Exception {
                    Object reply = cmd.call("FLOCK.ACQUIRE", "c:session", owner, "0", "WAIT", "0", "INBOX", sid, "ID",
                            UUID.randomUUID().toString());
                    if (!(reply instanceof Long)) {
                        mine.take();
                    }
                }

                @Override
                public void release() throws IOException {
                    cmd.call("FLOCK.RELEASE", "c:session", owner, "ID", UUID.randomUUID().toString());
                }
            };
        }

        @Override
        public void close() throws IOException {
            conn.close();
        }
    }

    static Worker rawWorker(int port, int i) throws IOException {
        Raw conn = new Raw(port);
        String owner = "raw:" + i;
        return new Worker() {
            @Override
            public void acquire() throws IOException {
                conn.call("FLOCK.ACQUIRE", "c:raw", owner, "30000", "WAIT", "0");
            }

            @Override
            public void release() throws IOException {
                conn.call("FLOCK.RELEASE", "c:raw", owner);
            }
        };
    }

    static Worker apiWorker(FlockLock lock) {
        return new Worker() {
            @Override
            public void acquire() {
                lock.lock();
            }

            @Override
            public void release() {
                lock.unlock();
            }
        };
    }

    // --- who knows first ---

    /** scripts/partition-proxy.py in front of the server. */
    static final class Proxy implements AutoCloseable {
        final Process process;
        final BufferedReader out;
        final OutputStream in;
        final int port;

        Proxy(int serverPort) throws IOException {
            String script = System.getenv().getOrDefault("PARTITION_PROXY", "scripts/partition-proxy.py");
            process = new ProcessBuilder("python3", script, "127.0.0.1:" + serverPort)
                    .redirectError(ProcessBuilder.Redirect.INHERIT).start();
            out = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
            in = process.getOutputStream();
            port = Integer.parseInt(out.readLine().trim());
        }

        void say(String what) throws IOException {
            in.write((what + "\n").getBytes(StandardCharsets.UTF_8));
            in.flush();
            String answer = out.readLine();
            if (!"ok".equals(answer)) {
                throw new IOException("the proxy answered " + answer + " to " + what);
            }
        }

        @Override
        public void close() {
            try {
                say("quit");
                process.waitFor();
            } catch (IOException ignored) {
                process.destroy(); // gone already, or stuck
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    enum Kind { SESSION, LEASE, WATCHDOG }

    static long flockWaiters(Raw admin) throws IOException {
        String info = (String) admin.call("INFO", "flock");
        for (String line : info.split("\r\n")) {
            if (line.startsWith("flock_waiters:")) {
                return Long.parseLong(line.substring("flock_waiters:".length()).trim());
            }
        }
        throw new IOException("no flock_waiters in INFO");
    }

    /** The trials of a configuration, over its rounds. */
    static final class Trials {
        final List<Double> gaps = new ArrayList<>();
        final List<Double> late = new ArrayList<>();
        final TreeSet<String> reasons = new TreeSet<>();
        int grantFirst;
        int unheard;
    }

    /**
     * One round: {@code keys} locks held through a new proxy as {@code kind} says ({@code ms}: the session
     * timeout, the lease or the watchdog's lease), a waiter each, then the cut, {@code delayMs} after the waiters
     * queued.
     */
    static void round(int port, String name, int n, Kind kind, long ms, int keys, long delayMs, Trials trials)
            throws Exception {
        try (Raw admin = new Raw(port); Proxy proxy = new Proxy(port)) {
            var factory = RespConnection.factory("127.0.0.1", proxy.port);
            FlockClient holder = switch (kind) {
                case SESSION -> new FlockClient(factory, new FlockConfig().setSessionTimeout(Duration.ofMillis(ms)));
                case LEASE -> new FlockClient(factory, new FlockConfig().setSessionTimeout(Duration.ofSeconds(10)));
                case WATCHDOG -> new FlockClient(factory, ms, false);
            };
            Map<String, Long> lostAt = new ConcurrentHashMap<>();
            Map<String, String> reasons = new ConcurrentHashMap<>();
            holder.setLeaseLostListener((lock, thread, token, reason) -> {
                lostAt.putIfAbsent(lock, System.nanoTime());
                reasons.putIfAbsent(lock, reason);
            });
            String[] key = new String[keys];
            long[] granted = new long[keys];
            CountDownLatch go = new CountDownLatch(1);
            CountDownLatch done = new CountDownLatch(keys);
            List<Raw> conns = new ArrayList<>();
            for (int i = 0; i < keys; i++) {
                key[i] = "f:" + name + ":" + n + ":" + i;
                Raw conn = new Raw(port);
                conns.add(conn);
                int index = i;
                Thread t = new Thread(() -> {
                    try {
                        go.await();
                        conn.call("FLOCK.ACQUIRE", key[index], "w", "30000", "WAIT", "0");
                        granted[index] = System.nanoTime();
                        conn.call("FLOCK.RELEASE", key[index], "w");
                    } catch (Exception e) {
                        e.printStackTrace();
                    } finally {
                        done.countDown();
                    }
                });
                t.setDaemon(true);
                t.start();
            }
            // a fixed lease's local deadline is no earlier than the acquire's call + the lease - the drift margin
            long[] deadlineFloor = new long[keys];
            List<FlockLock> locks = new ArrayList<>();
            for (int i = 0; i < keys; i++) {
                FlockLock lock = holder.getFairLock(key[i]);
                long before = System.nanoTime();
                boolean taken = kind == Kind.LEASE ? lock.tryLock(0, ms, TimeUnit.MILLISECONDS) : lock.tryLock();
                if (!taken) {
                    throw new IllegalStateException("the holder was not granted " + key[i]);
                }
                deadlineFloor[i] = before + TimeUnit.MILLISECONDS.toNanos(ms - (10 + ms / 100));
                locks.add(lock);
            }
            if (kind == Kind.WATCHDOG) {
                Thread.sleep(2 * ms); // a few renewals first, so that the grants outlive their lease
            }
            go.countDown();
            long queued = System.nanoTime();
            while (flockWaiters(admin) < keys) {
                if (System.nanoTime() - queued > TimeUnit.SECONDS.toNanos(10)) {
                    throw new IllegalStateException("the waiters did not queue");
                }
                Thread.sleep(1);
            }
            Thread.sleep(delayMs);
            proxy.say("cut");
            if (!done.await(60, TimeUnit.SECONDS)) {
                throw new IllegalStateException("the waiters were not granted");
            }
            long settle = System.nanoTime() + TimeUnit.SECONDS.toNanos(2);
            while (lostAt.size() < keys && System.nanoTime() < settle) {
                Thread.sleep(1);
            }
            proxy.say("heal");
            for (FlockLock lock : locks) {
                try {
                    lock.unlock();
                } catch (RuntimeException expected) {
                    // lost: IllegalMonitorStateException
                }
            }
            holder.close();
            for (Raw conn : conns) {
                conn.close();
            }
            for (int i = 0; i < keys; i++) {
                trials.reasons.add(reasons.getOrDefault(key[i], "none"));
                Long lost = lostAt.get(key[i]);
                if (lost == null) {
                    trials.unheard++;
                    continue;
                }
                double gap = (granted[i] - lost) / 1e6;
                if (gap < 0) {
                    trials.grantFirst++;
                }
                trials.gaps.add(gap);
                if (kind == Kind.LEASE) {
                    trials.late.add((lost - deadlineFloor[i]) / 1e6);
                }
            }
        }
    }

    /**
     * A configuration: {@code rounds} rounds of {@code keys} locks, each cut at a random time up to
     * {@code maxDelayMs} after its waiters queued (anywhere in the heartbeat's or the renewals' cycle).
     */
    static void trial(int port, String name, Kind kind, long ms, int rounds, int keys, long maxDelayMs)
            throws Exception {
        Trials t = new Trials();
        for (int n = 0; n < rounds; n++) {
            long delay = maxDelayMs > 0 ? ThreadLocalRandom.current().nextLong(maxDelayMs) : 0;
            round(port, name, n, kind, ms, keys, delay, t);
        }
        double[] g = sorted(t.gaps);
        String late = t.late.isEmpty() ? "n/a" : String.format("&le; %.2f", pct(sorted(t.late), 0.99));
        OUT.printf("| Java | %s | %d (%d x %d) | %.1f | %.1f | %.1f | %d | %s | %s%s |%n", name, rounds * keys,
                rounds, keys, g[0], pct(g, 0.5), pct(g, 0.99), t.grantFirst + t.unheard, late,
                String.join(", ", t.reasons), t.unheard > 0 ? ", " + t.unheard + " never heard" : "");
    }

    static void first(int port) throws Exception {
        trial(port, "session 200 ms", Kind.SESSION, 200, 10, 10, 150);
        trial(port, "session 1 s", Kind.SESSION, 1000, 5, 20, 700);
        trial(port, "session 10 s", Kind.SESSION, 10_000, 2, 25, 7000);
        trial(port, "lease 500 ms", Kind.LEASE, 500, 2, 50, 0);
        trial(port, "watchdog 600 ms", Kind.WATCHDOG, 600, 4, 25, 300);
    }

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        switch (args[1]) {
            case "overhead" -> overhead(port);
            case "contended" -> contended(port);
            case "first" -> first(port);
            default -> throw new IllegalArgumentException("overhead, contended or first: " + args[1]);
        }
        System.exit(0);
    }
}
