#!/usr/bin/env node
// Checks of rendered chart output that need YAML parsing; used by test.sh.
//
//   node render-checks.js extract RENDERED OUTDIR   writes OUTDIR/config.json (the ConfigMap's) and
//                                                   OUTDIR/args (the broker's args, one per line)
//   node render-checks.js alerts RENDERED ALERTS    the PrometheusRule's spec equals ALERTS
//                                                   (deploy/prometheus/alerts.yml), parsed
//   node render-checks.js assert SET RENDERED       the expectations for value set SET (below)
"use strict";
const fs = require("fs");
const path = require("path");
const assert = require("assert");
const yaml = require("js-yaml");

const load = (file) => yaml.loadAll(fs.readFileSync(file, "utf8")).filter(Boolean);
const one = (docs, kind, name) => {
  const found = docs.filter((d) => d.kind === kind && (!name || d.metadata.name === name));
  assert.strictEqual(found.length, 1, `expected one ${kind}${name ? ` ${name}` : ""}, found ${found.length}`);
  return found[0];
};
const container = (docs) => one(docs, "StatefulSet").spec.template.spec.containers[0];

function extract(rendered, outdir) {
  const docs = load(rendered);
  fs.writeFileSync(path.join(outdir, "config.json"), one(docs, "ConfigMap").data["config.json"]);
  fs.writeFileSync(path.join(outdir, "args"), container(docs).args.join("\n") + "\n");
}

function alerts(rendered, alertsFile) {
  const rule = one(load(rendered), "PrometheusRule");
  assert.deepStrictEqual(rule.spec, yaml.load(fs.readFileSync(alertsFile, "utf8")));
  console.log(`PrometheusRule: ${rule.spec.groups[0].rules.length} rules, equal to ${path.basename(alertsFile)}`);
}

// What each value set must render, beyond being valid.
const expectations = {
  defaults(docs) {
    const sts = one(docs, "StatefulSet");
    const c = container(docs);
    assert.strictEqual(sts.spec.replicas, 1);
    assert.deepStrictEqual(c.livenessProbe.grpc, { port: 7070 });
    assert.deepStrictEqual(c.readinessProbe.grpc, { port: 7070, service: "jobbroker.v1.Broker" });
    assert.strictEqual(c.startupProbe.httpGet.path, "/readyz");
    assert.ok(!c.args.some((a) => a.startsWith("--tls")), "no TLS flags by default");
    assert.ok(!c.args.some((a) => a.startsWith("--auth-tokens")), "no tokens by default");
    assert.ok(c.args.includes("--config=/etc/jobbroker/config/config.json"));
    const pod = sts.spec.template.spec;
    assert.strictEqual(pod.securityContext.runAsNonRoot, true);
    assert.strictEqual(pod.securityContext.runAsUser, 10001);
    assert.strictEqual(pod.securityContext.fsGroup, 10001);
    assert.strictEqual(pod.securityContext.seccompProfile.type, "RuntimeDefault");
    assert.strictEqual(c.securityContext.readOnlyRootFilesystem, true);
    assert.strictEqual(c.securityContext.allowPrivilegeEscalation, false);
    assert.deepStrictEqual(c.securityContext.capabilities.drop, ["ALL"]);
    assert.strictEqual(pod.terminationGracePeriodSeconds, 30);
    assert.strictEqual(sts.spec.volumeClaimTemplates[0].spec.resources.requests.storage, "10Gi");
    assert.ok(sts.spec.template.metadata.annotations["checksum/config"].match(/^[0-9a-f]{64}$/));
    assert.strictEqual(sts.spec.template.metadata.annotations["prometheus.io/scrape"], "true");
    const grpc = one(docs, "Service", sts.metadata.name);
    assert.deepStrictEqual(grpc.spec.ports.map((p) => [p.name, p.port, p.appProtocol]), [["grpc", 7070, "grpc"]]);
    const http = one(docs, "Service", `${sts.metadata.name}-http`);
    assert.deepStrictEqual(http.spec.ports.map((p) => [p.name, p.port]), [["http-metrics", 8080]]);
    const headless = one(docs, "Service", sts.spec.serviceName);
    assert.strictEqual(headless.spec.clusterIP, "None");
    assert.strictEqual(one(docs, "PodDisruptionBudget").spec.maxUnavailable, 1);
    assert.strictEqual(JSON.stringify(JSON.parse(one(docs, "ConfigMap").data["config.json"])), "{}");
    // The helm test pod must not carry the selector labels, or the Services would pick it.
    const test = one(docs, "Pod");
    assert.strictEqual(test.metadata.annotations["helm.sh/hook"], "test");
    const sel = sts.spec.selector.matchLabels;
    assert.ok(!Object.entries(sel).every(([k, v]) => test.metadata.labels[k] === v), "test pod matches the selector");
    assert.ok(test.spec.containers[0].args[0].includes("jobbroker-cli --address"));
    assert.ok(!docs.some((d) => ["ServiceMonitor", "PrometheusRule", "NetworkPolicy"].includes(d.kind)));
  },
  "tls-on"(docs) {
    const c = container(docs);
    for (const [probe, p] of [["livenessProbe", "/healthz"], ["readinessProbe", "/readyz"], ["startupProbe", "/readyz"]]) {
      assert.strictEqual(c[probe].grpc, undefined, `${probe} must not be gRPC with TLS`);
      assert.deepStrictEqual(c[probe].httpGet, { path: p, port: "http" }, probe);
    }
    for (const f of ["--tls-cert=/etc/jobbroker/tls/tls.crt", "--tls-key=/etc/jobbroker/tls/tls.key", "--tls-client-ca=/etc/jobbroker/tls/ca.crt"]) {
      assert.ok(c.args.includes(f), f);
    }
    const vol = one(docs, "StatefulSet").spec.template.spec.volumes.find((v) => v.name === "tls");
    assert.strictEqual(vol.secret.secretName, "jobbroker-tls");
    assert.ok(c.volumeMounts.find((m) => m.name === "tls").readOnly);
    assert.ok(!one(docs, "Pod").spec.containers[0].args[0].includes("jobbroker-cli --address"));
  },
  "auth-on"(docs) {
    const c = container(docs);
    assert.ok(c.args.includes("--auth-tokens=/etc/jobbroker/auth/tokens.json"));
    const vol = one(docs, "StatefulSet").spec.template.spec.volumes.find((v) => v.name === "auth");
    assert.strictEqual(vol.secret.secretName, "jobbroker-tokens");
    assert.deepStrictEqual(vol.secret.items, [{ key: "tokens.json", path: "tokens.json" }]);
    const mount = c.volumeMounts.find((m) => m.name === "auth");
    assert.strictEqual(mount.mountPath, "/etc/jobbroker/auth");
    assert.ok(mount.readOnly);
  },
  "no-persistence"(docs) {
    const sts = one(docs, "StatefulSet");
    const c = container(docs);
    assert.ok(c.args.includes("--tls-cert=/etc/jobbroker/tls/tls.crt"));
    assert.ok(!c.args.some((a) => a.startsWith("--tls-client-ca")), "no client CA without clientCA");
    assert.strictEqual(sts.metadata.name, "broker");
    assert.strictEqual(sts.spec.volumeClaimTemplates, undefined);
    assert.deepStrictEqual(sts.spec.template.spec.volumes.find((v) => v.name === "data").emptyDir, {});
    assert.ok(!docs.some((d) => d.kind === "PodDisruptionBudget"));
  },
  "existing-claim"(docs) {
    const sts = one(docs, "StatefulSet");
    assert.strictEqual(sts.spec.volumeClaimTemplates, undefined);
    assert.strictEqual(sts.spec.template.spec.volumes.find((v) => v.name === "data").persistentVolumeClaim.claimName, "jobbroker-restored");
    assert.strictEqual(sts.metadata.labels["app.kubernetes.io/name"], "jobs");
  },
  "servicemonitor-on"(docs) {
    const sm = one(docs, "ServiceMonitor");
    assert.strictEqual(sm.metadata.labels.release, "kube-prometheus-stack");
    assert.strictEqual(sm.spec.endpoints[0].port, "http-metrics");
    assert.deepStrictEqual(sm.spec.endpoints[0].relabelings, [{ action: "replace", targetLabel: "job", replacement: "jobbroker" }]);
    // The ServiceMonitor must select the HTTP Service only.
    const selected = docs.filter((d) => d.kind === "Service" &&
      Object.entries(sm.spec.selector.matchLabels).every(([k, v]) => d.metadata.labels[k] === v));
    assert.deepStrictEqual(selected.map((s) => s.spec.ports[0].name), ["http-metrics"]);
    assert.strictEqual(one(docs, "StatefulSet").spec.template.metadata.annotations["prometheus.io/scrape"], undefined);
    one(docs, "PrometheusRule");
  },
  "custom-policies"(docs) {
    const cfg = JSON.parse(one(docs, "ConfigMap").data["config.json"]);
    assert.deepStrictEqual(Object.keys(cfg.queues).sort(), ["emails", "imports", "reports", "sms", "webhooks"]);
    assert.strictEqual(cfg.defaultPolicy.retry.maxAttempts, 3);
    assert.deepStrictEqual(cfg.queues.emails.rateLimit, { perSecond: 10, burst: 20 });
    assert.strictEqual(cfg.queues.sms.rateLimit.perSecond, 0.5);
    assert.strictEqual(cfg.queues.webhooks.leaseDuration, "0.5s");
    assert.ok(container(docs).args.includes("--log-format=text"));
  },
  "networkpolicy-on"(docs) {
    const np = one(docs, "NetworkPolicy");
    const [grpc, http] = np.spec.ingress;
    assert.deepStrictEqual(grpc.ports, [{ port: "grpc", protocol: "TCP" }]);
    assert.ok(!grpc.from.some((p) => p.podSelector && Object.keys(p.podSelector).length === 0 && !p.namespaceSelector),
      "allowSameNamespace false must not allow the whole namespace");
    assert.ok(grpc.from.some((p) => p.namespaceSelector && p.namespaceSelector.matchLabels["kubernetes.io/metadata.name"] === "workers"));
    assert.deepStrictEqual(http.ports, [{ port: "http", protocol: "TCP" }]);
    assert.ok(http.from.some((p) => p.namespaceSelector && p.namespaceSelector.matchLabels["kubernetes.io/metadata.name"] === "monitoring"));
    // The helm test pod is let through to both ports.
    const test = one(docs, "Pod");
    for (const rule of [grpc, http]) {
      assert.ok(rule.from.some((p) => p.podSelector && p.podSelector.matchLabels &&
        Object.entries(p.podSelector.matchLabels).every(([k, v]) => test.metadata.labels[k] === v)), "test pod allowed");
    }
  },
  "replicas-2-acknowledged"(docs) {
    assert.strictEqual(one(docs, "StatefulSet").spec.replicas, 2);
  },
  "everything-else"(docs) {
    const sts = one(docs, "StatefulSet");
    const c = container(docs);
    assert.strictEqual(c.image, "registry.example.com/jobbroker@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
    assert.ok(c.args.includes("--metrics=off"));
    assert.strictEqual(c.livenessProbe, undefined);
    assert.strictEqual(sts.spec.volumeClaimTemplates[0].spec.storageClassName, "fast-ssd");
    assert.strictEqual(sts.spec.template.spec.serviceAccountName, "jobs");
    assert.strictEqual(one(docs, "PodDisruptionBudget").spec.minAvailable, 1);
    assert.strictEqual(one(docs, "PodDisruptionBudget").spec.maxUnavailable, undefined);
    assert.strictEqual(sts.spec.template.metadata.annotations["prometheus.io/scrape"], undefined);
    assert.ok(!docs.some((d) => d.kind === "Pod" || d.kind === "ServiceAccount"));
  },
};

function main([cmd, a, b]) {
  if (cmd === "extract") return extract(a, b);
  if (cmd === "alerts") return alerts(a, b);
  if (cmd === "assert") {
    const check = expectations[a];
    if (!check) return console.log(`no render expectations for ${a}`);
    check(load(b));
    return console.log(`render expectations of ${a} hold`);
  }
  throw new Error(`unknown command ${cmd}`);
}

try {
  main(process.argv.slice(2));
} catch (e) {
  console.log(e.message);
  process.exitCode = 1;
}
