//! The integration tests: one test binary (`cargo test --test integration`),
//! one module per subject. Each test starts the real redis-server processes
//! it needs (tests/integration/common) on free loopback ports; the tests of a
//! module that need a Cluster or Sentinel share one, started by the first of
//! them. One binary links the harness and the client once and runs every
//! test on one pool of threads; docs/testing.md says how to run a part.

mod common;

mod acquire_all;
mod backlog;
mod binary_keys;
mod client;
mod client_durable;
mod client_multi;
mod client_partitions;
mod client_scenarios;
mod client_sessions;
mod client_shared;
mod client_topologies;
mod clock_steps;
mod cluster;
mod commands;
mod deadlocks;
mod docs;
mod durability;
mod eviction;
mod examples;
mod failover;
mod fairness;
mod fenced;
mod fixtures;
mod fuzz;
mod hostile;
mod legacy_locks;
mod lifecycle;
mod loaded_data;
mod lock_delay;
mod memory;
mod observability;
mod operator_view;
mod paused_writes;
mod random_clients;
mod redlock;
mod request_ids;
mod session_leases;
mod sessions;
mod shared_holders;
