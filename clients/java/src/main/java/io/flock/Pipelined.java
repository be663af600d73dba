package io.flock;

import java.io.IOException;
import java.util.List;

/** A connection that writes several commands before it reads their replies: one round trip for all. */
interface Pipelined {
    /**
     * Sends {@code commands}, then reads their replies.
     *
     * @param commands each a command and its arguments
     * @return the replies in order, an error reply as the {@link RuntimeException} in its place
     * @throws IOException if a reply was lost (the connection is then closed)
     */
    List<Object> pipeline(byte[][]... commands) throws IOException;
}
