// The whole build of the package, as `npm run build` and `npm pack` (prepack) run it:
//   1. scripts/generate.mjs: protoc + ts-proto -> src/gen/, VERSION -> src/gen/version.ts and
//      package.json's version;
//   2. tsc -p tsconfig.json: the CommonJS build, dist/src/ (and the tests, dist/test/);
//   3. tsc -p tsconfig.esm.json: the ESM build, dist/esm/, marked "type": "module";
//   4. the repository's LICENSE copied next to package.json, so the tarball carries it.
// package.json's "exports" sends `import` to dist/esm and `require` to dist/src.
import { execFileSync } from "node:child_process";
import { copyFileSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const pkg = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const tsc = path.join(pkg, "node_modules/typescript/bin/tsc");
const run = (file, args) => execFileSync(process.execPath, [file, ...args], { cwd: pkg, stdio: "inherit" });

run(path.join(pkg, "scripts/generate.mjs"), []);
rmSync(path.join(pkg, "dist"), { recursive: true, force: true });
run(tsc, ["-p", "tsconfig.json"]);
run(tsc, ["-p", "tsconfig.esm.json"]);
writeFileSync(path.join(pkg, "dist/esm/package.json"), JSON.stringify({ type: "module" }, null, 2) + "\n");
copyFileSync(path.resolve(pkg, "../../LICENSE"), path.join(pkg, "LICENSE"));
console.log("build: dist/src (CommonJS), dist/esm (ESM), LICENSE");
