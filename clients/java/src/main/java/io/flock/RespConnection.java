package io.flock;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.ByteArrayOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.function.Function;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.SSLSocketFactory;
import javax.net.ssl.TrustManagerFactory;

/**
 * The built-in connection: a {@link Socket} (TLS for {@code rediss://}) speaking RESP2, authenticated and on its
 * database as a {@link FlockConfig} says. Each reply has the config's command timeout, plus what a blocking
 * command may block on the server, since a FLOCK wait may block for as long as its WAIT allows. One command at
 * a time per connection (calls are synchronized).
 */
public final class RespConnection implements FlockConnection, Pipelined, Timed {
    private final Socket socket;
    private final InputStream in;
    private final OutputStream out;
    private final int timeoutMs;

    /**
     * A plain connection to {@code host:port} with {@link FlockConfig}'s defaults (no AUTH, database 0).
     *
     * @param host the server's host name or address
     * @param port its port
     * @throws IOException if it cannot connect
     */
    public RespConnection(String host, int port) throws IOException {
        this(new FlockConfig(), null, host, port);
    }

    /**
     * A connection as {@code config} says: connected, TLS handshake done, {@code AUTH} and {@code SELECT} sent.
     *
     * @param config the address, credentials, database, timeouts and TLS options
     * @throws IOException if it cannot connect (a {@link java.net.SocketTimeoutException} after the connect
     *     timeout, an {@link javax.net.ssl.SSLException} when TLS fails), or cannot read the TLS files
     * @throws RedisError if the server refuses {@code AUTH} ({@code WRONGPASS}) or {@code SELECT}
     */
    public RespConnection(FlockConfig config) throws IOException {
        this(config, tls(config), config.host, config.port);
    }

    private RespConnection(FlockConfig config, SSLSocketFactory tls, String host, int port) throws IOException {
        if (config.username != null && config.password == null) {
            throw new IllegalArgumentException("a username needs a password (FlockConfig.setPassword)");
        }
        Socket plain = new Socket();
        Socket connected = plain;
        try {
            plain.connect(new InetSocketAddress(host, port), config.connectTimeoutMs);
            plain.setTcpNoDelay(true);
            if (tls != null) {
                connected = handshake(tls, plain, host, port, config);
            }
            socket = connected;
            in = new BufferedInputStream(socket.getInputStream());
            out = new BufferedOutputStream(socket.getOutputStream());
            timeoutMs = config.timeoutMs;
            if (config.password != null) {
                setUp(config, new FlockConfig.Address(host, port, config.ssl).uri(), "AUTH", config.username == null ? new String[] {"AUTH", config.password}
                        : new String[] {"AUTH", config.username, config.password});
            }
            if (config.database != 0) {
                setUp(config, new FlockConfig.Address(host, port, config.ssl).uri(), "SELECT", "SELECT", Integer.toString(config.database));
            }
        } catch (IOException | RuntimeException e) {
            connected.close();
            throw e;
        }
    }

    /**
     * A factory of connections to {@code host:port} with {@link FlockConfig}'s defaults.
     *
     * @param host the server's host name or address
     * @param port its port
     * @return the factory
     */
    public static ConnectionFactory factory(String host, int port) {
        return () -> new RespConnection(host, port);
    }

    /**
     * A factory of connections as {@code config} says; its TLS files are read once, here.
     *
     * @param config the address, credentials, database, timeouts and TLS options
     * @return the factory
     * @throws UncheckedIOException if a TLS file cannot be read
     */
    public static ConnectionFactory factory(FlockConfig config) {
        return factories(config).apply(new FlockConfig.Address(config.host, config.port, config.ssl));
    }

    /**
     * Factories of connections as {@code config} says to any server (a Cluster's nodes, the master a Sentinel
     * names); its TLS files are read once, here.
     */
    static Function<FlockConfig.Address, ConnectionFactory> factories(FlockConfig config) {
        SSLSocketFactory tls;
        try {
            tls = tls(config);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return server -> () -> new RespConnection(config, tls, server.host(), server.port());
    }

    /** AUTH or SELECT: an error reply says which connection refused what, and is thrown with its code first. */
    private void setUp(FlockConfig config, String where, String what, String... args) throws IOException {
        try {
            call(args);
        } catch (RedisError e) {
            String as = what.equals("AUTH") ? " as user '" + (config.username == null ? "default" : config.username)
                    + "'" : " " + config.database;
            throw new RedisError(e.getMessage() + " (" + what + as + " on " + where + ")");
        }
    }

    /** The TLS socket factory for a rediss:// config (null for redis://). */
    private static SSLSocketFactory tls(FlockConfig config) throws IOException {
        if (!config.ssl) {
            return null;
        }
        try {
            TrustManagerFactory trust = null;
            if (config.sslTruststore != null || config.sslCaCertificate != null) {
                KeyStore trusted = config.sslTruststore != null
                        ? keyStore(config.sslTruststore, config.sslTruststorePassword)
                        : caCertificates(config.sslCaCertificate);
                trust = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
                trust.init(trusted);
            }
            KeyManagerFactory keys = null;
            if (config.sslKeystore != null) {
                keys = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
                keys.init(keyStore(config.sslKeystore, config.sslKeystorePassword), password(config.sslKeystorePassword));
            }
            SSLContext context = SSLContext.getInstance("TLS");
            // null managers: the JDK's defaults (cacerts; no client certificate)
            context.init(keys == null ? null : keys.getKeyManagers(), trust == null ? null : trust.getTrustManagers(),
                    null);
            return context.getSocketFactory();
        } catch (GeneralSecurityException e) {
            throw new IOException("cannot set up TLS for " + config.address() + ": " + e.getMessage(), e);
        }
    }

    private static KeyStore keyStore(Path file, String password) throws IOException, GeneralSecurityException {
        // getInstance(File, ...) finds out whether the file is PKCS12 or JKS
        return KeyStore.getInstance(file.toFile(), password(password));
    }

    private static KeyStore caCertificates(Path pem) throws IOException, GeneralSecurityException {
        KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
        store.load(null, null);
        try (InputStream certs = Files.newInputStream(pem)) {
            int i = 0;
            for (Certificate cert : CertificateFactory.getInstance("X.509").generateCertificates(certs)) {
                store.setCertificateEntry("ca-" + i++, cert);
            }
        }
        if (store.size() == 0) {
            throw new IOException("no certificate in " + pem);
        }
        return store;
    }

    private static char[] password(String password) {
        return password == null ? null : password.toCharArray();
    }

    /** The TLS handshake over the connected socket, within the connect timeout. */
    private static SSLSocket handshake(SSLSocketFactory tls, Socket plain, String host, int port, FlockConfig config)
            throws IOException {
        SSLSocket socket = (SSLSocket) tls.createSocket(plain, host, port, true);
        if (config.sslEnableEndpointIdentification) {
            SSLParameters parameters = socket.getSSLParameters();
            parameters.setEndpointIdentificationAlgorithm("HTTPS"); // the certificate must name host
            socket.setSSLParameters(parameters);
        }
        socket.setSoTimeout(config.connectTimeoutMs);
        socket.startHandshake();
        return socket;
    }

    /**
     * Sends one command and reads its reply, within the command timeout (plus what the command may block). An
     * I/O error, a timeout too, closes the connection: a reply still on its way would otherwise answer the next
     * command.
     */
    @Override
    public synchronized Object call(byte[]... args) throws IOException {
        return send(readTimeoutMs(timeoutMs, args), args);
    }

    /**
     * Sends one command and reads its reply within {@code timeoutMs}, whatever the config's command timeout and
     * however long the command may block on the server: FLOCK's client gives the commands it sends for itself
     * (heartbeats, renewals) the time until the deadline they serve. A timeout closes the connection, as in
     * {@link #call(byte[][])}.
     *
     * @param timeoutMs milliseconds, at least 1
     * @param args the command and its arguments
     * @return the reply, mapped as {@link FlockCommands} says
     * @throws IOException if the reply was lost or late (the connection is then closed)
     */
    @Override
    public synchronized Object call(int timeoutMs, byte[]... args) throws IOException {
        return send(Math.max(1, timeoutMs), args);
    }

    private Object send(int readTimeoutMs, byte[][] args) throws IOException {
        Object reply;
        try {
            socket.setSoTimeout(readTimeoutMs);
            write(args);
            out.flush();
            reply = read();
        } catch (IOException e) {
            socket.close();
            throw e;
        }
        if (reply instanceof RedisError) {
            throw (RedisError) reply;
        }
        return reply;
    }

    /** Writes one command in RESP (an array of bulk strings), unflushed. */
    private void write(byte[][] args) throws IOException {
        out.write(header('*', args.length));
        for (byte[] arg : args) {
            out.write(header('$', arg.length));
            out.write(arg);
            out.write('\r');
            out.write('\n');
        }
    }

    /**
     * Sends {@code commands} and then reads their replies: one round trip for all (FLOCK's durable grants send
     * {@code FLOCK.RENEW} and {@code WAIT} so). Each reply has the command timeout plus the longest time one of
     * them may block. An I/O error, a timeout too, closes the connection.
     *
     * @param commands each a command and its arguments
     * @return the replies in order, an error reply as a {@link RedisError} in its place (not thrown)
     * @throws IOException if a reply was lost (the connection is then closed)
     */
    @Override
    public synchronized List<Object> pipeline(byte[][]... commands) throws IOException {
        List<Object> replies = new ArrayList<>(commands.length);
        try {
            int readTimeout = timeoutMs;
            for (byte[][] args : commands) {
                int t = readTimeoutMs(timeoutMs, args);
                readTimeout = readTimeout == 0 || t == 0 ? 0 : Math.max(readTimeout, t);
            }
            socket.setSoTimeout(readTimeout);
            for (byte[][] args : commands) {
                write(args);
            }
            out.flush();
            for (int i = 0; i < commands.length; i++) {
                replies.add(read());
            }
        } catch (IOException e) {
            socket.close();
            throw e;
        }
        return replies;
    }

    /** The socket read timeout for {@code args}: the command timeout plus how long it may block (0: no limit). */
    static int readTimeoutMs(int timeoutMs, byte[][] args) {
        long blocks = blockingMs(args);
        if (timeoutMs == 0 || blocks == 0) {
            return 0;
        }
        return (int) Math.min(Integer.MAX_VALUE, timeoutMs + Math.max(0, blocks));
    }

    /**
     * How long {@code args} may block on the server: -1 not at all, 0 without limit, else milliseconds. Only
     * FLOCK.INBOX t, FLOCK.ACQUIRE ... WAIT t without INBOX (with INBOX the wait answers WAITING at once),
     * FLOCK.ACQUIREALL ... WAIT t and WAIT n t (a durable grant's) block.
     */
    static long blockingMs(byte[][] args) {
        String name = word(args[0]);
        if (name.equals("FLOCK.INBOX")) {
            return args.length > 1 ? number(args[1]) : -1;
        }
        if (name.equals("WAIT")) {
            return args.length > 2 ? number(args[2]) : -1;
        }
        int options; // where options start: after key, owner, lease; ACQUIREALL's after numkeys, keys, owner, lease
        if (name.equals("FLOCK.ACQUIRE")) {
            options = 4;
        } else if (name.equals("FLOCK.ACQUIREALL") && args.length > 1 && number(args[1]) > 0) {
            options = (int) Math.min(args.length, 4 + number(args[1]));
        } else {
            return -1;
        }
        long waitMs = -1;
        for (int i = options; i < args.length; i++) {
            String option = word(args[i]);
            if (option.equals("SESSION") || option.equals("SHARED")) {
                continue;
            }
            if (option.equals("INBOX")) {
                return -1;
            }
            if (option.equals("WAIT") && i + 1 < args.length) {
                waitMs = number(args[i + 1]);
            }
            i++; // every other option has a value, which may look like an option
        }
        return waitMs;
    }

    private static String word(byte[] arg) {
        return new String(arg, StandardCharsets.ISO_8859_1).toUpperCase(Locale.ROOT);
    }

    /** A number of milliseconds, or -1 when it is none (the server answers an error at once). */
    private static long number(byte[] arg) {
        try {
            long n = Long.parseLong(new String(arg, StandardCharsets.ISO_8859_1));
            return n < 0 ? -1 : n;
        } catch (NumberFormatException e) {
            return -1;
        }
    }

    /**
     * {@link #call(byte[][])} with string arguments (UTF-8).
     *
     * @param args the command and its arguments
     * @return the reply, mapped as {@link FlockCommands} says
     * @throws IOException if the reply was lost (the connection is then closed)
     */
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
