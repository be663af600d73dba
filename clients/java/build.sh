#!/usr/bin/env bash
# Builds build/flock-client.jar with javac/jar, its Javadoc (build/flock-client-javadoc.jar; a doclint warning,
# a public method without its docs too, fails the build) and build/flock-client-sources.jar, then (unless given
# "jar") compiles the tests and the examples against it and runs them on the JUnit 5 console launcher. The tests
# start their own redis-server with the module: FLOCK_MODULE (default: the repo's
# target/release/libredis_flock.so), FLOCK_SERVER (default: redis-server); their JUnit reports go to
# $FLOCK_TEST_REPORTS/java/ when that is set. Exits non-zero when a test fails.
set -euo pipefail
cd "$(dirname "$0")"
junit=${JUNIT_JAR:-/usr/share/java/junit-platform-console-standalone.jar}
rm -rf build
mkdir -p build/classes build/test-classes
javac --release 17 -Xlint:all -Werror -d build/classes $(find src/main/java -name '*.java')
# The version (the clients' one, ../VERSION) in the manifest: Package.getImplementationVersion().
printf 'Implementation-Title: flock-client\nImplementation-Version: %s\n' "$(cat ../VERSION)" >build/MANIFEST.MF
jar --create --file build/flock-client.jar --manifest build/MANIFEST.MF -C build/classes .
# doclint with -Werror: public API without its comment, @param, @return or @throws fails the build
javadoc -quiet --release 17 -Xdoclint:all -Werror -d build/javadoc $(find src/main/java -name '*.java')
jar --create --file build/flock-client-javadoc.jar -C build/javadoc .
jar --create --file build/flock-client-sources.jar -C src/main/java .
echo "built $(pwd)/build/flock-client.jar, flock-client-javadoc.jar, flock-client-sources.jar"
[ "${1:-}" = jar ] && exit 0
javac --release 17 -Xlint:all -Werror -d build/test-classes -cp "build/flock-client.jar:$junit" \
    $(find src/test/java examples -name '*.java')
reports=()
if [ -n "${FLOCK_TEST_REPORTS:-}" ]; then
    mkdir -p "$FLOCK_TEST_REPORTS/java"
    reports=(--reports-dir "$FLOCK_TEST_REPORTS/java")
fi
exec java -jar "$junit" --disable-banner --details=summary --fail-if-no-tests "${reports[@]}" \
    --class-path "build/flock-client.jar:build/test-classes" --scan-class-path build/test-classes
