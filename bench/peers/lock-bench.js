#!/usr/bin/env node
'use strict';
// Acquire+release throughput of the Node.js peers on distinct keys: N async
// workers in one process share one ioredis connection (as an application
// shares its client), each looping acquire -> release on a fresh key.
// One op = one acquire+release pair. Compare with `jobguard bench`.
const { lockKey, connect, makeLock, PEER_NAME } = require('./lib/locks');
const { parseArgs, nowUs, percentile, round } = require('./lib/util');

const USAGE = `usage: lock-bench.js --redis URL [--workers N] [--seconds S] --mode plain|redlock [--json]
  --redis URL         redis:// URL of the server to measure against (required)
  --workers N         concurrent async workers in this one process (default 64)
  --seconds S         measured duration (default 3)
  --warmup S          unmeasured warm-up before it (default 0.5)
  --mode M            plain  = SET NX PX + compare-and-delete script (the seed's pattern)
                      redlock = node-redlock acquire/release, retryCount 0
  --connections C     ioredis connections the workers share round-robin (default 1)
  --auto-pipelining   turn on ioredis enableAutoPipelining (off by default, as in ioredis)
  --json              one JSON object on stdout
`;

const TTL_MS = 30000;

async function main() {
  const opt = parseArgs(process.argv.slice(2), {
    redis: { type: 'string', required: true },
    workers: { type: 'int', default: 64, min: 1 },
    seconds: { type: 'number', default: 3 },
    warmup: { type: 'number', default: 0.5 },
    mode: { type: 'string', required: true, choices: ['plain', 'redlock'] },
    connections: { type: 'int', default: 1, min: 1 },
    'auto-pipelining': { type: 'bool', default: false },
    json: { type: 'bool', default: false },
  }, USAGE);
  if (opt.seconds <= 0) {
    process.stderr.write(`--seconds: expected a positive number, got ${opt.seconds}\n`);
    process.exit(64);
  }

  const clients = [];
  const locks = [];
  for (let c = 0; c < opt.connections; c++) {
    const client = connect(opt.redis, { enableAutoPipelining: opt['auto-pipelining'] });
    clients.push(client);
    locks.push(makeLock(opt.mode, client));
  }
  try {
    await Promise.all(clients.map((c) => c.ping()));
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

  async function worker(w) {
    const lock = locks[w % locks.length];
    for (let i = 0; ; i++) {
      const t0 = nowUs();
      if (t0 >= end) return;
      const key = lockKey(`bench:${w}:${i}`);
      let ok = false;
      try {
        const handle = await lock.tryAcquire(key, TTL_MS);
        if (handle) ok = await lock.release(handle);
      } catch (e) {
        if (!firstError) firstError = e.message;
      }
      const t1 = nowUs();
      if (t0 < measureFrom || t1 > end) continue;
      if (ok) latencies.push(t1 - t0);
      else errors++;
    }
  }

  await Promise.all(Array.from({ length: opt.workers }, (_, w) => worker(w)));
  await Promise.all(clients.map((c) => c.quit().catch(() => c.disconnect())));

  const result = {
    peer: PEER_NAME[opt.mode],
    workers: opt.workers,
    connections: opt.connections,
    auto_pipelining: opt['auto-pipelining'],
    seconds: opt.seconds,
    ops: latencies.length,
    ops_per_s: Math.round(latencies.length / opt.seconds),
    p50_us: round(percentile(latencies, 50)),
    p99_us: round(percentile(latencies, 99)),
    errors,
  };
  if (firstError) result.first_error = firstError;
  if (opt.json) {
    process.stdout.write(`${JSON.stringify(result)}\n`);
  } else {
    process.stdout.write(
      `${result.peer}: ${result.workers} workers, ${result.ops_per_s} acquire+release/s, ` +
        `p50 ${result.p50_us} us, p99 ${result.p99_us} us, errors ${errors}\n`);
  }
}

main().catch((e) => {
  process.stderr.write(`lock-bench: ${e.stack || e}\n`);
  process.exit(1);
});
