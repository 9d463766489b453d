#!/usr/bin/env bash
# The install test: installs the built artifact (target/jobbroker-client-VERSION.jar with its pom
# target/jobbroker-client-VERSION.pom, -sources.jar and -javadoc.jar) with `mvn install:install-file`
# into a temporary local Maven repository, copies examples/ (its own pom, depending on dev.jobbroker:jobbroker-client by
# coordinates) into a scratch project outside the repository, builds that project offline from the
# temporary repository (the third-party jars are those of ~/.m2, linked in, so nothing is
# downloaded), and runs its two programs against a real broker with TLS (a throwaway CA made by
# openssl, a server certificate for 127.0.0.1) and a bearer token: EnqueueEmails enqueues a job,
# EmailWorker completes it. The classpath of that run is the scratch project's classes and the
# jars of the temporary repository: client/java is not on it (checked).
#   scripts/install-test.sh            (after `mvn package` made target/)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${JOBBROKER_BIN:-$root/build/server/jobbroker}"
m2="${M2_REPO:-$HOME/.m2/repository}"
version="$(tr -d '[:space:]' <"$root/VERSION")"
work="$(mktemp -d "${TMPDIR:-/tmp}/jobbroker-java-install-XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "install-test: FAIL: $*" >&2
  for f in broker/broker.log worker.out; do [[ -f "$work/$f" ]] && { echo "--- $f" >&2; tail -20 "$work/$f" >&2; }; done
  exit 1
}

# The artifacts, named by VERSION, and what they hold.
jar="$here/target/jobbroker-client-$version.jar"
for f in "$jar" "${jar%.jar}-sources.jar" "${jar%.jar}-javadoc.jar"; do
  [[ -s "$f" ]] || fail "$f is missing (is VERSION $version what the build used?)"
done
listing="$(unzip -Z1 "$jar")"
for f in META-INF/LICENSE dev/jobbroker/client/JobBrokerClient.class dev/jobbroker/client/version.properties \
         dev/jobbroker/v1/BrokerGrpc.class; do
  grep -qx "$f" <<<"$listing" || fail "$f is not in $(basename "$jar")"
done
! grep -q '^dev/jobbroker/examples/' <<<"$listing" || fail "the examples are in the library jar"
grep -qx META-INF/LICENSE <<<"$(unzip -Z1 "${jar%.jar}-sources.jar")" || fail "no LICENSE in the sources jar"
grep -qx index.html <<<"$(unzip -Z1 "${jar%.jar}-javadoc.jar")" || fail "no index.html in the javadoc jar"
[[ "$(unzip -p "$jar" dev/jobbroker/client/version.properties | sed -n 's/^version=//p')" == "$version" ]] ||
  fail "version.properties in the jar is not $version"
unzip -p "$jar" META-INF/MANIFEST.MF | tr -d '\r' | grep -qx "Implementation-Version: $version" ||
  fail "the jar's manifest has no Implementation-Version: $version"
examples_version="$(sed -n 's:.*<jobbroker.version>\(.*\)</jobbroker.version>.*:\1:p' "$here/examples/pom.xml")"
[[ "$examples_version" == "$version" ]] || fail "examples/pom.xml uses $examples_version, VERSION is $version"

# The pom a user's build reads: pom.xml with the version in place of the revision property
# (flatten-maven-plugin).
pom="${jar%.jar}.pom"
grep -q "^  <version>$version</version>" "$pom" 2>/dev/null || fail "$pom has no version $version"

# The temporary local repository: every group of ~/.m2 linked in, except dev.jobbroker's own.
repo="$work/repo"
mkdir -p "$repo"
for d in "$m2"/*; do
  [[ "$(basename "$d")" == dev ]] && continue
  ln -s "$d" "$repo/"
done
if [[ -d "$m2/dev" ]]; then
  mkdir -p "$repo/dev"
  for d in "$m2"/dev/*; do [[ "$(basename "$d")" == jobbroker ]] || ln -s "$d" "$repo/dev/"; done
fi
mvn_tmp=(mvn -B -q -ntp -Dstyle.color=never -Dmaven.repo.local="$repo")
install_file=(org.apache.maven.plugins:maven-install-plugin:3.1.3:install-file -Dfile="$jar" -DpomFile="$pom"
  -Dsources="${jar%.jar}-sources.jar" -Djavadoc="${jar%.jar}-javadoc.jar")
installed="$repo/dev/jobbroker/jobbroker-client/$version"
# The broker with TLS (a throwaway CA, a certificate for IP 127.0.0.1) and a bearer token.
# shellcheck source=../../../tests/lib/secured_broker.sh
source "$root/tests/lib/secured_broker.sh"
secured_broker_start "$bin" "$work/broker" || fail "the secured broker did not start"
pids+=("$secured_pid")
broker_pid="$secured_pid" token="$secured_token" address="$secured_address"
cp "$secured_ca" "$work/ca.pem"

# The scratch project: the examples folder alone. One Maven run installs the artifact into the
# temporary repository and builds the project from it, offline when every plugin it takes is in
# ~/.m2 already. On a fresh machine the install and dependency plugins are not: the same run
# goes online once, and they land in ~/.m2 through the links. Either way the classpath check
# below proves the jar came from the temporary repository.
app="$work/app"
mkdir "$app"
cp -r "$here/examples/pom.xml" "$here/examples/src" "$app/"
build=(compile org.apache.maven.plugins:maven-dependency-plugin:2.8:build-classpath -DincludeScope=runtime
  -Dmdep.outputFile="$app/classpath.txt")
(cd "$app" && { "${mvn_tmp[@]}" -o "${install_file[@]}" "${build[@]}" >"$work/mvn.out" 2>&1 ||
  "${mvn_tmp[@]}" "${install_file[@]}" "${build[@]}" >"$work/mvn.out" 2>&1; }) ||
  { cat "$work/mvn.out" >&2; fail "the scratch project did not build"; }
[[ -s "$installed/jobbroker-client-$version.jar" ]] || fail "nothing installed in $installed"
cp="$app/target/classes:$(cat "$app/classpath.txt")"
tr ':' '\n' <<<"$cp" | grep -q "^$installed/jobbroker-client-$version.jar$" ||
  fail "the classpath has no $installed/jobbroker-client-$version.jar"
! tr ':' '\n' <<<"$cp" | grep -q "^$here" || fail "the classpath has a path under $here"
echo "install-test: jobbroker-client from $installed/jobbroker-client-$version.jar"

unset CLASSPATH
cd "$app"
export JOBBROKER_ADDRESS="$address" JOBBROKER_CA="$work/ca.pem" EMAIL_QUEUE=install-test EMAIL_SEND_MILLIS=50

JOBBROKER_TOKEN="$token" java -cp "$cp" dev.jobbroker.examples.EmailWorker >"$work/worker.out" 2>&1 &
pids+=($!)
worker_pid=$!

# While the worker starts: without the token the broker refuses the producer; the token is what
# lets it in.
if JOBBROKER_TOKEN="" timeout 30 java -cp "$cp" dev.jobbroker.examples.EnqueueEmails nobody@example.com \
    >/dev/null 2>"$work/refused.err"; then
  fail "a producer without a token was let in"
fi
grep -q UNAUTHENTICATED "$work/refused.err" || fail "no UNAUTHENTICATED without a token: $(cat "$work/refused.err")"

export JOBBROKER_TOKEN="$token"
job="$(timeout 30 java -cp "$cp" dev.jobbroker.examples.EnqueueEmails ada@example.com | cut -d' ' -f1)" ||
  fail "the producer"
[[ -n "$job" ]] || fail "the producer printed no job id"
for _ in $(seq 1 300); do
  grep -q "^email-worker: sent job=$job " "$work/worker.out" && break
  kill -0 "$worker_pid" 2>/dev/null || fail "the worker exited"
  sleep 0.1
done
grep -q "^email-worker: sent job=$job " "$work/worker.out" || fail "the worker did not send job $job"
kill -TERM "$worker_pid"
wait "$worker_pid" || fail "the worker exited non-zero on SIGTERM"
cat "$work/worker.out"
grep -q "^email-worker: ready .* client=jobbroker-java/$version$" "$work/worker.out" ||
  fail "the installed client does not say version $version"
grep -q "^email-worker: stopped Stats\[acked=1," "$work/worker.out" || fail "the worker did not ack the job"
kill "$broker_pid" && wait "$broker_pid" 2>/dev/null

echo "install-test: a 3-node cluster: the example worker through a kill -9 of its queue's leader"
unset JOBBROKER_TOKEN JOBBROKER_CA
EMAIL_QUEUE="cluster-$$" EMAIL_CONCURRENCY=4 "$root/tests/lib/cluster_example.sh" "$bin" "$work/cluster" \
  "cluster-$$" 'c{n}@example.com' -- java -cp "$cp" dev.jobbroker.examples.EmailWorker ||
  fail "the example worker lost jobs in the cluster"
echo "install-test: OK: jobbroker-client-$version.jar installed into a temporary repository; the examples built from it ran over TLS with a token and through a leader's kill -9 in a 3-node cluster"
