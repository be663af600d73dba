package io.flock;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.junit.jupiter.api.Test;

/** The built-in RESP2 connection: each reply type, error codes, binary-safe arguments. */
class RespConnectionTest extends ServerTest {

    @Test
    void repliesMapToJavaTypes() throws Exception {
        assertEquals("OK", admin.call("SET", "s", "v"));
        assertArrayEquals("v".getBytes(), (byte[]) admin.call("GET", "s"));
        assertNull(admin.call("GET", "missing"));
        assertEquals(1L, admin.call("RPUSH", "l", "a"));
        assertEquals(List.of(), admin.call("LRANGE", "none", "0", "-1"));
        Object token = admin.call("FLOCK.ACQUIRE", "k", "me", "10000");
        assertTrue(token instanceof Long && (Long) token > 0);
        List<?> info = (List<?>) admin.call("FLOCK.INFO", "k");
        assertArrayEquals("owner".getBytes(), (byte[]) info.get(0));
        assertArrayEquals("me".getBytes(), (byte[]) info.get(1));
        assertArrayEquals("queue".getBytes(), (byte[]) info.get(12));
        assertEquals(List.of(), info.get(13), "an empty queue is an empty array");
    }

    @Test
    void errorRepliesCarryTheirCode() throws Exception {
        RedisError notOwner = assertThrows(RedisError.class, () -> admin.call("FLOCK.RELEASE", "k", "me"));
        assertEquals("NOTOWNER", notOwner.code());
        RedisError err = assertThrows(RedisError.class, () -> admin.call("FLOCK.ACQUIRE", "k", "me", "x"));
        assertEquals("ERR", err.code());
        assertEquals("PONG", admin.call("PING"), "the connection is usable after an error");
    }

    @Test
    void anErrorInsideAnArrayKeepsItsPlace() throws Exception {
        admin.call("MULTI");
        admin.call("FLOCK.RELEASE", "k", "me");
        admin.call("PING");
        List<?> replies = (List<?>) admin.call("EXEC");
        assertEquals("NOTOWNER", ((RedisError) replies.get(0)).code());
        assertEquals("PONG", replies.get(1));
    }

    @Test
    void aPipelineAnswersEachCommandInOrderWithErrorsInTheirPlace() throws Exception {
        byte[][] release = {"FLOCK.RELEASE".getBytes(), "k".getBytes(), "me".getBytes()};
        byte[][] ping = {"PING".getBytes()};
        byte[][] wait = {"WAIT".getBytes(), "0".getBytes(), "100".getBytes()};
        List<Object> replies = admin.pipeline(release, ping, wait);
        assertEquals("NOTOWNER", ((RedisError) replies.get(0)).code(), "an error reply in its place, not thrown");
        assertEquals("PONG", replies.get(1));
        assertEquals(0L, replies.get(2), "WAIT 0: no replica to count");
        assertEquals("PONG", admin.call("PING"), "the connection is usable after it");
    }

    @Test
    void waitBlocksForItsTimeoutOnTopOfTheCommandTimeout() {
        byte[][] wait = {"WAIT".getBytes(), "2".getBytes(), "1000".getBytes()};
        assertEquals(1000, RespConnection.blockingMs(wait));
        assertEquals(4000, RespConnection.readTimeoutMs(3000, wait));
        assertEquals(0, RespConnection.readTimeoutMs(3000, new byte[][] {"WAIT".getBytes(), "1".getBytes(),
            "0".getBytes()}), "WAIT n 0 blocks without limit");
    }

    /** Its WAIT comes after the keys, whose number is its first argument: a key named WAIT is no option. */
    @Test
    void acquireAllBlocksForItsWaitAfterItsKeys() {
        assertEquals(1500, RespConnection.blockingMs(args("FLOCK.ACQUIREALL", "2", "WAIT", "a", "o", "30000", "ID",
                "WAIT", "WAIT", "1500", "SHARED")));
        assertEquals(0, RespConnection.blockingMs(args("FLOCK.ACQUIREALL", "1", "a", "o", "30000", "WAIT", "0")),
                "WAIT 0: no limit");
        assertEquals(-1, RespConnection.blockingMs(args("FLOCK.ACQUIREALL", "2", "WAIT", "100", "o", "30000")),
                "a try does not block");
        assertEquals(-1, RespConnection.blockingMs(args("FLOCK.ACQUIREALL", "x", "a")), "the server refuses it");
    }

    private static byte[][] args(String... words) {
        byte[][] args = new byte[words.length][];
        for (int i = 0; i < words.length; i++) {
            args[i] = words[i].getBytes();
        }
        return args;
    }

    @Test
    void argumentsAreBinarySafe() throws Exception {
        byte[] key = {'k', 0, '\r', '\n', (byte) 0xff};
        assertEquals("OK", admin.call("SET".getBytes(), key, key));
        assertArrayEquals(key, (byte[]) admin.call("GET".getBytes(), key));
    }
}
