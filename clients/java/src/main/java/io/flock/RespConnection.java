package io.flock;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.ByteArrayOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * The built-in connection: a plain {@link Socket} speaking RESP2. No read timeout, since a FLOCK wait may
 * block for as long as its WAIT allows. One command at a time per connection (calls are synchronized).
 */
public final class RespConnection implements FlockConnection {
    private static final int CONNECT_TIMEOUT_MS = 5_000;

    private final Socket socket;
    private final InputStream in;
    private final OutputStream out;

    public RespConnection(String host, int port) throws IOException {
        socket = new Socket();
        try {
            socket.connect(new InetSocketAddress(host, port), CONNECT_TIMEOUT_MS);
            socket.setTcpNoDelay(true);
            in = new BufferedInputStream(socket.getInputStream());
            out = new BufferedOutputStream(socket.getOutputStream());
        } catch (IOException e) {
            socket.close();
            throw e;
        }
    }

    /** A factory of connections to {@code host:port}. */
    public static ConnectionFactory factory(String host, int port) {
        return () -> new RespConnection(host, port);
    }

    @Override
    public synchronized Object call(byte[]... args) throws IOException {
        out.write(header('*', args.length));
        for (byte[] arg : args) {
            out.write(header('$', arg.length));
            out.write(arg);
            out.write('\r');
            out.write('\n');
        }
        out.flush();
        Object reply = read();
        if (reply instanceof RedisError) {
            throw (RedisError) reply;
        }
        return reply;
    }

    /** Convenience for string arguments (UTF-8). */
    public Object call(String... args) throws IOException {
        byte[][] bytes = new byte[args.length][];
        for (int i = 0; i < args.length; i++) {
            bytes[i] = args[i].getBytes(StandardCharsets.UTF_8);
        }
        return call(bytes);
    }

    @Override
    public void close() throws IOException {
        socket.close();
    }

    private static byte[] header(char type, int n) {
        return (type + Integer.toString(n) + "\r\n").getBytes(StandardCharsets.US_ASCII);
    }

    /** One reply; an error reply is returned (not thrown) so that errors inside arrays keep their place. */
    private Object read() throws IOException {
        int type = in.read();
        if (type < 0) {
            throw new EOFException("connection closed before the reply");
        }
        String line = line();
        switch (type) {
            case '+':
                return line;
            case '-':
                return new RedisError(line);
            case ':':
                return Long.parseLong(line);
            case '$': {
                int n = Integer.parseInt(line);
                if (n < 0) {
                    return null;
                }
                byte[] data = in.readNBytes(n);
                if (data.length < n || in.read() != '\r' || in.read() != '\n') {
                    throw new EOFException("connection closed inside a bulk reply");
                }
                return data;
            }
            case '*': {
                int n = Integer.parseInt(line);
                if (n < 0) {
                    return null;
                }
                List<Object> items = new ArrayList<>(n);
                for (int i = 0; i < n; i++) {
                    items.add(read());
                }
                return items;
            }
            default:
                throw new IOException("not a RESP2 reply (type byte " + type + ")");
        }
    }

    private String line() throws IOException {
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        for (int b = in.read(); b != '\r'; b = in.read()) {
            if (b < 0) {
                throw new EOFException("connection closed inside a reply");
            }
            buf.write(b);
        }
        if (in.read() != '\n') {
            throw new IOException("RESP line without LF");
        }
        return buf.toString(StandardCharsets.UTF_8);
    }
}
