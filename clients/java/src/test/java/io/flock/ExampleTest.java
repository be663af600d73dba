package io.flock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import org.junit.jupiter.api.Test;

/** The README shows examples/QuickStart.java as it is, and that file runs against a test server. */
class ExampleTest extends ServerTest {

    @Test
    void theReadmeShowsTheExampleFile() throws Exception {
        String example = Files.readString(Paths.get("examples/QuickStart.java"));
        String readme = Files.readString(Paths.get("README.md"));
        assertTrue(readme.contains("```java\n" + example + "```"), "README.md must show examples/QuickStart.java verbatim");
    }

    @Test
    void theExampleRuns() throws Exception {
        ByteArrayOutputStream captured = new ByteArrayOutputStream();
        PrintStream stdout = System.out;
        System.setOut(new PrintStream(captured, true, StandardCharsets.UTF_8));
        try {
            Class.forName("QuickStart").getMethod("main", String[].class)
                    .invoke(null, (Object) new String[] {"127.0.0.1", Integer.toString(server.port)});
        } finally {
            System.setOut(stdout);
        }
        assertTrue(captured.toString(StandardCharsets.UTF_8).startsWith("holding orders:42 with token "));
        assertEquals(null, info("orders:42"), "the example released its lock");
    }
}
