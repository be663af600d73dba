import io.flock.FlockClient;
import io.flock.FlockLock;

import java.io.BufferedInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * One process of the mixed fleet (test_mixed_fleet.py) on the Java client: THREADS threads take the
 * keys at random with {@code FlockLock} and log each request, grant and release through the fleet's
 * script (on a plain RESP connection of their own: the client has no general command API), until the
 * script's answer to a request's log says the test has seen enough (or SECONDS pass). Prints its
 * counts as one JSON line.
 *
 * <p>java -cp flock-client.jar FleetWorker.java PORT SHA SECONDS THREADS KEY... (or compiled: FleetWorker)
 */
public class FleetWorker {
    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        String sha = args[1];
        long end = System.nanoTime() + (long) (Double.parseDouble(args[2]) * 1e9);
        int threads = Integer.parseInt(args[3]);
        String[] keys = java.util.Arrays.copyOfRange(args, 4, args.length);
        String who = "flock-java-" + ProcessHandle.current().pid();
        AtomicInteger grants = new AtomicInteger(), timeouts = new AtomicInteger(), errors = new AtomicInteger();
        try (FlockClient client = FlockClient.create("127.0.0.1", port)) {
            Thread[] all = new Thread[threads];
            for (int t = 0; t < threads; t++) {
                all[t] = new Thread(() -> {
                    try (Socket socket = new Socket("127.0.0.1", port)) {
                        OutputStream out = socket.getOutputStream();
                        InputStream in = new BufferedInputStream(socket.getInputStream());
                        ThreadLocalRandom random = ThreadLocalRandom.current();
                        while (System.nanoTime() < end) {
                            String key = keys[random.nextInt(keys.length)];
                            if (log(out, in, sha, key, who, "req", 0) == 1) {
                                break;
                            }
                            FlockLock lock = client.getFairLock(key);
                            if (!lock.tryLock(10, 5, TimeUnit.SECONDS)) {
                                timeouts.incrementAndGet();
                                continue;
                            }
                            grants.incrementAndGet();
                            log(out, in, sha, key, who, "acq", 1);
                            Thread.sleep(1 + random.nextInt(3));
                            log(out, in, sha, key, who, "rel", -1);
                            lock.unlock();
                            Thread.sleep(random.nextInt(10));
                        }
                    } catch (Exception e) {
                        e.printStackTrace();
                        errors.incrementAndGet();
                    }
                });
                all[t].start();
            }
            for (Thread t : all) {
                t.join();
            }
        }
        System.out.printf("{\"side\": \"flock (Java)\", \"grants\": %d, \"timeouts\": %d, \"wrongtype\": 0, \"errors\": [%s]}%n",
                grants.get(), timeouts.get(), errors.get() == 0 ? "" : "\"" + errors.get() + " threads failed\"");
    }

    /** EVALSHA of the fleet's script; its integer reply is 1 once the test has seen enough. */
    static long log(OutputStream out, InputStream in, String sha, String key, String who, String what, int delta)
            throws IOException {
        String[] words = {"EVALSHA", sha, "3", "fleet:events", "fleet:occupancy:" + key, "fleet:stop",
            key + " flock " + who + " " + what, Integer.toString(delta)};
        StringBuilder command = new StringBuilder("*" + words.length + "\r\n");
        for (String w : words) {
            command.append('$').append(w.getBytes(StandardCharsets.UTF_8).length).append("\r\n").append(w).append("\r\n");
        }
        out.write(command.toString().getBytes(StandardCharsets.UTF_8));
        out.flush();
        StringBuilder reply = new StringBuilder();
        for (int c = in.read(); c != '\n'; c = in.read()) {
            if (c < 0) {
                throw new IOException("connection closed");
            }
            reply.append((char) c);
        }
        if (reply.charAt(0) != ':') {
            throw new IOException("the fleet's script answered " + reply);
        }
        return Long.parseLong(reply.substring(1).trim());
    }
}
