package io.flock;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A TCP proxy in front of the test server that can lose a reply: once armed with a command name, it forwards
 * the next command containing that name to the server, reads the server's reply (so the command was
 * applied) and then closes the client's connection instead of passing the reply on; or it loses the command
 * itself. It can also hold back what the server sends on a FLOCK session's connection, so that an event
 * reaches the client late. And it can cut every connection through it as a partition does ({@link #partition}):
 * nothing is read from either socket until {@link #heal}, so nothing flows and nothing is lost, and no socket is
 * closed meanwhile (a close of either end is passed on after the heal, as TCP would).
 */
final class DroppingProxy implements AutoCloseable {
    private static final byte[] INBOX = "FLOCK.INBOX".getBytes(StandardCharsets.UTF_8);
    private final ServerSocket listener = new ServerSocket(0);
    private final int upstreamPort;
    private volatile byte[] armed;
    /** Whether an armed command reaches the server (its reply is lost) or is lost itself. */
    private volatile boolean forwardArmed;
    private final AtomicInteger dropsLeft = new AtomicInteger();
    private volatile long sessionDelayMs;
    private volatile CountDownLatch sessionHeld;
    final AtomicInteger dropped = new AtomicInteger();
    private final Object gate = new Object();
    private boolean cut;

    DroppingProxy(int upstreamPort) throws IOException {
        this.upstreamPort = upstreamPort;
        daemon(this::acceptLoop);
    }

    int port() {
        return listener.getLocalPort();
    }

    /** Loses the replies to the next {@code times} commands that contain {@code command}. */
    void dropRepliesTo(String command, int times) {
        arm(command, times, true);
    }

    /** Loses the next {@code times} commands that contain {@code command} before the server reads them. */
    void dropCommands(String command, int times) {
        arm(command, times, false);
    }

    private void arm(String command, int times, boolean forward) {
        forwardArmed = forward;
        armed = command.getBytes(StandardCharsets.UTF_8);
        dropsLeft.set(times);
    }

    /** Passes on what the server sends on a session connection (one that read FLOCK.INBOX) {@code ms} late. */
    void delaySessionReplies(long ms) {
        sessionDelayMs = ms;
    }

    /** Holds what the server sends on a session connection until {@link #passSessionReplies}. */
    void holdSessionReplies() {
        sessionHeld = new CountDownLatch(1);
    }

    void passSessionReplies() {
        sessionHeld.countDown();
    }

    /** Carries nothing either way from now on, keeping every socket open, until {@link #heal}. */
    void partition() {
        synchronized (gate) {
            cut = true;
        }
    }

    /** Carries the bytes again, those held back first. */
    void heal() {
        synchronized (gate) {
            cut = false;
            gate.notifyAll();
        }
    }

    private void awaitHealed() throws InterruptedException {
        synchronized (gate) {
            while (cut) {
                gate.wait();
            }
        }
    }

    private void acceptLoop() {
        try {
            while (true) {
                Socket client = listener.accept();
                Socket server = new Socket("127.0.0.1", upstreamPort);
                AtomicBoolean loseReply = new AtomicBoolean();
                AtomicBoolean session = new AtomicBoolean();
                daemon(() -> pump(client, server, loseReply, session, true));
                daemon(() -> pump(server, client, loseReply, session, false));
            }
        } catch (IOException closed) {
            // the test is over
        }
    }

    private void pump(Socket from, Socket to, AtomicBoolean loseReply, AtomicBoolean session, boolean toServer) {
        byte[] buf = new byte[65536];
        try (from; to) {
            InputStream in = from.getInputStream();
            OutputStream out = to.getOutputStream();
            while (true) {
                awaitHealed();
                int n = in.read(buf);
                awaitHealed(); // what came while cut (or the close of this end) waits for the heal
                if (n <= 0) {
                    break;
                }
                if (toServer && matches(buf, n)) {
                    if (!forwardArmed) {
                        dropped.incrementAndGet();
                        return; // closes both sockets: the server never reads the command
                    }
                    loseReply.set(true);
                }
                if (toServer && contains(buf, n, INBOX)) {
                    session.set(true);
                }
                if (!toServer && loseReply.get()) {
                    dropped.incrementAndGet();
                    return; // closes both sockets: the client never sees the reply
                }
                if (!toServer && session.get()) {
                    CountDownLatch held = sessionHeld;
                    if (held != null) {
                        held.await();
                    }
                    Thread.sleep(sessionDelayMs);
                }
                out.write(buf, 0, n);
                out.flush();
            }
        } catch (IOException closed) {
            // the other pump closed the pair
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private boolean matches(byte[] buf, int n) {
        byte[] command = armed;
        if (command == null || !contains(buf, n, command)) {
            return false;
        }
        return dropsLeft.getAndUpdate(left -> Math.max(0, left - 1)) > 0;
    }

    private static boolean contains(byte[] buf, int n, byte[] word) {
        return new String(buf, 0, n, StandardCharsets.ISO_8859_1)
                .contains(new String(word, StandardCharsets.ISO_8859_1));
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
