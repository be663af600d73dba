package io.flock;

import java.util.ArrayDeque;
import java.util.concurrent.Executor;
import java.util.concurrent.RejectedExecutionException;

/**
 * Runs its tasks one after the other on a shared pool: one thread at most while it has work, none otherwise. A
 * node's renewals so wait for each other (they share its connection) but never for another node's.
 */
final class Serial implements Executor {
    private final Executor pool;
    private final ArrayDeque<Runnable> tasks = new ArrayDeque<>();
    private boolean running;

    Serial(Executor pool) {
        this.pool = pool;
    }

    /** @throws RejectedExecutionException if the pool is shut down (the client closed) */
    @Override
    public void execute(Runnable task) {
        synchronized (this) {
            tasks.add(task);
            if (running) {
                return;
            }
            running = true;
        }
        try {
            pool.execute(this::drain);
        } catch (RejectedExecutionException closed) {
            synchronized (this) {
                running = false;
                tasks.clear();
            }
            throw closed;
        }
    }

    private void drain() {
        while (true) {
            Runnable task;
            synchronized (this) {
                task = tasks.poll();
                if (task == null) {
                    running = false;
                    return;
                }
            }
            try {
                task.run();
            } catch (RuntimeException e) {
                // a task's failure is its own: the next one runs
            }
        }
    }
}
