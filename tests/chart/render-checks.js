#!/usr/bin/env node
// Checks of rendered chart output that need YAML parsing; used by test.sh.
//
//   node render-checks.js extract RENDERED OUTDIR   writes OUTDIR/config.json (the ConfigMap's),
//                                                   OUTDIR/args (the broker's args, one per line,
//                                                   $(VAR) expanded as the kubelet would for the
//                                                   first pod) and OUTDIR/etcd-args (the etcd
//                                                   members' args; empty without chart-managed etcd)
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
// The broker's StatefulSet and the chart-managed etcd's, told apart by their component label.
const component = (docs, kind, name) => {
  const found = docs.filter((d) => d.kind === kind && d.metadata.labels["app.kubernetes.io/component"] === name);
  assert.strictEqual(found.length, 1, `expected one ${kind} of component ${name}, found ${found.length}`);
  return found[0];
};
const brokerSts = (docs) => component(docs, "StatefulSet", "broker");
const etcdSts = (docs) => component(docs, "StatefulSet", "etcd");
const container = (docs) => brokerSts(docs).spec.template.spec.containers[0];
const matches = (selector, labels) => Object.entries(selector).every(([k, v]) => labels[k] === v);

// A container's args with $(VAR) expanded from its env (values, and metadata.name as the
// StatefulSet's first pod), as the kubelet does.
function expanded(sts, c) {
  const vars = {};
  for (const e of c.env || []) {
    if (e.value !== undefined) vars[e.name] = e.value;
    else if (e.valueFrom && e.valueFrom.fieldRef && e.valueFrom.fieldRef.fieldPath === "metadata.name") vars[e.name] = `${sts.metadata.name}-0`;
  }
  return c.args.map((a) => a.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, v) => (v in vars ? vars[v] : m)));
}

function extract(rendered, outdir) {
  const docs = load(rendered);
  fs.writeFileSync(path.join(outdir, "config.json"), one(docs, "ConfigMap").data["config.json"]);
  fs.writeFileSync(path.join(outdir, "args"), expanded(brokerSts(docs), container(docs)).join("\n") + "\n");
  const etcd = docs.filter((d) => d.kind === "StatefulSet" && d.metadata.labels["app.kubernetes.io/component"] === "etcd");
  const etcdArgs = etcd.length ? etcd[0].spec.template.spec.containers[0].args : [];
  fs.writeFileSync(path.join(outdir, "etcd-args"), etcdArgs.map((a) => `${a}\n`).join(""));
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
    // Single node: no cluster flags, no etcd, nothing of cluster mode's pod settings.
    assert.strictEqual(sts.spec.podManagementPolicy, "OrderedReady");
    assert.strictEqual(sts.spec.minReadySeconds, undefined);
    assert.ok(!c.args.some((a) => a.startsWith("--cluster") || a.startsWith("--node-id") || a.startsWith("--partitions")));
    assert.strictEqual(c.env, undefined);
    assert.strictEqual(c.lifecycle, undefined);
    assert.strictEqual(sts.spec.template.spec.topologySpreadConstraints, undefined);
    assert.strictEqual(sts.spec.template.spec.initContainers, undefined);
    assert.ok(!docs.some((d) => d.metadata.labels["app.kubernetes.io/component"] === "etcd"));
    assert.deepStrictEqual(c.livenessProbe.grpc, { port: 7070 });
    assert.deepStrictEqual(c.readinessProbe.grpc, { port: 7070, service: "jobbroker.v1.Broker" });
    assert.strictEqual(c.startupProbe.httpGet.path, "/readyz");
    assert.ok(!c.args.some((a) => a.startsWith("--tls")), "no TLS flags by default");
    assert.ok(!c.args.some((a) => a.startsWith("--auth-tokens")), "no tokens by default");
    // The broker's own keepalive defaults, written out so that the pod's command line says them.
    assert.ok(c.args.includes("--keepalive-time=10") && c.args.includes("--keepalive-timeout=5"));
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
  "cluster-embedded-etcd"(docs) {
    const sts = brokerSts(docs);
    const etcd = etcdSts(docs);
    const pod = sts.spec.template.spec;
    const c = container(docs);
    const arg = (name) => {
      const found = c.args.filter((a) => a.startsWith(`--${name}=`));
      assert.strictEqual(found.length, 1, `one --${name}`);
      return found[0].slice(name.length + 3);
    };
    assert.strictEqual(sts.spec.replicas, 3);
    assert.strictEqual(sts.spec.podManagementPolicy, "Parallel");
    assert.strictEqual(sts.spec.minReadySeconds, 10);
    assert.strictEqual(arg("listen"), "0.0.0.0:7070");
    // --cluster-etcd: every etcd member, by its pod's name under etcd's headless Service.
    const etcdSvc = one(docs, "Service", etcd.spec.serviceName);
    assert.strictEqual(etcdSvc.spec.clusterIP, "None");
    assert.strictEqual(etcdSvc.spec.publishNotReadyAddresses, true);
    assert.ok(matches(etcdSvc.spec.selector, etcd.spec.template.metadata.labels));
    const members = [0, 1, 2].map((i) => `${etcd.metadata.name}-${i}.${etcd.spec.serviceName}.jobs.svc.cluster.local`);
    assert.deepStrictEqual(arg("cluster-etcd").split(","), members.map((h) => `http://${h}:2379`));
    // The node's id and advertised address: the pod's name, under the broker's headless Service.
    assert.strictEqual(arg("node-id"), "$(POD_NAME)");
    assert.deepStrictEqual(c.env, [{ name: "POD_NAME", valueFrom: { fieldRef: { fieldPath: "metadata.name" } } }]);
    assert.strictEqual(arg("advertise-address"), `$(POD_NAME).${sts.spec.serviceName}.jobs.svc.cluster.local:7070`);
    const headless = one(docs, "Service", sts.spec.serviceName);
    assert.strictEqual(headless.spec.clusterIP, "None");
    assert.strictEqual(headless.spec.publishNotReadyAddresses, true);
    assert.ok(headless.spec.ports.some((p) => p.port === 7070 && p.targetPort === "grpc"));
    assert.strictEqual(arg("cluster-name"), "jobbroker");
    assert.strictEqual(arg("partitions"), "12");
    assert.strictEqual(arg("replication-factor"), "3");
    assert.strictEqual(arg("min-in-sync"), "2");
    // Partitions placed over every node of a first install, not the first ones up.
    assert.strictEqual(arg("cluster-initial-nodes"), String(sts.spec.replicas));
    assert.strictEqual(arg("cluster-lease-ttl"), "3");
    // Nodes started with their etcd wait for it instead of exiting at the first refusal.
    assert.strictEqual(arg("cluster-etcd-wait"), "60");
    assert.ok(!c.args.some((a) => a.startsWith("--cluster-peer-token-file")), "no peer token without auth");
    // Readiness on the broker's service, as on a single node: a cluster node reports it too.
    assert.deepStrictEqual(c.readinessProbe.grpc, { port: 7070, service: "jobbroker.v1.Broker" });
    // preStop sleep, and a grace period that covers it, the hand-over and the drain.
    assert.deepStrictEqual(c.lifecycle.preStop.exec.command, ["sleep", "5"]);
    assert.ok(pod.terminationGracePeriodSeconds >= 5 + 10);
    // Spread over machines (hard) and zones (soft), selecting the nodes' own pods.
    const spread = pod.topologySpreadConstraints;
    assert.deepStrictEqual(spread.map((t) => [t.topologyKey, t.whenUnsatisfiable, t.maxSkew]),
      [["kubernetes.io/hostname", "DoNotSchedule", 1], ["topology.kubernetes.io/zone", "ScheduleAnyway", 1]]);
    for (const t of spread) assert.deepStrictEqual(t.labelSelector.matchLabels, sts.spec.selector.matchLabels);
    // The nodes wait for etcd's quorum before they start.
    const wait = pod.initContainers.find((i) => i.name === "wait-for-etcd");
    assert.strictEqual(wait.image, c.image);
    for (const h of members) assert.ok(wait.args[0].includes(h), h);
    // The etcd members: etcd from the same image, one StatefulSet of three.
    const e = etcd.spec.template.spec.containers[0];
    assert.strictEqual(e.image, c.image);
    assert.deepStrictEqual(e.command, ["etcd"]);
    assert.strictEqual(etcd.spec.replicas, 3);
    assert.strictEqual(etcd.spec.podManagementPolicy, "Parallel");
    const flag = (name) => {
      const found = e.args.filter((a) => a.startsWith(`--${name}=`));
      assert.strictEqual(found.length, 1, `one etcd --${name}`);
      return found[0].slice(name.length + 3);
    };
    assert.deepStrictEqual(flag("initial-cluster").split(","),
      [0, 1, 2].map((i) => `${etcd.metadata.name}-${i}=http://${members[i]}:2380`));
    assert.strictEqual(flag("name"), "$(POD_NAME)");
    assert.deepStrictEqual(e.env, [{ name: "POD_NAME", valueFrom: { fieldRef: { fieldPath: "metadata.name" } } }]);
    assert.strictEqual(flag("initial-cluster-state"), "new");
    assert.strictEqual(flag("advertise-client-urls"), `http://$(POD_NAME).${etcd.spec.serviceName}.jobs.svc.cluster.local:2379`);
    assert.strictEqual(flag("initial-advertise-peer-urls"), `http://$(POD_NAME).${etcd.spec.serviceName}.jobs.svc.cluster.local:2380`);
    assert.strictEqual(flag("listen-client-urls"), "http://0.0.0.0:2379");
    assert.strictEqual(flag("listen-peer-urls"), "http://0.0.0.0:2380");
    assert.ok(flag("data-dir").startsWith(e.volumeMounts.find((m) => m.name === "data").mountPath + "/"));
    assert.strictEqual(etcd.spec.volumeClaimTemplates[0].spec.resources.requests.storage, "2Gi");
    assert.strictEqual(e.securityContext.readOnlyRootFilesystem, true);
    assert.strictEqual(e.readinessProbe.httpGet.path, "/health");
    assert.deepStrictEqual(etcd.spec.template.spec.topologySpreadConstraints.map((t) => t.labelSelector.matchLabels),
      [etcd.spec.selector.matchLabels, etcd.spec.selector.matchLabels]);
    // The broker's and etcd's selectors pick only their own pods.
    assert.ok(!matches(sts.spec.selector.matchLabels, etcd.spec.template.metadata.labels), "broker selector picks etcd pods");
    assert.ok(!matches(etcd.spec.selector.matchLabels, sts.spec.template.metadata.labels), "etcd selector picks broker pods");
    // One disruption at a time, for the nodes and for etcd.
    const pdbs = docs.filter((d) => d.kind === "PodDisruptionBudget");
    assert.strictEqual(pdbs.length, 2);
    const nodePdb = pdbs.find((p) => matches(p.spec.selector.matchLabels, sts.spec.template.metadata.labels));
    const etcdPdb = pdbs.find((p) => matches(p.spec.selector.matchLabels, etcd.spec.template.metadata.labels));
    assert.strictEqual(nodePdb.spec.maxUnavailable, 1);
    assert.strictEqual(etcdPdb.spec.maxUnavailable, 1);
    assert.notStrictEqual(nodePdb, etcdPdb);
    // NetworkPolicies: node <-> node on gRPC; nodes -> etcd's client port; etcd <-> etcd on peers.
    const nps = docs.filter((d) => d.kind === "NetworkPolicy");
    const nodeNp = nps.find((n) => matches(n.spec.podSelector.matchLabels, sts.spec.template.metadata.labels));
    const etcdNp = nps.find((n) => matches(n.spec.podSelector.matchLabels, etcd.spec.template.metadata.labels));
    const allows = (np, port, labels) => np.spec.ingress.some((r) => r.ports.some((p) => p.port === port) &&
      r.from.some((f) => f.podSelector && !f.namespaceSelector && f.podSelector.matchLabels && matches(f.podSelector.matchLabels, labels)));
    assert.ok(allows(nodeNp, "grpc", sts.spec.template.metadata.labels), "nodes reach each other's gRPC port");
    assert.ok(allows(etcdNp, "client", sts.spec.template.metadata.labels), "nodes reach etcd");
    assert.ok(allows(etcdNp, "peer", etcd.spec.template.metadata.labels), "etcd members reach each other");
    assert.ok(!allows(etcdNp, "client", { [Object.keys(one(docs, "Pod").metadata.labels).find((k) => k.endsWith("-client"))]: "true" }),
      "client-labelled pods must not reach etcd's client port");
    // Prometheus scrapes every node through the HTTP Service, and nothing of etcd's.
    const sm = one(docs, "ServiceMonitor");
    const scraped = docs.filter((d) => d.kind === "Service" && matches(sm.spec.selector.matchLabels, d.metadata.labels));
    assert.deepStrictEqual(scraped.map((s) => s.metadata.name), [`${sts.metadata.name}-http`]);
    assert.ok(matches(scraped[0].spec.selector, sts.spec.template.metadata.labels));
    one(docs, "PrometheusRule");
    // The helm test checks the cluster: every node alive, every partition led.
    const test = one(docs, "Pod").spec.containers[0].args[0];
    assert.ok(test.includes("--json cluster") && test.includes("want=3"));
  },
  "cluster-external-etcd"(docs) {
    const sts = brokerSts(docs);
    const pod = sts.spec.template.spec;
    const c = container(docs);
    assert.strictEqual(sts.spec.replicas, 5);
    assert.strictEqual(sts.spec.minReadySeconds, 30);
    assert.ok(c.args.includes("--cluster-etcd=http://etcd-0.etcd.infra.svc:2379,http://etcd-1.etcd.infra.svc:2379,https://etcd-2.example.com:2379"));
    assert.ok(c.args.includes("--advertise-address=$(POD_NAME).jobs-headless.jobs.svc.k8s.example.internal:7070"));
    for (const f of ["--cluster-name=billing", "--partitions=30", "--replication-factor=5", "--min-in-sync=3", "--cluster-lease-ttl=5", "--cluster-etcd-wait=300", "--cluster-initial-nodes=5"]) {
      assert.ok(c.args.includes(f), f);
    }
    // No etcd of the release, nothing to wait for, no preStop sleep.
    assert.ok(!docs.some((d) => d.metadata.labels["app.kubernetes.io/component"] === "etcd"));
    assert.strictEqual(pod.initContainers, undefined);
    assert.strictEqual(c.lifecycle, undefined);
    assert.strictEqual(pod.terminationGracePeriodSeconds, 20);
    // A constraint with its own labelSelector is kept as given.
    assert.deepStrictEqual(pod.topologySpreadConstraints, [{ maxSkew: 1, topologyKey: "topology.kubernetes.io/zone",
      whenUnsatisfiable: "DoNotSchedule", labelSelector: { matchLabels: { "app.kubernetes.io/name": "jobbroker", "app.kubernetes.io/instance": "r" } } }]);
    // Without allowSameNamespace the nodes still reach each other.
    const np = one(docs, "NetworkPolicy");
    const grpc = np.spec.ingress.find((r) => r.ports.some((p) => p.port === "grpc"));
    assert.ok(grpc.from.some((f) => f.podSelector && f.podSelector.matchLabels && matches(f.podSelector.matchLabels, sts.spec.template.metadata.labels)));
    assert.ok(!grpc.from.some((f) => f.podSelector && Object.keys(f.podSelector).length === 0));
  },
  "cluster-auth"(docs) {
    const sts = brokerSts(docs);
    const etcd = etcdSts(docs);
    const c = container(docs);
    assert.ok(c.args.includes("--auth-tokens=/etc/jobbroker/auth/tokens.json"));
    assert.ok(c.args.includes("--cluster-peer-token-file=/etc/jobbroker/peer/token"));
    const vol = sts.spec.template.spec.volumes.find((v) => v.name === "peer-token");
    assert.strictEqual(vol.secret.secretName, "jobbroker-peer");
    assert.deepStrictEqual(vol.secret.items, [{ key: "token", path: "token" }]);
    const mount = c.volumeMounts.find((m) => m.name === "peer-token");
    assert.strictEqual(mount.mountPath, "/etc/jobbroker/peer");
    assert.ok(mount.readOnly);
    // Five etcd members, with the extra flag after the chart's own, on their own class.
    assert.strictEqual(etcd.spec.replicas, 5);
    const e = etcd.spec.template.spec.containers[0];
    assert.strictEqual(e.args.find((a) => a.startsWith("--initial-cluster=")).split(",").length, 5);
    assert.strictEqual(e.args[e.args.length - 1], "--quota-backend-bytes=4294967296");
    assert.strictEqual(c.args.find((a) => a.startsWith("--cluster-etcd=")).split(",").length, 5);
    assert.strictEqual(etcd.spec.volumeClaimTemplates[0].spec.storageClassName, "fast-ssd");
    assert.strictEqual(etcd.spec.volumeClaimTemplates[0].spec.resources.requests.storage, "1Gi");
    assert.strictEqual(sts.spec.volumeClaimTemplates[0].spec.storageClassName, "standard");
    // GetCluster needs a token the test pod does not have: it checks health only.
    assert.ok(!one(docs, "Pod").spec.containers[0].args[0].includes("cluster"));
  },
  "cluster-rf1-dev"(docs) {
    const sts = brokerSts(docs);
    const etcd = etcdSts(docs);
    assert.strictEqual(sts.spec.replicas, 1);
    assert.strictEqual(etcd.spec.replicas, 1);
    assert.ok(container(docs).args.includes("--replication-factor=1"));
    assert.ok(container(docs).args.includes("--min-in-sync=1"));
    assert.ok(container(docs).args.includes("--cluster-initial-nodes=1"));
    // The peer token defaults to the auth Secret's key peer-token.
    const vol = sts.spec.template.spec.volumes.find((v) => v.name === "peer-token");
    assert.strictEqual(vol.secret.secretName, "jobbroker-tokens");
    assert.deepStrictEqual(vol.secret.items, [{ key: "peer-token", path: "token" }]);
    assert.ok(!docs.some((d) => d.kind === "PodDisruptionBudget"));
  },
  "everything-else"(docs) {
    const sts = one(docs, "StatefulSet");
    const c = container(docs);
    assert.strictEqual(c.image, "registry.example.com/jobbroker@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
    assert.ok(c.args.includes("--metrics=off"));
    assert.ok(c.args.includes("--keepalive-time=30"));
    assert.ok(c.args.includes("--keepalive-timeout=10"));
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
