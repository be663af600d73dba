import io.flock.FlockClient;
import io.flock.FlockMultiLock;
import java.util.concurrent.TimeUnit;

public class SeveralLocks {
    public static void main(String[] args) throws Exception {
        String host = args.length > 0 ? args[0] : "127.0.0.1";
        int port = args.length > 1 ? Integer.parseInt(args[1]) : 6379;
        try (FlockClient client = FlockClient.create(host, port)) {
            // One hash tag, so that on a Cluster both keys are in one slot.
            FlockMultiLock both = client.getMultiLock("{account:42}:from", "{account:42}:to");
            // Both or neither: FLOCK.ACQUIREALL 2 {account:42}:from {account:42}:to <owner> 30000 WAIT 5000
            if (both.tryLock(5, -1, TimeUnit.SECONDS)) {
                try {
                    System.out.println("holding both with tokens " + both.getTokens()); // one per key, in order
                } finally {
                    both.unlock();       // FLOCK.RELEASEALL 2 ...: both at once
                }
            }
        }
    }
}
