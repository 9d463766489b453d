#!/usr/bin/env bash
# CI checks of the Helm chart charts/jobbroker, offline:
#   - the values table of the chart's README matches values.yaml, and every value has a comment;
#   - the chart's copy of the alert rules is deploy/prometheus/alerts.yml, byte for byte;
#   - for each value set tests/chart/values/*.yaml: `helm lint --strict` and `helm template`;
#     a set whose header says "expect-error: TEXT" must be refused by both, with TEXT in the
#     message (values.schema.json or the chart's own checks);
#   - every rendered manifest is valid against the Kubernetes 1.33 schemas of the npm package
#     kubernetes-models (and prometheus-operator's), unknown fields included (validate.js);
#   - the rendered ConfigMap's config.json, with the rendered broker args ($(POD_NAME) expanded
#     as the kubelet does), passes `jobbroker --check-config`; a set whose header says
#     "expect-check-config-error: TEXT" must render but be refused by it, with TEXT in the message;
#   - every flag the chart-managed etcd is given is one etcd knows (`etcd --help`);
#   - the PrometheusRule's rules equal deploy/prometheus/alerts.yml, and per-set render
#     expectations (probes, TLS flags, labels, ...) hold (render-checks.js).
# Needs Go (helm is built once, scripts/install-helm.sh), Node.js with npm, and the built broker
# ($JOBBROKER_BIN, default build/server/jobbroker) and etcd ($ETCD_BIN, default etcd: Debian's
# etcd-server, the image's). Ends with "chart: N passed, N failed".
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
chart="$root/charts/jobbroker"
bin="${JOBBROKER_BIN:-$root/build/server/jobbroker}"
etcd_bin="${ETCD_BIN:-etcd}"
# The Kubernetes version to render for: the API version of the kubernetes-models schemas.
kube_version=1.33.0

helm=$("$root/scripts/install-helm.sh")
(cd "$here" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok    $*"; }
fail() { failed=$((failed + 1)); echo "FAIL  $*"; }
# run NAME CMD...: one check; its output is shown only when it fails.
run() {
  local name=$1
  shift
  if "$@" >"$work/out" 2>&1; then pass "$name"; else fail "$name"; sed 's/^/      /' "$work/out"; fi
}
# refused NAME TEXT CMD...: CMD must fail, with TEXT in its output.
refused() {
  local name=$1 text=$2
  shift 2
  if "$@" >"$work/out" 2>&1; then
    fail "$name: accepted, expected a refusal naming \"$text\""
  elif grep -qF -- "$text" "$work/out"; then
    pass "$name: refused ($(grep -F -m1 -- "$text" "$work/out" | cut -c1-150))"
  else
    fail "$name: refused, but without \"$text\""
    sed 's/^/      /' "$work/out"
  fi
}
marker() { sed -n "s/.*$1: *//p" "$2" | head -n1; }

# Dummy TLS files for --check-config of the TLS value sets (it reads them, does not dial).
mkdir -p "$work/tls"
if command -v openssl >/dev/null; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=jobbroker \
    -keyout "$work/tls/tls.key" -out "$work/tls/tls.crt" 2>/dev/null
  cp "$work/tls/tls.crt" "$work/tls/ca.crt"
else
  for f in tls.crt ca.crt; do printf -- '-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n' >"$work/tls/$f"; done
  printf -- '-----BEGIN PRIVATE KEY-----\nMA==\n-----END PRIVATE KEY-----\n' >"$work/tls/tls.key"
fi

# A tokens file of the Secret's shape for the auth value sets (digests, not tokens), with the
# peer token of the cluster value sets (--cluster-peer-token-file) and its digest, role peer.
mkdir -p "$work/auth" "$work/peer"
printf 'not-a-real-peer-token' >"$work/peer/token"
printf '{"tokens": [{"name": "chart-test", "sha256": "%s", "roles": ["producer"], "queues": ["*"]}, {"name": "nodes", "sha256": "%s", "roles": ["peer"]}]}\n' \
  "$(printf 'not-a-real-token' | sha256sum | cut -d' ' -f1)" \
  "$(sha256sum <"$work/peer/token" | cut -d' ' -f1)" >"$work/auth/tokens.json"

# check_config SET RENDERED: the broker's own check of the rendered args and config.json.
check_config() {
  local set=$1 rendered=$2 dir="$work/$1"
  mkdir -p "$dir"
  node "$here/render-checks.js" extract "$rendered" "$dir" || { fail "$set: extract config.json and args"; return; }
  local -a args=()
  while IFS= read -r a; do
    a=${a//\/etc\/jobbroker\/config\/config.json/$dir/config.json}
    a=${a//\/etc\/jobbroker\/tls/$work/tls}
    a=${a//\/etc\/jobbroker\/auth/$work/auth}
    a=${a//\/etc\/jobbroker\/peer/$work/peer}
    args+=("$a")
  done <"$dir/args"
  local expect
  expect=$(marker expect-check-config-error "$root/tests/chart/values/$set.yaml")
  if [ ! -x "$bin" ]; then
    fail "$set: jobbroker --check-config: no broker binary at $bin (build it, or set JOBBROKER_BIN)"
  elif [ -n "$expect" ]; then
    refused "$set: jobbroker --check-config" "$expect" "$bin" --check-config "${args[@]}"
  else
    run "$set: jobbroker --check-config (rendered args and config.json)" "$bin" --check-config "${args[@]}"
  fi
  [ -s "$dir/etcd-args" ] && run "$set: etcd knows every flag of the chart-managed etcd" etcd_flags_known "$dir/etcd-args"
  return 0
}

# etcd_flags_known ARGS_FILE: each --flag of ARGS_FILE is listed by `etcd --help`.
etcd_flags_known() {
  if ! command -v "$etcd_bin" >/dev/null; then
    echo "no etcd at $etcd_bin (scripts/install-deps.sh installs etcd-server, or set ETCD_BIN)"
    return 1
  fi
  local help flag unknown=0
  help=$("$etcd_bin" --help 2>&1)
  while IFS= read -r flag; do
    flag=${flag%%=*}
    if grep -qE -- "^ +$flag( |\$)" <<<"$help"; then echo "known: $flag"; else echo "UNKNOWN: $flag"; unknown=1; fi
  done <"$1"
  return "$unknown"
}

start=$SECONDS
echo "helm $("$helm" version --template '{{.Version}}'), Kubernetes schemas $kube_version (kubernetes-models $(node -p "require('$here/node_modules/kubernetes-models/package.json').version")), broker $bin"

run "README values table matches values.yaml, every value commented" node "$here/values-table.js" --check
# ... and catches an undocumented key.
cp -r "$chart" "$work/chart-copy"
printf '\nundocumentedKey: 1\n' >>"$work/chart-copy/values.yaml"
refused "values table check catches a value without a comment" "undocumentedKey has no comment" \
  env CHART_DIR="$work/chart-copy" node "$here/values-table.js" --check
run "files/prometheus-alerts.yml is a copy of deploy/prometheus/alerts.yml" \
  cmp "$chart/files/prometheus-alerts.yml" "$root/deploy/prometheus/alerts.yml"
run "helm lint --strict (defaults, no -f, helm's own Kubernetes version)" "$helm" lint --strict "$chart"
refused "kubeVersion: Kubernetes 1.26 refused" "kubeVersion" \
  "$helm" template r "$chart" --kube-version 1.26.0

for values in "$here"/values/*.yaml; do
  set=$(basename "$values" .yaml)
  rendered="$work/$set.rendered.yaml"
  expect=$(marker expect-error "$values")
  if [ -n "$expect" ]; then
    # A schema violation fails lint; a `fail` in a template does not: lint renders in "lint mode",
    # where Helm reports `fail` as an [INFO] line and exits 0. So lint must report TEXT, and
    # helm template (what install and upgrade do) must refuse.
    if "$helm" lint --strict --kube-version "$kube_version" -f "$values" "$chart" >"$work/out" 2>&1; then :; fi
    if grep -qF -- "$expect" "$work/out"; then
      pass "$set: helm lint --strict reports it ($(grep -F -m1 -- "$expect" "$work/out" | cut -c1-110))"
    else
      fail "$set: helm lint --strict does not report \"$expect\""; sed 's/^/      /' "$work/out"
    fi
    refused "$set: helm template" "$expect" "$helm" template r "$chart" --kube-version "$kube_version" -f "$values"
    continue
  fi
  run "$set: helm lint --strict" "$helm" lint --strict --kube-version "$kube_version" -f "$values" "$chart"
  if ! "$helm" template r "$chart" --namespace jobs --kube-version "$kube_version" -f "$values" >"$rendered" 2>"$work/out"; then
    fail "$set: helm template"; sed 's/^/      /' "$work/out"; continue
  fi
  pass "$set: helm template"
  run "$set: manifests valid against the Kubernetes $kube_version schemas, no unknown field" node "$here/validate.js" "$rendered"
  run "$set: render expectations" node "$here/render-checks.js" assert "$set" "$rendered"
  check_config "$set" "$rendered"
  if grep -q '^kind: PrometheusRule' "$rendered"; then
    run "$set: PrometheusRule rules equal deploy/prometheus/alerts.yml" \
      node "$here/render-checks.js" alerts "$rendered" "$root/deploy/prometheus/alerts.yml"
  fi
done

# The unknown-field check must catch misspellings (and the schemas wrong types) it is there for.
if [ -f "$work/servicemonitor-on.rendered.yaml" ]; then
  run "validator catches misspelled fields (spec.replica, securityContext.runAsNonRot, ...)" \
    node "$here/validate.js" --self-test "$work/servicemonitor-on.rendered.yaml"
else
  fail "validator self-test: no rendering of servicemonitor-on"
fi

# A policy change must roll the pod: the checksum annotation follows config.json.
sum() { grep -m1 'checksum/config' "$work/$1.rendered.yaml" | awk '{print $2}'; }
if [ -f "$work/defaults.rendered.yaml" ] && [ -f "$work/custom-policies.rendered.yaml" ] &&
  [ "$(sum defaults)" != "$(sum custom-policies)" ] && [ -n "$(sum defaults)" ]; then
  pass "checksum/config changes with the policies"
else
  fail "checksum/config changes with the policies"
fi

echo "chart: took $((SECONDS - start))s"
echo "chart: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
