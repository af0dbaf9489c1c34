#!/usr/bin/env node
'use strict';
// Semaphore acquire+release throughput of redis-semaphore (npm): W async
// workers in one process share one ioredis connection, each looping
// acquire -> release of one permit of ONE semaphore of N permits. One op =
// one acquire+release pair. Compare with `jobguard bench --permits N`.
const { Semaphore } = require('redis-semaphore');
const { connect } = require('./lib/locks');
const { parseArgs, nowUs, percentile, round } = require('./lib/util');

const USAGE = `usage: semaphore-bench.js --redis URL [--permits N] [--workers W] [--seconds S] [--json]
  --redis URL     redis:// URL of the server to measure against (required)
  --permits N     permits of the semaphore (default 64)
  --workers W     concurrent async workers in this one process (default 64)
  --seconds S     measured duration (default 3)
  --warmup S      unmeasured warm-up before it (default 0.5)
  --key K         the semaphore's key (default bench:semaphore)
  --json          one JSON object on stdout
`;

async function main() {
  const opt = parseArgs(process.argv.slice(2), {
    redis: { type: 'string', required: true },
    permits: { type: 'int', default: 64, min: 1 },
    workers: { type: 'int', default: 64, min: 1 },
    seconds: { type: 'number', default: 3 },
    warmup: { type: 'number', default: 0.5 },
    key: { type: 'string', default: 'bench:semaphore' },
    json: { type: 'bool', default: false },
  }, USAGE);
  const client = connect(opt.redis, {});
  try {
    await client.ping();
  } catch (e) {
    process.stderr.write(`cannot reach Redis at ${opt.redis}: ${e.message}\n`);
    process.exit(69);
  }
  const start = nowUs();
  const measureFrom = start + opt.warmup * 1e6;
  const end = measureFrom + opt.seconds * 1e6;
  const latencies = [];
  let errors = 0;
  let firstError = null;
  async function worker() {
    for (;;) {
      const t0 = nowUs();
      if (t0 >= end) return;
      // Its defaults but auto-refresh off: a pair is shorter than any refresh.
      const s = new Semaphore(client, opt.key, opt.permits,
                              { lockTimeout: 30000, acquireTimeout: 10000, retryInterval: 10, refreshInterval: 0 });
      let ok = false;
      try {
        await s.acquire();
        await s.release();
        ok = true;
      } catch (e) {
        if (!firstError) firstError = e.message;
      }
      const t1 = nowUs();
      if (t0 < measureFrom || t1 > end) continue;
      if (ok) latencies.push(t1 - t0);
      else errors++;
    }
  }
  await Promise.all(Array.from({ length: opt.workers }, () => worker()));
  await client.quit().catch(() => client.disconnect());
  const result = {
    peer: 'redis-semaphore',
    version: require('redis-semaphore/package.json').version,
    permits: opt.permits,
    workers: opt.workers,
    seconds: opt.seconds,
    ops: latencies.length,
    ops_per_s: Math.round(latencies.length / opt.seconds),
    p50_us: round(percentile(latencies, 50)),
    p99_us: round(percentile(latencies, 99)),
    errors,
  };
  if (firstError) result.first_error = firstError;
  if (opt.json) process.stdout.write(`${JSON.stringify(result)}\n`);
  else process.stdout.write(`${result.peer} ${result.version}: ${result.permits} permits, ${result.workers} workers, ` +
                            `${result.ops_per_s} acquire+release/s, p50 ${result.p50_us} us, p99 ${result.p99_us} us, errors ${errors}\n`);
}

main().catch((e) => {
  process.stderr.write(`semaphore-bench: ${e.stack || e}\n`);
  process.exit(1);
});
