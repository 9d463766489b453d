// Generates TypeScript message types and gRPC service clients for proto/jobbroker/v1/*.proto
// into src/gen/ with protoc and the ts-proto plugin. Run by `npm run build`; the output is not
// committed.
import { execFileSync } from "node:child_process";
import { mkdirSync, readdirSync, rmSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const pkg = path.resolve(here, "..");
const protoRoot = path.resolve(pkg, "../../proto");
const out = path.join(pkg, "src/gen");
const plugin = path.join(pkg, "node_modules/.bin/protoc-gen-ts_proto");
const protoc = process.env.PROTOC ?? "protoc";

const protos = readdirSync(path.join(protoRoot, "jobbroker/v1"))
  .filter((f) => f.endsWith(".proto"))
  .sort()
  .map((f) => `jobbroker/v1/${f}`);

rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
execFileSync(
  protoc,
  [
    `--plugin=protoc-gen-ts_proto=${plugin}`,
    `--ts_proto_out=${out}`,
    "--ts_proto_opt=outputServices=grpc-js,esModuleInterop=true,env=node,useDate=true,forceLong=number",
    `-I${protoRoot}`,
    ...protos,
  ],
  { stdio: "inherit" },
);
console.log(`generated ${protos.length} protos into src/gen`);
