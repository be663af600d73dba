package io.flock;

import java.io.Closeable;
import java.io.IOException;

/** A connection of its own: {@link FlockClient} opens these through a {@link ConnectionFactory}. */
public interface FlockConnection extends FlockCommands, Closeable {

    /**
     * Joins a client library's command call and its close: the one-line adapters in the README use it.
     *
     * @param commands sends a command on the library's connection
     * @param close closes that connection
     * @return the connection
     */
    static FlockConnection of(FlockCommands commands, Closeable close) {
        return new FlockConnection() {
            @Override
            public Object call(byte[]... args) throws IOException {
                return commands.call(args);
            }

            @Override
            public void close() throws IOException {
                close.close();
            }
        };
    }
}
