#!/usr/bin/env bash
# Builds and tests jobbroker-spring-boot against the client jar that ../test.sh just built
# (../target/jobbroker-client-VERSION.jar with its .pom), and against the real broker
# ($JOBBROKER_BIN, else <repo>/build/server/jobbroker).
#
# The client jar is not taken from ~/.m2 (an older build of it may sit there) nor put there: it is
# installed into ../target/spring-boot-m2, a local repository in which every group of ~/.m2 is a
# link, dev.jobbroker's excepted (as scripts/install-test.sh does). Third-party jars therefore
# come from, and download into, ~/.m2; a group that ~/.m2 does not have yet downloads into
# ../target/spring-boot-m2 and is fetched again after a clean.
#   spring-boot/test.sh [maven arguments]      (after `mvn package` in client/java)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
client="$(cd "$here/.." && pwd)"
version="$(tr -d '[:space:]' <"$client/../../VERSION")"

fail() { echo "spring-boot/test.sh: $*" >&2; exit 1; }

pom_default="$(sed -n 's:^ *<revision>\(.*\)</revision>.*:\1:p' "$here/pom.xml" | head -1)"
[[ "$pom_default" == "$version" ]] ||
  fail "spring-boot/pom.xml's default <revision> is '$pom_default', VERSION is '$version': make them equal"
jar="$client/target/jobbroker-client-$version.jar"
[[ -s "$jar" && -s "${jar%.jar}.pom" ]] || fail "no $jar (and its .pom): run mvn package in $client first"

m2="${MAVEN_LOCAL_REPO:-$HOME/.m2/repository}"
mkdir -p "$m2"
repo="$client/target/spring-boot-m2"
mkdir -p "$repo/dev"
link_groups() {  # link_groups FROM INTO [SKIP]: a link in INTO for each folder of FROM but SKIP
  local d
  for d in "$1"/*; do
    [[ -d "$d" && "$(basename "$d")" != "${3:-}" && ! -e "$2/$(basename "$d")" ]] || continue
    ln -s "$d" "$2/"
  done
}
link_groups "$m2" "$repo" dev
[[ ! -d "$m2/dev" ]] || link_groups "$m2/dev" "$repo/dev" jobbroker
# Whatever an earlier run installed is replaced by this build's jar.
rm -rf "$repo/dev/jobbroker"

mvn_repo=(mvn -B -ntp -Dstyle.color=never -Dmaven.repo.local="$repo" -Drevision="$version")
"${mvn_repo[@]}" -q -f "$here/pom.xml" org.apache.maven.plugins:maven-install-plugin:3.1.3:install-file \
  -Dfile="$jar" -DpomFile="${jar%.jar}.pom" ||
  fail "could not install $jar into $repo"
[[ -s "$repo/dev/jobbroker/jobbroker-client/$version/jobbroker-client-$version.jar" ]] ||
  fail "nothing installed in $repo/dev/jobbroker/jobbroker-client/$version"

"${mvn_repo[@]}" -f "$here/pom.xml" verify "$@"
