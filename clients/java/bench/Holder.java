import io.flock.FlockClient;
import io.flock.FlockConfig;
import io.flock.FlockLock;
import io.flock.RespConnection;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.stream.Collectors;

/**
 * The Java holder of {@code clients/python/bench/silences.py} ({@code make bench-clients}, no false expiry), as
 * {@code bench/holder.py} is Python's: {@code java Holder PORT session MS KEYS PREFIX} (the arguments of every holder; this one holds session grants only) holds KEYS locks (session grants,
 * {@code tryLock()} of a {@link FlockClient} with a session timeout of MS) on one thread, prints {@code held}, and on
 * the line {@code report} on its stdin prints {@code {"lost": {key: reason, ...}}}: what the
 * {@code LeaseLostListener} heard, and any grant {@code isLeaseLost()} finds gone by the clock.
 */
public final class Holder {
    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        if (!args[1].equals("session")) {
            throw new IllegalArgumentException("holds session grants only, not " + args[1]);
        }
        long ms = Long.parseLong(args[2]);
        int keys = Integer.parseInt(args[3]);
        String prefix = args[4];
        Map<String, String> lost = new ConcurrentHashMap<>();
        try (FlockClient client = new FlockClient(RespConnection.factory("127.0.0.1", port),
                new FlockConfig().setSessionTimeout(Duration.ofMillis(ms)))) {
            client.setLeaseLostListener((lock, thread, token, reason) -> lost.putIfAbsent(lock, reason.toString()));
            List<FlockLock> locks = new ArrayList<>();
            for (int i = 0; i < keys; i++) {
                FlockLock lock = client.getFairLock(prefix + ":" + i);
                if (!lock.tryLock()) {
                    throw new IllegalStateException("not granted: " + prefix + ":" + i);
                }
                locks.add(lock);
            }
            System.out.println("held");
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            for (String line; (line = in.readLine()) != null; ) {
                if (line.trim().equals("report")) {
                    for (FlockLock lock : locks) {
                        if (lock.isLeaseLost()) {
                            lost.putIfAbsent(lock.getName(), lock.getLeaseLostReason().toString());
                        }
                    }
                    System.out.println("{\"lost\": {" + lost.entrySet().stream()
                            .map(e -> "\"" + e.getKey() + "\": \"" + e.getValue() + "\"")
                            .collect(Collectors.joining(", ")) + "}}");
                    break;
                }
            }
        }
        // The client's threads are no daemons; the report is all this process is for.
        System.exit(0);
    }
}
