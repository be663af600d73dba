package io.flock;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;

/**
 * A holder process for {@link PartitionTest}: takes lock {@code args[2]} on {@code 127.0.0.1:args[0]} with a
 * session timeout of {@code args[1]} ms, prints {@code held}, then for each line read prints what its first
 * {@code isLeaseLost()} after it says ({@code lost <true|false> <reason>}). The test stops it (SIGSTOP) while it
 * waits for that line and lets it go on (SIGCONT) past its deadline.
 */
public final class PausedHolder {
    private PausedHolder() {
    }

    public static void main(String[] args) throws Exception {
        FlockConfig config = new FlockConfig().setAddress("redis://127.0.0.1:" + args[0])
                .setSessionTimeout(Duration.ofMillis(Long.parseLong(args[1])));
        try (FlockClient client = FlockClient.create(config)) {
            FlockLock lock = client.getFairLock(args[2]);
            lock.lock();
            System.out.println("held " + lock.getToken());
            System.out.flush();
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            for (String line; (line = in.readLine()) != null; ) {
                boolean lost = lock.isLeaseLost(); // the first check after the line came
                System.out.println("lost " + lost + " " + lock.getLeaseLostReason());
                System.out.flush();
            }
        }
    }
}
