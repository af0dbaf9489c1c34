'use strict';
// Small helpers shared by the bench scripts and tests/interop: flag parsing
// with one-line errors, monotonic time, percentiles.

function usageError(msg) {
  process.stderr.write(`${msg}\n`);
  process.exit(64);
}

// spec: { name: { type: 'string'|'int'|'number'|'bool', default, choices } }
function parseArgs(argv, spec, usage) {
  const out = {};
  for (const [name, s] of Object.entries(spec)) out[name] = s.default;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--help' || arg === '-h') {
      process.stdout.write(usage);
      process.exit(0);
    }
    if (!arg.startsWith('--')) usageError(`unexpected argument ${JSON.stringify(arg)} (see --help)`);
    let name = arg.slice(2);
    let value;
    const eq = name.indexOf('=');
    if (eq >= 0) {
      value = name.slice(eq + 1);
      name = name.slice(0, eq);
    }
    const s = spec[name];
    if (!s) usageError(`unknown option --${name} (see --help)`);
    if (s.type === 'bool') {
      out[name] = value === undefined ? true : value !== 'false' && value !== '0';
      continue;
    }
    if (value === undefined) {
      if (i + 1 >= argv.length) usageError(`--${name} needs a value`);
      value = argv[++i];
    }
    if (s.type === 'int' || s.type === 'number') {
      const n = Number(value);
      if (!Number.isFinite(n) || (s.type === 'int' && !Number.isInteger(n)) || n < (s.min ?? 0)) {
        usageError(`--${name}: expected ${s.type === 'int' ? 'an integer' : 'a number'} >= ${s.min ?? 0}, got ${JSON.stringify(value)}`);
      }
      out[name] = n;
    } else {
      if (s.choices && !s.choices.includes(value)) {
        usageError(`--${name}: expected one of ${s.choices.join('|')}, got ${JSON.stringify(value)}`);
      }
      out[name] = value;
    }
  }
  for (const [name, s] of Object.entries(spec)) {
    if (s.required && out[name] === undefined) usageError(`--${name} is required (see --help)`);
  }
  return out;
}

// Monotonic microseconds. process.hrtime is CLOCK_MONOTONIC on Linux, so
// values from different processes on one machine are comparable.
function nowUs() {
  return Number(process.hrtime.bigint() / 1000n);
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// Nearest-rank percentile of an unsorted numeric array (sorted copy).
function percentile(values, p) {
  if (values.length === 0) return null;
  const sorted = Float64Array.from(values).sort();
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank];
}

function round(x, digits = 1) {
  if (x === null || x === undefined) return null;
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

module.exports = { usageError, parseArgs, nowUs, sleep, percentile, round };
