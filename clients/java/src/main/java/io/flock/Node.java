package io.flock;

import java.util.concurrent.ConcurrentLinkedDeque;

/**
 * One server of a client (the only one, the master a Sentinel names, or a Cluster node): its shared command
 * connection, its watchdog connection, its FLOCK session and, without sessions, its idle blocking-wait
 * connections. A session lives on one server, so a wait names the session of the node it is sent to.
 */
final class Node implements AutoCloseable {
    /** {@code host:port} (a Cluster node), or "" for the one server of a client. */
    final String address;
    final ConnectionFactory factory;
    final Link commands;
    final Link renewals;
    final Session session;
    /** Runs this node's watchdog renewals one at a time on the client's I/O threads. */
    final Serial renewer;
    final ConcurrentLinkedDeque<Link> idleWaitLinks = new ConcurrentLinkedDeque<>();
    /**
     * Idle connections for durable grants' {@code RENEW} + {@code WAIT} (one per grant being confirmed at a
     * time, so that a WAIT does not hold up the shared command connection).
     */
    final ConcurrentLinkedDeque<Link> durableLinks = new ConcurrentLinkedDeque<>();

    Node(FlockClient client, String address, ConnectionFactory factory) {
        this.address = address;
        this.factory = factory;
        this.commands = new Link(factory, false);
        this.renewals = new Link(factory, false);
        this.session = new Session(client, factory);
        this.renewer = new Serial(client.io);
    }

    @Override
    public void close() {
        session.close();
        commands.close();
        renewals.close();
        for (Link link; (link = idleWaitLinks.poll()) != null; ) {
            link.close();
        }
        for (Link link; (link = durableLinks.poll()) != null; ) {
            link.close();
        }
    }
}
