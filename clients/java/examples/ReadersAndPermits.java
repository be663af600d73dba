import io.flock.FlockClient;
import io.flock.FlockReadWriteLock;
import io.flock.FlockSemaphore;

public class ReadersAndPermits {
    public static void main(String[] args) throws Exception {
        String host = args.length > 0 ? args[0] : "127.0.0.1";
        int port = args.length > 1 ? Integer.parseInt(args[1]) : 6379;
        try (FlockClient client = FlockClient.create(host, port)) {
            FlockReadWriteLock rw = client.getReadWriteLock("report");
            rw.readLock().lock();        // FLOCK.ACQUIRE report <owner> 0 SHARED ...: many readers at once
            try {
                System.out.println("reading report with token " + rw.readLock().getToken());
            } finally {
                rw.readLock().unlock();
            }
            FlockSemaphore jobs = client.getSemaphore("api-slots", 3);
            jobs.acquire(2);             // FLOCK.ACQUIRE api-slots <owner> 0 PERMITS 2 LIMIT 3 ...
            try {
                System.out.println("2 of 3 api-slots held, " + jobs.availablePermits() + " free");
            } finally {
                jobs.release();          // both permits return at once
            }
        }
    }
}
