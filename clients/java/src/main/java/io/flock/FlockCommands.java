package io.flock;

import java.io.IOException;

/**
 * The one thing FLOCK needs from a Redis client: send a command, get its RESP reply.
 *
 * <p>Replies map as Jedis, Lettuce (with a byte-array codec) and Spring's {@code RedisConnection.execute}
 * already map them: integer -> {@link Long}, bulk string -> {@code byte[]}, simple string -> {@link String},
 * nil -> {@code null}, array -> {@link java.util.List}. An error reply is thrown as a RuntimeException whose
 * message starts with the error code ({@code NOTOWNER ...}); {@link RedisError} is the built-in one, but any
 * exception with that message (Jedis's {@code JedisDataException}, Lettuce's
 * {@code RedisCommandExecutionException}) is understood. A lost reply (the connection broke) must be an
 * {@link IOException} or {@link java.io.UncheckedIOException}: only then is the command resent.
 */
@FunctionalInterface
public interface FlockCommands {
    /**
     * Sends one command and returns its reply.
     *
     * @param args the command name and its arguments
     * @return the reply, mapped as above
     * @throws IOException if the reply was lost (the command is then resent)
     */
    Object call(byte[]... args) throws IOException;
}
