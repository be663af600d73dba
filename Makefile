# FLOCK: fair distributed locks inside Redis. See README.md.
SHELL := /bin/bash
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
MODULE := target/release/libredis_flock.so

.PHONY: bench-clock bench-top deps deps-redis-py deps-clients deps-java deps-python deps-node build run test soak jepsen flaky test-clients test-java test-python test-node test-servers dist deps-dist test-dist layers sizes versions unasync lint leakcheck bench bench-instructions bench-clients clean example-cli example-python example-rust

# The server that run, test and bench start: empty for the system's
# redis-server, or redis-7.0 (the same, checked to be 7.0), redis-8.2 or
# valkey-9.1, fetched on first use into target/servers/ (scripts/server.sh).
# The tests and the bench read its path from FLOCK_SERVER.
SERVER ?=
SERVERS := redis-7.0 redis-8.2 valkey-9.1
with_server = $(if $(SERVER),server=$$(scripts/server.sh $(SERVER)) && export FLOCK_SERVER=$$server &&)

# Installs redis-server, redis-cli, libclang (bindgen) and redis-py (the
# lost-reply tests) when missing.
deps: deps-redis-py
deps-redis-py:
	@python3 -c 'import redis' 2>/dev/null \
	|| python3 -m pip install --quiet --disable-pip-version-check redis 2>/dev/null \
	|| python3 -m pip install --quiet --disable-pip-version-check --break-system-packages redis 2>/dev/null \
	|| { $(SUDO) apt-get update && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y python3-redis; }

deps:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null || missing="$$missing redis-tools"; \
	ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	command -v cc >/dev/null || missing="$$missing gcc"; \
	ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || missing="$$missing faketime"; \
	if [ -n "$$missing" ]; then \
		$(SUDO) apt-get update && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; \
		case "$$missing" in *redis-server*) \
			echo "stopping the distribution's redis-server service so that 'make run' can use port 6379"; \
			{ $(SUDO) systemctl disable --now redis-server || $(SUDO) service redis-server stop; } >/dev/null 2>&1 || true;; \
		esac; \
	fi

build: deps
	cargo build --release

# redis-server in the foreground on 127.0.0.1:6379 with the module loaded.
run: build
	$(with_server) "$${FLOCK_SERVER:-redis-server}" redis.conf.example

# Every test on one server, phase by phase (scripts/test.sh): installs what
# is missing, builds, the crates' unit and property tests, the integration
# tests (they start their own redis-server processes on free loopback ports,
# with the module rebuilt if it is stale), the Java, Python and Node
# clients' suites and their packages (test-dist); then the time of each
# phase and the 20 slowest tests. About 3 minutes once built, 6 from a fresh clone (docs/testing.md).
# `make test SERVER=valkey-9.1`: on that server.
test:
	$(with_server) scripts/test.sh

# The long runs at full scale (FLOCK_SOAK=1): the fuzzer, the random
# clients, the contending clients, the failover measurement (each for
# SOAK_SECS seconds), the memory and backlog tests at 100,000+ locks and
# waiters, and the Python suite's mixed fleet. `make test` runs each at a
# scale that still finds what it is for.
SOAK_SECS ?= 20
soak: build deps-clients
	$(with_server) FLOCK_SOAK=1 FLOCK_SOAK_SECS=$(SOAK_SECS) FLOCK_MODULE=$(abspath $(MODULE)) scripts/soak.sh

# The Jepsen-style run (clients/python/tests/test_jepsen.py): clients of a
# Sentinel-watched master under a nemesis of pauses, kills, partitions,
# failovers and wall-clock steps of up to an hour (libfaketime; not on
# Debian's 7.0), with fenced and with plain writes, JEPSEN_SECS seconds
# each; prints the table docs/guarantees.md shows.
JEPSEN_SECS ?= 600
jepsen: build deps-python
	$(with_server) FLOCK_MODULE=$(abspath $(MODULE)) JEPSEN_SECONDS=$(JEPSEN_SECS) FLOCK_TEST_JOBS=1 \
		clients/python/run-tests.sh -s tests/test_jepsen.py

# The suites RUNS times (default 5) on one server, then every test that
# failed at least once, with the run and its failure (scripts/flaky.sh;
# logs in target/flaky).
RUNS ?= 5
flaky:
	$(with_server) scripts/flaky.sh $(RUNS)

# The Java, Python and Node clients' suites (clients/<client>; about a minute
# in all) against redis-servers they start with the module at $(MODULE), each
# followed by a line of counts; `make test-java` (-python, -node) runs one.
CLIENTS := java python node
test-clients: build deps-clients
	$(with_server) FLOCK_MODULE=$(abspath $(MODULE)) scripts/test-clients.sh $(CLIENTS)
$(CLIENTS:%=test-%): test-%: build deps-%
	$(with_server) FLOCK_MODULE=$(abspath $(MODULE)) scripts/test-clients.sh $*

# What the clients' suites need, each installed only when missing: JDK 17 and
# JUnit 5 (Debian's openjdk-17-jdk-headless and junit5: no Maven download),
# openssl (the Java TLS test makes its certificates);
# a virtualenv in target/ with pytest, pytest-asyncio, pytest-xdist, psycopg and rich
# from PyPI (Debian's python3-venv when venv fails), Debian's PostgreSQL (docs/fencing.md's
# recipe is tested against it) and tmux (`redis-flock top`'s live view is tested in
# it); Node and npm (Debian's when missing) and the Node client's devDependencies
# (ioredis, redis, typescript) from its package-lock.json when node_modules is
# missing or stale.
PYVENV := target/python-venv
deps-clients: $(CLIENTS:%=deps-%)
deps-java:
	@missing=""; \
	command -v javac >/dev/null || missing="$$missing openjdk-17-jdk-headless"; \
	[ -f /usr/share/java/junit-platform-console-standalone.jar ] || missing="$$missing junit5"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	if [ -n "$$missing" ]; then \
		$(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

deps-python:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
	|| { $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }
	@command -v tmux >/dev/null \
	|| { $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null; }
	@{ [ -x $(PYVENV)/bin/pytest ] && $(PYVENV)/bin/python -c 'import xdist, psycopg, rich' 2>/dev/null; } || { \
		python3 -m venv $(PYVENV) >/dev/null 2>&1 || { rm -rf $(PYVENV) \
			&& $(SUDO) apt-get update && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv \
			&& python3 -m venv $(PYVENV); } \
		&& $(PYVENV)/bin/pip install --quiet --disable-pip-version-check pytest pytest-asyncio pytest-xdist 'psycopg[binary]' rich; }
deps-node:
	@{ command -v node && command -v npm; } >/dev/null \
	|| { $(SUDO) apt-get update && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y nodejs npm; }
	@[ clients/node/node_modules/.package-lock.json -nt clients/node/package-lock.json ] \
	|| npm --prefix clients/node ci --no-audit --no-fund --silent

# The clients as packages, in dist/, of the version in clients/VERSION: the
# Python wheel and sdist (PyPI's `build`, in $(PYVENV); it builds the wheel
# from the sdist), the npm tarball (`npm pack`), and the Java jar with its
# Javadoc and sources jars (clients/java/build.sh jar) named with the version.
VERSION = $(shell cat clients/VERSION)
dist: deps-dist
	@scripts/check-versions.sh >/dev/null
	rm -rf dist && mkdir dist
	$(PYVENV)/bin/python -m build -q --outdir dist clients/python
	npm pack --silent --pack-destination dist ./clients/node
	clients/java/build.sh jar
	for jar in "" -javadoc -sources; do \
		cp clients/java/build/flock-client$$jar.jar dist/flock-client-$(VERSION)$$jar.jar; done
	@ls -l dist

# The packages of `make dist`, each installed into a fresh project outside the
# repository (a temporary directory) where its client's README example runs
# against a redis-server with the module, then a line of counts
# (scripts/test-dist.sh; about 30 s). The last step of `make test`; not of
# test-servers (run once, not per server): CI runs it after that.
test-dist: build dist
	$(with_server) FLOCK_MODULE=$(abspath $(MODULE)) scripts/test-dist.sh

# What `make dist` needs, each installed only when missing: the virtualenv
# (as deps-python makes it) with `build`, a JDK (javac, jar, javadoc), npm.
deps-dist:
	@[ -x $(PYVENV)/bin/pip ] || { \
		python3 -m venv $(PYVENV) >/dev/null 2>&1 || { rm -rf $(PYVENV) \
			&& $(SUDO) apt-get update && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv \
			&& python3 -m venv $(PYVENV); }; }
	@$(PYVENV)/bin/python -c 'import build' 2>/dev/null \
	|| $(PYVENV)/bin/pip install --quiet --disable-pip-version-check build
	@missing=""; \
	command -v javadoc >/dev/null || missing="$$missing openjdk-17-jdk-headless"; \
	command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
		$(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# The whole suite, clients included, on each of $(SERVERS) (about 2.5 minutes each once built), then one
# line of test counts per server; logs in target/servers/<server>.log.
test-servers: build sizes layers deps-clients
	CLIENTS="$(CLIENTS)" FLOCK_MODULE=$(abspath $(MODULE)) scripts/test-servers.sh $(SERVERS)

# In each of the four crates with modules in levels, the Redis layer (src/,
# see src/lib.rs), the core (crates/flock-core/src), the benchmark
# (crates/flock-bench/src) and the Rust client (crates/flock-client/src), the
# modules import one another without a cycle and no module imports an item of
# its crate root; prints the level of each, per crate, and the modules of any
# cycle. And the
# Redis layer borrows its state once per callback (scripts/check-state-borrow.sh).
layers:
	scripts/check-layers.sh
	scripts/check-state-borrow.sh

# No tracked file over 1 MB (generated data belongs in target/).
sizes:
	scripts/check-file-sizes.sh

# The clients' packages all of the version in clients/VERSION.
versions:
	@scripts/check-versions.sh >/dev/null

# The Python client's blocking modules (lock.py, _session.py) are generated
# from its asyncio modules (asyncio.py, _asyncio_session.py): fails when one
# is stale. `python3 clients/python/scripts/unasync.py` writes them again.
unasync:
	python3 clients/python/scripts/unasync.py --check

# What CI checks besides the tests: formatting (rustfmt.toml), clippy with
# warnings as errors on every crate and target, file sizes, the layers, the
# clients' versions, the Python client's generated code.
lint: sizes layers versions unasync
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --release -- -D warnings

# redis-server under valgrind memcheck with the module: a self-test (a probe
# module that leaks on purpose must be caught), then the randomized, memory
# and hostile tests at small scale. Fails on any invalid access or on a
# definite leak in the module. About 2 minutes on 2 cores once built (CI's
# first build is in its time too); not part of `make test`, but CI runs it
# (.ci/run, after `make lint`). Logs in target/leakcheck. See
# scripts/leakcheck.sh.
leakcheck: build
	@command -v valgrind >/dev/null || { $(SUDO) apt-get update && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y valgrind; }
	scripts/leakcheck.sh

# FLOCK side by side with the setnx, listpoll and redisson recipes, on a
# redis-server of its own: tables on stdout; CSV, the tables and an SVG chart
# in target/bench. About 8 minutes on 2 cores; `make bench ARGS=--quick` is
# under one, `ARGS="--scenarios rwlock,semaphore"` runs the read-write lock
# and semaphore alone (about one), `ARGS=--help` lists the options. See
# docs/benchmark.md.
bench: build
	$(with_server) cargo run --release --package flock-bench -- $(ARGS)

# Leases across a step of the server's wall clock, an hour forward and an
# hour back (libfaketime, on the server only): 1,000 leases of 1 to 30 s, a
# waiter on each; how late each waiter is granted after its holder's
# deadline, none early (scripts/clock-step-bench.py, about 70 seconds).
# Redis 8.2 unless SERVER names another: Debian's 7.0 hangs under libfaketime.
bench-clock: build deps-redis-py
	server=$$(scripts/server.sh $(or $(SERVER),redis-8.2)) && FLOCK_SERVER=$$server \
		python3 scripts/clock-step-bench.py $(abspath $(MODULE)) $(or $(LOCKS),1000)

# The operator's view at scale: FLOCK.TOP's server time on 1,000,000 locks
# of which 100 have a waiter (INFO commandstats), and the server CPU that
# `redis-flock top` refreshing every second costs (scripts/top-bench.py,
# about 2 minutes; LOCKS changes the count).
bench-top: build deps-python
	$(with_server) PYTHONPATH=clients/python/src PYTHON=$(abspath $(PYVENV))/bin/python \
		$(PYVENV)/bin/python scripts/top-bench.py $(abspath $(MODULE)) $(or $(LOCKS),1000000)

# Instructions redis-server runs per uncontended ACQUIRE + RELEASE pair
# (callgrind, 10,000 pairs on one connection, bare and as the clients send
# them), beside SET NX PX with a Lua compare-and-delete:
# scripts/instructions-per-pair.sh, about 20 seconds.
bench-instructions: build
	$(with_server) scripts/instructions-per-pair.sh $(abspath $(MODULE))

# Each client: one process's waiters (connections, server memory per waiter,
# how soon a holder hears of FORCERELEASE), what an acquire + release costs
# against the lock it replaces or the raw commands, contended grants/s against
# raw commands, and whether a holder cut off by a partition knows it lost the
# lock before the next waiter is granted it (BENCH_SECTIONS picks parts):
# docs/benchmark.md, "Clients: overhead and who knows first".
bench-clients: build deps-clients
	$(with_server) FLOCK_MODULE=$(abspath $(MODULE)) scripts/bench-clients.sh $(WAITERS)

# The examples, against a running server (start one with `make run`):
#   make example-cli example-python example-rust [REDIS_URL=redis://host:port]
REDIS_URL ?= redis://127.0.0.1:6379

example-cli:
	redis-cli -u $(REDIS_URL) < examples/walkthrough.redis

example-python: deps-python
	$(PYVENV)/bin/pip install --quiet --disable-pip-version-check ./clients/python
	$(PYVENV)/bin/python clients/python/examples/quickstart.py $(REDIS_URL)

example-rust:
	cargo run --release --example client -- $(REDIS_URL)

clean:
	cargo clean
