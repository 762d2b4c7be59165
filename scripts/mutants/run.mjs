/**
 * `npm run chaos:mutants [-- --only name,name] [--seeds 1,2] [--jobs 2]`: plants each bug of
 * scripts/mutants/mutants.mjs, one at a time, in a copy of the project, and runs the detector it
 * names with each seed; every run must catch it. First the same detectors run on the unchanged
 * copy and must pass: otherwise "caught" would mean nothing. The working tree is never changed.
 * Prints a table (mutant, detector, seed, caught, seconds) and exits 1 if a mutant survived or an
 * unchanged detector failed. MUTANTS_KEEP=1 keeps the copies and logs.
 */
import { spawn } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { DETECTORS, MUTANTS, SEEDS } from './mutants.mjs';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const args = process.argv.slice(2);
const option = (name) => (args.includes(`--${name}`) ? args[args.indexOf(`--${name}`) + 1] : undefined);
const only = option('only')?.split(',');
const asked = (option('seeds') ?? process.env.MUTANT_SEEDS)?.split(',').map(Number);
/** The seeds of a detector: those asked for, else its own, else the set's. */
const seedsOf = (detector) => asked ?? DETECTORS[detector].seeds ?? SEEDS;
const jobs = Number(option('jobs') ?? 2);
const keep = process.env.MUTANTS_KEEP === '1';
const started = performance.now();

const mutants = MUTANTS.filter((m) => !only || only.includes(m.name));
if (only && mutants.length !== only.length) fail(`Unknown mutant(s): ${only.filter((n) => !MUTANTS.some((m) => m.name === n)).join(', ')}`);

/** The mutated text of a file, or a loud failure when a search text is not found exactly once. */
function mutate(mutant) {
  const original = readFileSync(join(root, mutant.file), 'utf8');
  let text = original;
  for (const [search, replacement] of mutant.replace) {
    const count = text.split(search).length - 1;
    if (count !== 1) {
      fail(
        `Mutant ${mutant.name}: the text to replace occurs ${count} times in ${mutant.file} (once expected); ` +
          `the code changed under it: update scripts/mutants/mutants.mjs.\n  text: ${JSON.stringify(search)}`,
      );
    }
    text = text.replace(search, () => replacement);
  }
  return { original, text };
}

function fail(message) {
  console.error(message);
  process.exit(2);
}

// Every mutant's text is checked before anything runs.
const planted = new Map(mutants.map((m) => [m.name, mutate(m)]));

/** A copy of what the detectors need, node_modules linked; chaos runs from its own build. */
function workspace(slot) {
  const dir = mkdtempSync(join(tmpdir(), `mutants-${slot}-`));
  for (const entry of ['lib', 'chaos', 'test']) cpSync(join(root, entry), join(dir, entry), { recursive: true });
  for (const file of ['tsconfig.json', 'tsconfig.jest.json', 'jest.config.js', 'package.json']) cpSync(join(root, file), join(dir, file));
  symlinkSync(join(root, 'node_modules'), join(dir, 'node_modules'), 'dir');
  writeFileSync(
    join(dir, 'tsconfig.mutants.json'),
    JSON.stringify({
      extends: './tsconfig.json',
      compilerOptions: { sourceMap: false, declaration: false },
      include: [],
      files: ['chaos/run.ts', 'chaos/chaos.worker.ts'],
    }),
  );
  return { dir, built: false, log: join(dir, 'logs') };
}

/** Runs a command in its own process group; resolves its exit code (killed after `timeoutMs`). */
function exec(command, argv, { cwd, env, logFile, timeoutMs }) {
  return new Promise((done) => {
    const out = [];
    const child = spawn(command, argv, { cwd, env: { ...process.env, ...env }, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout.on('data', (chunk) => out.push(chunk));
    child.stderr.on('data', (chunk) => out.push(chunk));
    const timer = setTimeout(() => {
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch {
        // Already gone.
      }
    }, timeoutMs);
    running.add(child);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      running.delete(child);
      const output = Buffer.concat(out).toString();
      if (logFile) writeFileSync(logFile, output);
      done({ code: code ?? (signal ? 128 : 1), output, timedOut: signal === 'SIGKILL' });
    });
  });
}

const running = new Set();
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => {
    for (const child of running) {
      try {
        process.kill(-child.pid, 'SIGTERM');
      } catch {
        // Already gone.
      }
    }
    cleanUp();
    process.exit(130);
  });
}

async function build(ws) {
  if (ws.built) return;
  const result = await exec(process.execPath, ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.mutants.json'], {
    cwd: ws.dir,
    timeoutMs: 300_000,
  });
  if (result.code !== 0) fail(`The chaos harness does not compile in ${ws.dir}:\n${result.output.slice(-3000)}`);
  ws.built = true;
}

/** The compiled file of a source, for the chaos build: transpiled alone, as tsc emits it. */
function emit(ws, file, text) {
  const { compilerOptions } = ts.convertCompilerOptionsFromJson(
    JSON.parse(readFileSync(join(ws.dir, 'tsconfig.json'), 'utf8')).compilerOptions,
    ws.dir,
  );
  const output = ts.transpileModule(text, {
    compilerOptions: { ...compilerOptions, sourceMap: false, declaration: false },
    fileName: join(ws.dir, file),
  });
  writeFileSync(join(ws.dir, 'dist-dev', file.replace(/\.ts$/, '.js')), output.outputText);
}

const escapeRegExp = (text) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/**
 * One run of a detector in `ws` (its mutant, if any, already planted): 'failed' when it found a
 * broken promise, 'passed' when it did not, 'error' when it could not tell (a compile error, a
 * store that did not start).
 */
async function detect(ws, name, seeds, label) {
  const detector = DETECTORS[name];
  mkdirSync(ws.log, { recursive: true });
  const logFile = join(ws.log, `${label}-${seeds.join('-')}.log`);
  const bySeed = (outcome, detail) =>
    seeds.map((seed) => ({ seed, outcome, detail, failure: outcome === 'error' ? logTail(logFile) : undefined, logFile }));
  if (detector.kind === 'jest') {
    const report = join(ws.log, `${label}-${seeds.join('-')}.json`);
    // Seeded detectors run a test per seed (MODEL_SEEDS), all in one process.
    const pattern = detector.seeded ? `${escapeRegExp(detector.test)}, seed (${seeds.join('|')})$` : escapeRegExp(detector.test);
    const result = await exec(
      process.execPath,
      [
        '--experimental-vm-modules',
        'node_modules/jest/bin/jest.js',
        '--selectProjects',
        'main',
        '--testPathPatterns',
        escapeRegExp(detector.file),
        '-t',
        pattern,
        '--json',
        '--outputFile',
        report,
      ],
      { cwd: ws.dir, env: { ...detector.env, MODEL_SEEDS: seeds.join(',') }, logFile, timeoutMs: 900_000 },
    );
    let summary;
    try {
      summary = JSON.parse(readFileSync(report, 'utf8'));
    } catch {
      return bySeed('error', `no report (exit ${result.code}${result.timedOut ? ', timed out' : ''})`);
    }
    const tests = summary.testResults.flatMap((file) => file.assertionResults).filter((t) => t.status !== 'pending');
    return seeds.map((seed) => {
      const test = detector.seeded ? tests.find((t) => t.title.endsWith(`, seed ${seed}`)) : tests[0];
      const outcome = test?.status === 'failed' ? 'failed' : test?.status === 'passed' ? 'passed' : 'error';
      const message = test?.failureMessages?.[0]?.split('\n') ?? [];
      const detail =
        test === undefined
          ? 'the test did not run'
          : message
              .find((l) => /: (at |token |the store )|Expected/.test(l))
              ?.trim()
              .slice(0, 160);
      // Its first lines: the log goes with the copy, and on CI what is printed is all that is kept.
      const failure = message.slice(0, 24).join('\n');
      return { seed, outcome, detail, failure, logFile };
    });
  }
  const [seed] = seeds;
  const result = await exec(
    process.execPath,
    ['dist-dev/chaos/run.js', '--seconds', String(detector.seconds), '--backend', detector.backend, '--seed', String(seed), '--json'],
    { cwd: ws.dir, logFile, timeoutMs: (detector.seconds + 240) * 1000 },
  );
  const line = result.output.split('\n').find((l) => l.startsWith('{"backend"'));
  if (!line) return bySeed('error', `no report (exit ${result.code}${result.timedOut ? ', timed out' : ''})`);
  const counted = Object.entries(JSON.parse(line).violations).filter(([kind]) => !detector.kinds || detector.kinds.includes(kind));
  const violations = counted.filter(([, count]) => count > 0);
  if (violations.length > 0) return bySeed('failed', violations.map(([kind, count]) => `${kind} ${count}`).join(', '));
  return bySeed('passed');
}

/** The last lines of a log, read before its copy is removed. */
function logTail(file) {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-24).join('\n');
  } catch {
    return undefined;
  }
}

/** Runs one task (a detector on the unchanged copy, or on a mutant) in `ws`, restoring the copy after. */
async function perform(ws, task) {
  const t0 = performance.now();
  const mutant = task.mutant;
  // Built from the unchanged sources; a mutant's file is then emitted over its build.
  if (DETECTORS[task.detector].kind === 'chaos') await build(ws);
  if (mutant) {
    writeFileSync(join(ws.dir, mutant.file), planted.get(mutant.name).text);
    if (ws.built) emit(ws, mutant.file, planted.get(mutant.name).text);
  }
  try {
    const outcomes = await detect(ws, task.detector, task.seeds, mutant?.name ?? `unchanged-${task.detector}`);
    // Several seeds in one process: each is given its share of the time.
    return outcomes.map((o) => ({ ...task, ...o, seconds: (performance.now() - t0) / 1000 / outcomes.length }));
  } finally {
    if (mutant) {
      writeFileSync(join(ws.dir, mutant.file), planted.get(mutant.name).original);
      if (ws.built) emit(ws, mutant.file, planted.get(mutant.name).original);
    }
  }
}

const workspaces = [];
function cleanUp() {
  if (keep) {
    console.error(`Kept: ${workspaces.map((ws) => ws.dir).join(', ')}`);
    return;
  }
  for (const ws of workspaces) rmSync(ws.dir, { recursive: true, force: true });
}

// The unchanged copy first, one run per detector and seed used; then every mutant with every seed.
const detectorsUsed = [...new Set(mutants.map((m) => m.detector))];
/** A chaos run per seed; a seeded test runs its seeds in one process; an unseeded test once. */
const runsOf = (detector) => {
  const d = DETECTORS[detector];
  return d.kind === 'chaos' ? seedsOf(detector).map((seed) => [seed]) : d.seeded ? [seedsOf(detector)] : [['-']];
};
const tasks = [
  ...detectorsUsed.flatMap((detector) => runsOf(detector).map((s) => ({ detector, seeds: s }))),
  ...mutants.flatMap((mutant) => runsOf(mutant.detector).map((s) => ({ detector: mutant.detector, seeds: s, mutant }))),
];
const results = [];
try {
  for (let i = 0; i < Math.min(jobs, tasks.length); i++) workspaces.push(workspace(i));
  let next = 0;
  await Promise.all(
    workspaces.map(async (ws) => {
      while (next < tasks.length) {
        const task = tasks[next++];
        for (const result of await perform(ws, task)) {
          results.push(result);
          const what = task.mutant ? task.mutant.name : `(unchanged) ${task.detector}`;
          const verdict = task.mutant
            ? result.outcome === 'failed'
              ? 'caught'
              : result.outcome === 'passed'
                ? 'SURVIVED'
                : 'ERROR'
            : result.outcome === 'passed'
              ? 'passes'
              : result.outcome.toUpperCase();
          const detail = result.detail ? ` (${result.detail})` : '';
          process.stderr.write(`${what}, seed ${result.seed}: ${verdict} in ${result.seconds.toFixed(0)} s${detail}\n`);
        }
      }
    }),
  );
} finally {
  cleanUp();
}

const order = (r) => tasks.findIndex((t) => t.detector === r.detector && t.seeds.includes(r.seed) && t.mutant === r.mutant);
results.sort((a, b) => order(a) - order(b) || String(a.seed).localeCompare(String(b.seed)));
const rows = results.map((r) => ({
  mutant: r.mutant ? r.mutant.name : '(unchanged)',
  detector: r.detector + (DETECTORS[r.detector].kind === 'chaos' ? ` ${DETECTORS[r.detector].seconds} s` : ''),
  seed: String(r.seed),
  caught: r.mutant
    ? r.outcome === 'failed'
      ? 'yes'
      : r.outcome === 'passed'
        ? 'NO'
        : 'error'
    : r.outcome === 'passed'
      ? '(passes)'
      : 'FAILS',
  seconds: r.seconds.toFixed(0),
}));
const columns = ['mutant', 'detector', 'seed', 'caught', 'seconds'];
const widths = columns.map((c) => Math.max(c.length, ...rows.map((row) => row[c].length)));
const line = (cells) => `| ${cells.map((cell, i) => cell.padEnd(widths[i])).join(' | ')} |`;
console.log(line(columns));
console.log(`|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`);
for (const row of rows) console.log(line(columns.map((c) => row[c])));
for (const m of mutants) console.log(`\n${m.name}: ${m.bug}.`);

const survived = results.filter((r) => r.mutant && r.outcome !== 'failed');
const broken = results.filter((r) => !r.mutant && r.outcome !== 'passed');
const total = (performance.now() - started) / 1000;
console.log(
  `\n${results.filter((r) => r.mutant && r.outcome === 'failed').length} of ${results.filter((r) => r.mutant).length} mutant runs caught, ` +
    `${survived.length} not; unchanged detectors: ${broken.length === 0 ? 'all pass' : `${broken.length} FAIL`}; ${total.toFixed(0)} s in all, ${jobs} at a time.`,
);
for (const r of [...broken, ...survived]) {
  console.log(`  see ${r.logFile}${keep ? '' : ' (MUTANTS_KEEP=1 keeps it)'}`);
  if (r.failure) console.log(r.failure.replace(/^/gm, '    '));
  else if (r.detail) console.log(`    ${r.detail}`);
}
process.exit(survived.length > 0 || broken.length > 0 ? 1 : 0);
