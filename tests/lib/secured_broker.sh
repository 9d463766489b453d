# Sourced by the clients' install tests (client/*/install_test.sh, client/*/scripts/install-test.sh,
# client/cpp/test.sh): the real broker as a production deployment runs it, with TLS and bearer
# tokens, so that each client's installed artifact proves it connects through its own options.
#
# secured_broker_start BROKER DIR
#   Makes a throwaway CA and a server certificate for IP 127.0.0.1 (EC P-256, keys in PKCS#8,
#   which every client's TLS stack reads) in DIR/pki, one token with every role on every queue,
#   and starts BROKER on free loopback ports with its data in DIR/data, TLS and --auth-tokens;
#   its output goes to DIR/broker.log. Sets secured_address (HOST:PORT), secured_pid,
#   secured_token and secured_ca (the CA's PEM file). On failure prints why and returns 1.
# secured_broker_stop
#   SIGTERM, up to 30 s to exit, then SIGKILL. Sets secured_status to its exit status. Call it
#   from the shell that started the broker.

secured_broker_start() {
  local broker="$1" dir="$2" pki="$2/pki"
  mkdir -p "$pki" "$dir/data"
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  if ! {
    openssl req -x509 "${ec[@]}" -days 1 -subj "/CN=jobbroker test CA" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -keyout "$pki/ca.key" -out "$pki/ca.pem" &&
      openssl req "${ec[@]}" -subj "/CN=127.0.0.1" -keyout "$pki/server.key" -out "$pki/server.csr" &&
      printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' \
        >"$pki/server.ext" &&
      openssl x509 -req -in "$pki/server.csr" -CA "$pki/ca.pem" -CAkey "$pki/ca.key" \
        -CAcreateserial -days 1 -extfile "$pki/server.ext" -out "$pki/server.pem"
  } >"$pki/openssl.log" 2>&1; then
    echo "secured_broker_start: openssl could not make the certificates:" >&2
    tail -5 "$pki/openssl.log" >&2
    return 1
  fi
  secured_ca="$pki/ca.pem"
  secured_token="test-$(openssl rand -hex 24)"
  local sha
  sha="$(printf '%s' "$secured_token" | openssl dgst -sha256 -r | cut -d' ' -f1)"
  printf '{"tokens": [{"name": "test", "sha256": "%s", "roles": ["producer", "worker", "admin"], "queues": ["*"]}]}\n' \
    "$sha" >"$pki/tokens.json"

  "$broker" --data-dir "$dir/data" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
    --tls-cert "$pki/server.pem" --tls-key "$pki/server.key" --auth-tokens "$pki/tokens.json" \
    >"$dir/broker.log" 2>&1 &
  secured_pid=$!
  secured_address=""
  local deadline=$((SECONDS + 30))
  while ((SECONDS < deadline)); do
    secured_address="$(sed -n 's/^jobbroker: serving grpc=\([^ ]*\).*/\1/p' "$dir/broker.log" | head -n 1)"
    [[ -n "$secured_address" ]] && return 0
    if ! kill -0 "$secured_pid" 2>/dev/null; then
      echo "secured_broker_start: the broker exited before serving:" >&2
      tail -20 "$dir/broker.log" >&2
      return 1
    fi
    sleep 0.05
  done
  echo "secured_broker_start: the broker did not serve within 30 s:" >&2
  tail -20 "$dir/broker.log" >&2
  kill -KILL "$secured_pid" 2>/dev/null || true
  return 1
}

secured_broker_stop() {
  kill -TERM "$secured_pid" 2>/dev/null || true
  for _ in $(seq 1 300); do
    kill -0 "$secured_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$secured_pid" 2>/dev/null || true
  secured_status=0
  wait "$secured_pid" 2>/dev/null || secured_status=$?
}
