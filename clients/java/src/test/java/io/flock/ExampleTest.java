package io.flock;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.parallel.ResourceLock;
import org.junit.jupiter.api.parallel.Resources;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * The README shows each file of examples/ as it is, and each runs against a test server. What an example prints
 * is read from System.out, which no other test may print to meanwhile.
 */
@ResourceLock(Resources.SYSTEM_OUT)
class ExampleTest extends ServerTest {

    @ParameterizedTest
    @ValueSource(strings = {"QuickStart", "ReadersAndPermits", "SeveralLocks"})
    void theReadmeShowsTheExampleFile(String example) throws Exception {
        String code = Files.readString(Paths.get("examples", example + ".java"));
        String readme = Files.readString(Paths.get("README.md"));
        assertTrue(readme.contains("```java\n" + code + "```"), "README.md must show examples/" + example + ".java verbatim");
    }

    /** Runs examples/{@code example}.java's main against the test server; returns what it printed. */
    private String run(String example) throws Exception {
        ByteArrayOutputStream captured = new ByteArrayOutputStream();
        PrintStream stdout = System.out;
        System.setOut(new PrintStream(captured, true, StandardCharsets.UTF_8));
        try {
            Class.forName(example).getMethod("main", String[].class)
                    .invoke(null, (Object) new String[] {"127.0.0.1", Integer.toString(server.port)});
        } finally {
            System.setOut(stdout);
        }
        return captured.toString(StandardCharsets.UTF_8);
    }

    @Test
    void theExampleRuns() throws Exception {
        assertTrue(run("QuickStart").startsWith("holding orders:42 with token "));
        assertEquals(null, info("orders:42"), "the example released its lock");
        assertArrayEquals("paid".getBytes(StandardCharsets.UTF_8),
                (byte[]) admin.call("HGET", "{orders:42}:row", "status"), "the example wrote its row through fenced()");
    }

    @Test
    void theReadWriteAndSemaphoreExampleRuns() throws Exception {
        String printed = run("ReadersAndPermits");
        assertTrue(printed.startsWith("reading report with token "), printed);
        assertTrue(printed.contains("\n2 of 3 api-slots held, 1 free\n"), printed);
        assertEquals(null, info("report"), "the example released its read lock");
        assertEquals(null, info("api-slots"), "the example released its permits");
    }

    @Test
    void theMultiLockExampleRuns() throws Exception {
        String printed = run("SeveralLocks");
        assertTrue(printed.matches("holding both with tokens \\[\\d+, \\d+\\]\n"), printed);
        assertEquals(null, info("{account:42}:from"), "the example released both keys");
        assertEquals(null, info("{account:42}:to"), "the example released both keys");
    }
}
