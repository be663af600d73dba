package io.flock;

/**
 * One server of a client (the only one, the master a Sentinel names, or a Cluster node): its command
 * connections, its watchdog connection, its FLOCK session and, without sessions, its blocking-wait connections.
 * A session lives on one server, so a wait names the session of the node it is sent to.
 */
final class Node implements AutoCloseable {
    /**
     * How many command connections a node's threads share at most, and how many idle connections it keeps of
     * each kind. Under contention two commands are under way at a time (a holder's release, the last holder's
     * next acquire), a third lets a try or a reentry pass them; with the session and the watchdog's, any number
     * of waiting threads so costs five connections. A burst of threads that each needed a connection of its own (blocking
     * waits, durable grants' confirmations) leaves this many open, not one per thread.
     */
    static final int LINKS = 3;

    /** {@code host:port} (a Cluster node), or "" for the one server of a client. */
    final String address;
    final Links commands;
    final Link renewals;
    final Session session;
    /** Runs this node's watchdog renewals one at a time on the client's I/O threads. */
    final Serial renewer;
    /** Without sessions: a connection per waiting thread, blocked in its {@code FLOCK.ACQUIRE ... WAIT}. */
    final Links waitLinks;
    /**
     * Durable grants' {@code RENEW} + {@code WAIT} (one per grant being confirmed at a time, so that a WAIT does
     * not hold up a command connection).
     */
    final Links durableLinks;

    Node(FlockClient client, String address, ConnectionFactory factory) {
        this.address = address;
        this.commands = new Links(factory, false, LINKS, LINKS);
        this.renewals = new Link(factory, false);
        this.session = new Session(client, factory);
        this.renewer = new Serial(client.io);
        this.waitLinks = new Links(factory, true, LINKS, 0);
        this.durableLinks = new Links(factory, false, LINKS, 0);
    }

    @Override
    public void close() {
        session.close();
        commands.close();
        renewals.close();
        waitLinks.close();
        durableLinks.close();
    }
}
