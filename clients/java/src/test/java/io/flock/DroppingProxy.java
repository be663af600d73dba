package io.flock;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A TCP proxy in front of the test server that can lose a reply: once armed with a command name, it forwards
 * the next command containing that name to the server, reads the server's reply (so the command was
 * applied) and then closes the client's connection instead of passing the reply on.
 */
final class DroppingProxy implements AutoCloseable {
    private final ServerSocket listener = new ServerSocket(0);
    private final int upstreamPort;
    private volatile byte[] armed;
    private final AtomicInteger dropsLeft = new AtomicInteger();
    final AtomicInteger dropped = new AtomicInteger();

    DroppingProxy(int upstreamPort) throws IOException {
        this.upstreamPort = upstreamPort;
        daemon(this::acceptLoop);
    }

    int port() {
        return listener.getLocalPort();
    }

    /** Loses the replies to the next {@code times} commands that contain {@code command}. */
    void dropRepliesTo(String command, int times) {
        armed = command.getBytes(StandardCharsets.UTF_8);
        dropsLeft.set(times);
    }

    private void acceptLoop() {
        try {
            while (true) {
                Socket client = listener.accept();
                Socket server = new Socket("127.0.0.1", upstreamPort);
                AtomicBoolean loseReply = new AtomicBoolean();
                daemon(() -> pump(client, server, loseReply, true));
                daemon(() -> pump(server, client, loseReply, false));
            }
        } catch (IOException closed) {
            // the test is over
        }
    }

    private void pump(Socket from, Socket to, AtomicBoolean loseReply, boolean toServer) {
        byte[] buf = new byte[65536];
        try (from; to) {
            InputStream in = from.getInputStream();
            OutputStream out = to.getOutputStream();
            for (int n; (n = in.read(buf)) > 0; ) {
                if (toServer && matches(buf, n)) {
                    loseReply.set(true);
                }
                if (!toServer && loseReply.get()) {
                    dropped.incrementAndGet();
                    return; // closes both sockets: the client never sees the reply
                }
                out.write(buf, 0, n);
                out.flush();
            }
        } catch (IOException closed) {
            // the other pump closed the pair
        }
    }

    private boolean matches(byte[] buf, int n) {
        byte[] command = armed;
        if (command == null || !new String(buf, 0, n, StandardCharsets.ISO_8859_1)
                .contains(new String(command, StandardCharsets.ISO_8859_1))) {
            return false;
        }
        return dropsLeft.getAndUpdate(left -> Math.max(0, left - 1)) > 0;
    }

    private static void daemon(Runnable body) {
        Thread t = new Thread(body, "dropping-proxy");
        t.setDaemon(true);
        t.start();
    }

    @Override
    public void close() throws IOException {
        listener.close();
    }
}
