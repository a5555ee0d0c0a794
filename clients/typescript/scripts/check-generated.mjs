// Checks that src/generated/openapi.ts is what `npm run generate` makes of docs/openapi.json
// today: regenerates it into a temporary file with the same generator and compares.
// LONGHAUL_OPENAPI names another description to compare against (the Rust test uses it to
// see that this check can fail).
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const spec = process.env.LONGHAUL_OPENAPI ?? join(root, "..", "..", "docs", "openapi.json");
const committed = join(root, "src", "generated", "openapi.ts");
const dir = mkdtempSync(join(tmpdir(), "longhaul-openapi-"));
try {
  const fresh = join(dir, "openapi.ts");
  const cli = join(root, "node_modules", "openapi-typescript", "bin", "cli.js");
  execFileSync(process.execPath, [cli, spec, "--output", fresh], { cwd: root, stdio: "pipe" });
  const want = readFileSync(fresh, "utf8");
  const have = readFileSync(committed, "utf8");
  if (want !== have) {
    const a = have.split("\n");
    const b = want.split("\n");
    let line = 0;
    while (line < a.length && a[line] === b[line]) line++;
    console.error(
      `src/generated/openapi.ts is not current with ${spec}: first difference at line ${line + 1}:\n` +
        `  committed: ${JSON.stringify(a[line])}\n  generated: ${JSON.stringify(b[line])}\n` +
        "Run `npm run generate` in clients/typescript and commit the result.",
    );
    process.exit(1);
  }
  console.log("src/generated/openapi.ts is current with docs/openapi.json");
} finally {
  rmSync(dir, { recursive: true, force: true });
}
