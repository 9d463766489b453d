#!/usr/bin/env node
// Validates rendered Kubernetes manifests offline, against the JSON schemas that the npm packages
// kubernetes-models (Kubernetes 1.33 API) and @kubernetes-models/prometheus-operator ship as
// compiled validators.
//
// Those validators check types, enums, formats and required fields, but let unknown fields
// through (Kubernetes' OpenAPI schemas have no additionalProperties: false), so a misspelled
// `spec.replica` would pass. To catch those, each document is validated through a Proxy that
// records every property the validator reads: a generated validator reads every property its
// schema defines (`data.replicas === undefined || check(data.replicas)`), and iterates the keys
// of maps (labels, annotations, ConfigMap data). A property of the document that the validator
// never read is one the schema does not define: an unknown field.
//
// usage: node validate.js FILE.yaml...     every document of every file; exit 1 on any problem
//        node validate.js --self-test FILE  checks that misspelled fields, wrong types and
//                                           unknown kinds in FILE's documents are caught
"use strict";
const fs = require("fs");
const path = require("path");
const yaml = require("js-yaml");

// apiVersion -> the package folder holding its models.
function modelModule(apiVersion, kind) {
  if (apiVersion === "monitoring.coreos.com/v1") {
    return `@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/${kind}`;
  }
  return `kubernetes-models/${apiVersion}/${kind}`;
}

// The compiled schema validator of a kind: the model module names its schema file.
const validators = new Map();
function validatorFor(apiVersion, kind) {
  const key = `${apiVersion}/${kind}`;
  if (validators.has(key)) return validators.get(key);
  let validate = null;
  try {
    const file = require.resolve(modelModule(apiVersion, kind));
    const m = /require\("(\.\.\/[^"]*_schemas\/[^"]+\.js)"\)/.exec(fs.readFileSync(file, "utf8"));
    if (m) validate = require(path.resolve(path.dirname(file), m[1])).validate;
  } catch (e) {
    validate = null;
  }
  validators.set(key, validate);
  return validate;
}

// The compiled validators carry no messages: say what failed from the keyword and its params.
function describe(e) {
  const p = e.params || {};
  switch (e.keyword) {
    case "type": return `must be ${p.type}`;
    case "required": return `missing required field ${p.missingProperty}`;
    case "enum": return `must be one of ${JSON.stringify(p.allowedValues)}`;
    case "format": return `must have format ${p.format}`;
    case "pattern": return `must match ${p.pattern}`;
    default: return `${e.keyword} ${JSON.stringify(p)}`;
  }
}

// Validates one document; returns a list of problems ("path: message").
function check(doc) {
  if (!doc || typeof doc !== "object") return ["document is not an object"];
  const { apiVersion, kind } = doc;
  const validate = validatorFor(apiVersion, kind);
  if (!validate) return [`no schema for apiVersion ${apiVersion} kind ${kind}`];
  const read = new Map();
  const proxies = new WeakMap();
  const wrap = (o) => {
    if (o === null || typeof o !== "object") return o;
    if (proxies.has(o)) return proxies.get(o);
    read.set(o, new Set());
    const p = new Proxy(o, {
      get(target, key, receiver) {
        if (typeof key === "string") read.get(target).add(key);
        return wrap(Reflect.get(target, key, receiver));
      },
      has(target, key) {
        if (typeof key === "string") read.get(target).add(key);
        return Reflect.has(target, key);
      },
    });
    proxies.set(o, p);
    return p;
  };
  const problems = [];
  if (!validate(wrap(doc))) {
    for (const e of validate.errors || []) {
      problems.push(`${e.instancePath || "/"}: ${describe(e)}`);
    }
  }
  const walk = (o, at) => {
    if (Array.isArray(o)) return o.forEach((v, i) => walk(v, `${at}/${i}`));
    if (o === null || typeof o !== "object") return;
    const seen = read.get(o);
    for (const k of Object.keys(o)) {
      if (!seen || !seen.has(k)) problems.push(`${at}/${k}: unknown field (not in the ${kind} schema)`);
      else walk(o[k], `${at}/${k}`);
    }
  };
  walk(doc, "");
  return problems;
}

function documents(file) {
  return yaml.loadAll(fs.readFileSync(file, "utf8")).filter((d) => d !== null && d !== undefined);
}

function name(doc) {
  return `${doc && doc.kind}/${doc && doc.metadata && doc.metadata.name}`;
}

function selfTest(file) {
  const docs = documents(file);
  const find = (kind) => {
    const d = docs.find((x) => x.kind === kind);
    if (!d) throw new Error(`self-test: no ${kind} in ${file}`);
    return JSON.parse(JSON.stringify(d));
  };
  const cases = [
    ["StatefulSet spec.replica (for replicas)", "StatefulSet", (d) => { d.spec.replica = 1; }, "/spec/replica: unknown field"],
    ["pod securityContext.runAsNonRot", "StatefulSet", (d) => { d.spec.template.spec.securityContext.runAsNonRot = true; }, "/spec/template/spec/securityContext/runAsNonRot: unknown field"],
    ["container livenesProbe", "StatefulSet", (d) => { d.spec.template.spec.containers[0].livenesProbe = {}; }, "/spec/template/spec/containers/0/livenesProbe: unknown field"],
    ["probe grpc.prot", "StatefulSet", (d) => { d.spec.template.spec.containers[0].readinessProbe.grpc.prot = 1; }, "readinessProbe/grpc/prot: unknown field"],
    ["volumeClaimTemplate spec.storageClass", "StatefulSet", (d) => { d.spec.volumeClaimTemplates[0].spec.storageClass = "x"; }, "/spec/volumeClaimTemplates/0/spec/storageClass: unknown field"],
    ["replicas as a string", "StatefulSet", (d) => { d.spec.replicas = "one"; }, "/spec/replicas: must be integer"],
    ["container without a name", "StatefulSet", (d) => { delete d.spec.template.spec.containers[0].name; }, "/spec/template/spec/containers/0: missing required field name"],
    ["Service spec.port", "Service", (d) => { d.spec.port = 7070; }, "/spec/port: unknown field"],
    ["Service port.appProtocl", "Service", (d) => { d.spec.ports[0].appProtocl = "grpc"; }, "/spec/ports/0/appProtocl: unknown field"],
    ["ConfigMap datas", "ConfigMap", (d) => { d.datas = {}; }, "/datas: unknown field"],
    ["metadata.label", "ConfigMap", (d) => { d.metadata.label = {}; }, "/metadata/label: unknown field"],
    ["unknown kind", "ConfigMap", (d) => { d.kind = "ConfigMapp"; }, "no schema for apiVersion v1 kind ConfigMapp"],
  ];
  if (docs.some((x) => x.kind === "ServiceMonitor")) {
    cases.push(["ServiceMonitor endpoint (for endpoints)", "ServiceMonitor", (d) => { d.spec.endpoint = d.spec.endpoints; }, "/spec/endpoint: unknown field"]);
    cases.push(["PrometheusRule rule.alerts", "PrometheusRule", (d) => { d.spec.groups[0].rules[0].alerts = "x"; }, "/spec/groups/0/rules/0/alerts: unknown field"]);
  }
  let failed = 0;
  for (const [what, kind, mutate, expect] of cases) {
    const d = find(kind);
    if (check(d).length !== 0) throw new Error(`self-test: ${kind} of ${file} is not valid to begin with`);
    mutate(d);
    const problems = check(d);
    const ok = problems.some((p) => p.includes(expect));
    if (!ok) failed++;
    console.log(`${ok ? "caught" : "MISSED"}: ${what}${ok ? "" : ` (expected "${expect}", got ${JSON.stringify(problems)})`}`);
  }
  return failed === 0;
}

function main(args) {
  if (args[0] === "--self-test") return selfTest(args[1]) ? 0 : 1;
  let bad = 0;
  let count = 0;
  for (const file of args) {
    for (const doc of documents(file)) {
      count++;
      const problems = check(doc);
      if (problems.length) {
        bad++;
        for (const p of problems) console.log(`${path.basename(file)}: ${name(doc)}: ${p}`);
      }
    }
  }
  console.log(`${count} documents, ${bad} with problems`);
  return bad === 0 && count > 0 ? 0 : 1;
}

process.exitCode = main(process.argv.slice(2));
