import io.flock.FlockClient;
import io.flock.FlockLock;
import java.net.Socket;
import java.io.*;
import java.util.concurrent.CountDownLatch;

/**
 * `make bench-clients`: one process's waiting threads through the Java client. Prints how many
 * connections the waits add, the server memory per waiter (INFO used_memory once idle buffers
 * shrank) and how long a holder takes to hear of FLOCK.FORCERELEASE. Arguments: port, waiters.
 */
public class Waiters {
    static String info(int port, String section, String field) throws Exception {
        try (Socket s = new Socket("127.0.0.1", port)) {
            OutputStream o = s.getOutputStream();
            o.write(("INFO " + section + "\r\n").getBytes());
            BufferedReader r = new BufferedReader(new InputStreamReader(s.getInputStream()));
            String head = r.readLine();
            int len = Integer.parseInt(head.substring(1));
            char[] buf = new char[len];
            int read = 0;
            while (read < len) read += r.read(buf, read, len - read);
            for (String line : new String(buf).split("\r\n")) if (line.startsWith(field + ":")) return line.substring(field.length() + 1);
            return null;
        }
    }
    static long settled(int port) throws Exception {
        Thread.sleep(4000);
        long last = Long.parseLong(info(port, "memory", "used_memory"));
        for (int i = 0; i < 30; i++) {
            Thread.sleep(500);
            long now = Long.parseLong(info(port, "memory", "used_memory"));
            if (Math.abs(now - last) <= now / 1000) return now;
            last = now;
        }
        return last;
    }
    public static void main(String[] a) throws Exception {
        int port = Integer.parseInt(a[0]);
        int n = Integer.parseInt(a[1]);
        FlockClient client = FlockClient.create("127.0.0.1", port);
        FlockLock lock = client.getFairLock("m");
        lock.lock();
        long c0 = Long.parseLong(info(port, "clients", "connected_clients"));
        long m0 = settled(port);
        CountDownLatch done = new CountDownLatch(n);
        for (int i = 0; i < n; i++) {
            Thread t = new Thread(() -> { lock.lock(); lock.unlock(); done.countDown(); });
            t.setDaemon(true);
            t.start();
        }
        while (Long.parseLong(info(port, "flock", "flock_waiters")) < n) {
            Thread.sleep(10);
        }
        long c1 = Long.parseLong(info(port, "clients", "connected_clients"));
        long m1 = settled(port);
        System.out.printf("| Java `FlockLock.lock()` (threads) | %d | %d | %d B |", n, c1 - c0, (m1 - m0) / n);
        lock.unlock();
        done.await();
        // A holder hears of FORCERELEASE.
        FlockLock f = client.getFairLock("f");
        f.lock();
        long sent = System.nanoTime();
        try (Socket s = new Socket("127.0.0.1", port)) {
            s.getOutputStream().write("FLOCK.FORCERELEASE f\r\n".getBytes());
            s.getInputStream().read();
            while (!f.isLeaseLost()) Thread.onSpinWait();
        }
        System.out.printf(" %.2f ms |%n", (System.nanoTime() - sent) / 1e6);
        client.close();
    }
}
