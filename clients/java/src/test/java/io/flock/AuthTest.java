package io.flock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.Test;

/** AUTH on every connection: the default user's requirepass password, an ACL user, a wrong password. */
class AuthTest extends ServerTest {
    private static final String ADMIN_PASSWORD = "admin-secret";

    /** This class's server asks for a password and has the ACL user {@code app}. */
    @Override
    TestServer startServer() throws IOException {
        return TestServer.start(port -> List.of("--port", Integer.toString(port), "--requirepass", ADMIN_PASSWORD,
                        "--user", "app", "on", ">app-secret", "~*", "&*", "+@all"),
                port -> address(port).setPassword(ADMIN_PASSWORD));
    }

    private static FlockConfig address(int port) {
        return new FlockConfig().setAddress("redis://127.0.0.1:" + port);
    }

    @Test
    void aPasswordAloneAuthenticatesEveryConnection() throws Exception {
        lockWaitReleaseAndRenew(address(server.port).setPassword(ADMIN_PASSWORD));
    }

    @Test
    void anAclUserAuthenticatesEveryConnection() throws Exception {
        lockWaitReleaseAndRenew(address(server.port).setUsername("app").setPassword("app-secret"));
        // the holder's commands, watchdog, session and multi-lock wait, the waiter's commands and session
        String clients = new String((byte[]) admin.call("CLIENT", "LIST"), java.nio.charset.StandardCharsets.UTF_8);
        long asApp = clients.lines().filter(line -> line.contains(" user=app ")).count();
        assertEquals(6, asApp, clients);
    }

    @Test
    void aWrongPasswordFailsAtFirstUseWithWhatWasRefused() {
        FlockClient client = client(address(server.port).setUsername("app").setPassword("wrong"));
        RedisError refused = assertTimeoutPreemptively(Duration.ofSeconds(5),
                () -> assertThrows(RedisError.class, () -> client.getFairLock("k").tryLock()));
        assertEquals("WRONGPASS", refused.code());
        assertTrue(refused.getMessage().contains("AUTH as user 'app' on redis://127.0.0.1:" + server.port),
                refused.getMessage());
        // a wait that would block without limit fails as fast
        FlockClient defaultUser = client(address(server.port).setPassword("wrong"));
        RedisError waiting = assertTimeoutPreemptively(Duration.ofSeconds(5),
                () -> assertThrows(RedisError.class, () -> defaultUser.getFairLock("k").lock()));
        assertTrue(waiting.getMessage().contains("AUTH as user 'default'"), waiting.getMessage());
    }
}
