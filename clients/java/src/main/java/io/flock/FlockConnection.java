package io.flock;

import java.io.Closeable;

/** A connection of its own: {@link FlockClient} opens these through a {@link ConnectionFactory}. */
public interface FlockConnection extends FlockCommands, Closeable {}
