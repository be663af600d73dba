package io.flock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.CertificateFactory;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.stream.Stream;
import javax.net.ssl.SSLHandshakeException;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;

/**
 * rediss:// against a server with only a TLS port that verifies clients (mutual TLS), its certificate made for
 * "localhost" by a test CA generated with openssl.
 */
class TlsTest extends ServerTest {
    private static Path certs;

    /** This class's server listens on a TLS port only. */
    @Override
    TestServer startServer() throws IOException {
        certs = Files.createTempDirectory("flock-tls");
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=flock test CA");
        signed("server", "subjectAltName=DNS:localhost");
        signed("client", "extendedKeyUsage=clientAuth");
        openssl("pkcs12", "-export", "-in", "client.crt", "-inkey", "client.key", "-out", "client.p12",
                "-passout", "pass:secret");
        return TestServer.startTls(port -> List.of("--port", "0", "--tls-port", Integer.toString(port),
                        "--tls-cert-file", file("server.crt"), "--tls-key-file", file("server.key"),
                        "--tls-ca-cert-file", file("ca.crt"), "--tls-auth-clients", "yes"),
                port -> tls("localhost", port));
    }

    @AfterAll
    static void removeCertificates() throws IOException {
        try (Stream<Path> files = Files.walk(certs)) {
            files.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        }
    }

    /** A key and a certificate for it signed by the test CA, with {@code extension}. */
    private static void signed(String name, String extension) throws IOException {
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                name + ".key", "-out", name + ".csr", "-subj", "/CN=flock test " + name);
        Files.writeString(certs.resolve(name + ".ext"), extension + "\n");
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-set_serial",
                Integer.toString(name.hashCode() & 0xffff), "-days", "2", "-extfile", name + ".ext", "-out", name + ".crt");
    }

    private static void openssl(String... args) throws IOException {
        List<String> command = new ArrayList<>(List.of("openssl"));
        command.addAll(List.of(args));
        Process p = new ProcessBuilder(command).directory(certs.toFile()).redirectErrorStream(true).start();
        String output = new String(p.getInputStream().readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
        try {
            if (p.waitFor() != 0) {
                throw new IOException("openssl " + String.join(" ", args) + " failed:\n" + output);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException(e);
        }
    }

    private static String file(String name) {
        return certs.resolve(name).toString();
    }

    /** rediss://host:port trusting the test CA (a PEM file), with the client certificate. */
    private static FlockConfig tls(String host, int port) {
        return new FlockConfig().setAddress("rediss://" + host + ":" + port)
                .setSslCaCertificate(Path.of(file("ca.crt")))
                .setSslKeystore(Path.of(file("client.p12")), "secret");
    }

    @Test
    void locksWaitsReleasesAndRenewsOverTls() throws Exception {
        lockWaitReleaseAndRenew(tls("localhost", server.port));
    }

    @Test
    void aTrustStoreTrustsTheServerAsTheCaFileDoes() throws Exception {
        KeyStore trust = KeyStore.getInstance("PKCS12");
        trust.load(null, null);
        try (InputStream ca = Files.newInputStream(certs.resolve("ca.crt"))) {
            trust.setCertificateEntry("ca", CertificateFactory.getInstance("X.509").generateCertificate(ca));
        }
        Path store = certs.resolve("trust.p12");
        try (OutputStream out = Files.newOutputStream(store)) {
            trust.store(out, "changeit".toCharArray());
        }
        FlockConfig config = new FlockConfig().setAddress("rediss://localhost:" + server.port)
                .setSslTruststore(store, "changeit").setSslKeystore(Path.of(file("client.p12")), "secret");
        try (RespConnection c = new RespConnection(config)) {
            assertEquals("PONG", c.call("PING"));
        }
    }

    @Test
    void theCertificateMustNameTheHostUnlessVerificationIsTurnedOff() throws Exception {
        // the certificate names localhost, not 127.0.0.1
        SSLHandshakeException wrongName = assertThrows(SSLHandshakeException.class,
                () -> new RespConnection(tls("127.0.0.1", server.port)));
        assertTrue(String.valueOf(wrongName.getMessage()).contains("127.0.0.1"), wrongName.getMessage());
        try (RespConnection c = new RespConnection(tls("127.0.0.1", server.port)
                .setSslEnableEndpointIdentification(false))) {
            assertEquals("PONG", c.call("PING"));
        }
    }

    @Test
    void aServerSignedByAnotherCaIsRefused() {
        // the JDK's default trust (cacerts) does not know the test CA
        FlockConfig untrusted = new FlockConfig().setAddress("rediss://localhost:" + server.port)
                .setSslKeystore(Path.of(file("client.p12")), "secret");
        assertThrows(SSLHandshakeException.class, () -> new RespConnection(untrusted));
    }

    @Test
    void withoutAClientCertificateTheServerRefuses() {
        FlockConfig anonymous = new FlockConfig().setAddress("rediss://localhost:" + server.port)
                .setSslCaCertificate(Path.of(file("ca.crt")));
        // with TLS 1.3 the server refuses after the client's handshake is done: an alert or a closed socket
        assertThrows(IOException.class, () -> {
            try (RespConnection c = new RespConnection(anonymous)) {
                c.call("PING");
            }
        });
    }
}
