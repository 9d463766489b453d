#!/usr/bin/env bash
# The contract must generate cleanly for other languages: every file names its package for Go,
# Java and C#, and protoc's built-in generators accept all of it without a warning.
# Usage: codegen_check.sh PROTOC PROTO_ROOT
set -euo pipefail
protoc="$1"
root="$2"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

mapfile -t files < <(cd "$root" && ls jobbroker/v1/*.proto)
failed=0
for f in "${files[@]}"; do
  for option in go_package java_package java_multiple_files csharp_namespace; do
    if ! grep -q "^option $option = " "$root/$f"; then
      echo "FAIL: $f has no 'option $option'"
      failed=1
    fi
  done
done

for lang in cpp java python csharp ruby; do
  mkdir -p "$out/$lang"
  if ! log="$("$protoc" -I"$root" "--${lang}_out=$out/$lang" "${files[@]}" 2>&1)" || [ -n "$log" ]; then
    echo "FAIL: protoc --${lang}_out: $log"
    failed=1
  fi
done
[ -f "$out/java/dev/jobbroker/v1/BrokerGrpc.java" ] || [ -f "$out/java/dev/jobbroker/v1/EnqueueRequest.java" ] || {
  echo "FAIL: java_multiple_files did not give one file per message"
  failed=1
}
if [ "$failed" -ne 0 ]; then exit 1; fi
echo "codegen: ${#files[@]} files generate for cpp java python csharp ruby"
