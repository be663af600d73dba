import io.flock.FlockClient;
import io.flock.FlockLock;
import java.util.concurrent.TimeUnit;

public class QuickStart {
    public static void main(String[] args) throws Exception {
        String host = args.length > 0 ? args[0] : "127.0.0.1";
        int port = args.length > 1 ? Integer.parseInt(args[1]) : 6379;
        try (FlockClient client = FlockClient.create(host, port)) {
            FlockLock lock = client.getFairLock("orders:42");
            // Queue (FIFO) for up to 5 s; no lease given, so it lives with the client's session.
            if (lock.tryLock(5, -1, TimeUnit.SECONDS)) {
                try {
                    long token = lock.getToken(); // fencing token: pass it to the protected resource
                    System.out.println("holding orders:42 with token " + token);
                    // Data in Redis: written only while this grant holds the lock (FLOCK.FENCED), in one step;
                    // once it ended, StaleTokenException and nothing runs. The key's {hash tag} is the lock's slot.
                    lock.fenced("HSET", "{orders:42}:row", "status", "paid");
                } finally {
                    lock.unlock();
                }
            }
        }
    }
}
