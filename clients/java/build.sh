#!/usr/bin/env bash
# Builds build/flock-client.jar with javac/jar, its Javadoc (build/flock-client-javadoc.jar; a doclint warning,
# a public method without its docs too, fails the build) and build/flock-client-sources.jar, then (unless given
# "jar") compiles the tests and the examples against it and runs them on the JUnit 5 console launcher. The tests
# start their own redis-server with the module: FLOCK_MODULE (default: the repo's
# target/release/libredis_flock.so), FLOCK_SERVER (default: redis-server); their JUnit reports go to
# $FLOCK_TEST_REPORTS/java/ when that is set. Exits non-zero when a test fails.
#
# Each part is rebuilt only when its inputs changed (a checksum of them in build/*.stamp, written once the part
# is built): the jars when src/main/java, ../VERSION or this script did, the tests when they or the jar did.
# FLOCK_TEST_JOBS: how many test classes run at once, at most (default 6: they mostly wait on their servers and
# timers, so more than the 2 cores of a developer's machine; 4 took 26 s, 6 some 16 s); 1 runs them one after
# another. Further arguments after "test" go to the JUnit launcher in place of the class-path scan, e.g.
# `build.sh test --select-class io.flock.SessionTest`, or
# `build.sh test --select-method io.flock.SessionTest#closeEndsAWaitingThread`.
set -euo pipefail
cd "$(dirname "$0")"
case "${1:-test}" in
    jar | test) ;;
    *) echo "usage: $0 [jar | test [JUnit launcher arguments]]" >&2; exit 2 ;;
esac
junit=${JUNIT_JAR:-/usr/share/java/junit-platform-console-standalone.jar}
# C1 only: javac, javadoc and the tests (which mostly wait) are short runs that C2 compiles for more than it
# saves: about half the CPU of javac and javadoc, a third of the tests'
c1=-XX:TieredStopAtLevel=1
quick=-J$c1

# A checksum of this script, ../VERSION and every file's name and content under the directories given.
stamp() {
    { cat build.sh ../VERSION; find "$@" -type f -print0 | sort -z | xargs -0 sha1sum; } | sha1sum | cut -d' ' -f1
}

main=$(stamp src/main/java)
jars=
if [ "$(cat build/main.stamp 2>/dev/null)" != "$main" ]; then
    rm -rf build
    mkdir -p build/classes
    javac $quick --release 17 -Xlint:all -Werror -d build/classes $(find src/main/java -name '*.java')
    # The jars and the Javadoc (doclint with -Werror: public API without its comment, @param, @return or
    # @throws fails the build) are made beside the tests' compile, on the other core; the build waits for them
    # before it says the jars are built. The version (the clients' one, ../VERSION) goes in the manifest:
    # Package.getImplementationVersion().
    {
        printf 'Implementation-Title: flock-client\nImplementation-Version: %s\n' "$(cat ../VERSION)" \
            >build/MANIFEST.MF
        jar --create --file build/flock-client.jar --manifest build/MANIFEST.MF -C build/classes .
        jar --create --file build/flock-client-sources.jar -C src/main/java .
        javadoc $quick -quiet --release 17 -Xdoclint:all -Werror -d build/javadoc $(find src/main/java -name '*.java')
        jar --create --file build/flock-client-javadoc.jar -C build/javadoc .
    } &
    jars=$!
    trap 'pkill -P $jars 2>/dev/null; kill $jars 2>/dev/null || true' EXIT
fi
tests=$( { echo "$main $junit"; stamp src/test/java examples; } | sha1sum | cut -d' ' -f1)
if [ "${1:-test}" != jar ] && [ "$(cat build/test.stamp 2>/dev/null)" != "$tests" ]; then
    rm -rf build/test-classes build/test.stamp
    mkdir -p build/test-classes
    javac $quick --release 17 -Xlint:all -Werror -d build/test-classes -cp "build/classes:$junit" \
        $(find src/test/java examples -name '*.java')
    echo "$tests" >build/test.stamp
fi
if [ -n "$jars" ]; then
    wait "$jars"
    trap - EXIT
    echo "$main" >build/main.stamp
    echo "built $(pwd)/build/flock-client.jar, flock-client-javadoc.jar, flock-client-sources.jar"
else
    echo "up to date: $(pwd)/build/flock-client.jar, flock-client-javadoc.jar, flock-client-sources.jar"
fi
[ "${1:-test}" = jar ] && exit 0
[ $# -gt 0 ] && shift
selection=("$@")
[ ${#selection[@]} -eq 0 ] && selection=(--scan-class-path build/test-classes)
jobs=${FLOCK_TEST_JOBS:-6}
reports=()
if [ -n "${FLOCK_TEST_REPORTS:-}" ]; then
    mkdir -p "$FLOCK_TEST_REPORTS/java"
    reports=(--reports-dir "$FLOCK_TEST_REPORTS/java")
fi
# Test classes run side by side (each has servers of its own), a class's tests one after another (they share
# the class's servers); the longest classes (@Order(1)) start first. max-pool-size: no spare threads beyond the
# jobs (JUnit adds one for each test blocked in a Future's get, and ran 8 classes at once for 4).
exec java $c1 -jar "$junit" --disable-banner --details=summary --fail-if-no-tests "${reports[@]}" \
    --config='junit.jupiter.testclass.order.default=org.junit.jupiter.api.ClassOrderer$OrderAnnotation' \
    --config=junit.jupiter.execution.parallel.enabled=true \
    --config=junit.jupiter.execution.parallel.mode.default=same_thread \
    --config=junit.jupiter.execution.parallel.mode.classes.default=concurrent \
    --config=junit.jupiter.execution.parallel.config.strategy=fixed \
    --config=junit.jupiter.execution.parallel.config.fixed.parallelism="$jobs" \
    --config=junit.jupiter.execution.parallel.config.fixed.max-pool-size="$jobs" \
    --class-path "build/flock-client.jar:build/test-classes" "${selection[@]}"
