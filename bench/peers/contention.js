#!/usr/bin/env node
'use strict';
// Contention on ONE key: W workers, each with its own ioredis connection (as
// separate worker processes would have), loop acquire -> hold -> release.
// A waiter learns nothing from a release in either peer: it polls (plain: a
// retry loop with a small sleep; redlock: its retryDelay/retryJitter loop),
// so the releaser, whose next acquire leaves immediately, tends to win again.
// This measures how much that costs: throughput, each worker's share, the
// handoff latency and how long a worker can starve.
const { lockKey, connect, makeLock, PEER_NAME } = require('./lib/locks');
const { parseArgs, nowUs, sleep, percentile, round } = require('./lib/util');

const USAGE = `usage: contention.js --redis URL --mode plain|redlock [options] [--json]
  --redis URL        redis:// URL (required)
  --mode M           plain   = SET NX PX; on busy sleep --retry-ms, try again
                     redlock = node-redlock acquire with retryCount 1000000 and its
                               default retryDelay 200 ms / retryJitter 100 ms
  --workers W        contending workers, one connection each (default 8)
  --seconds S        duration (default 3)
  --hold-ms H        time inside the critical section (default 1)
  --retry-ms R       plain mode: sleep between attempts (default 5)
  --resource R       lock resource; key jobguard:lock:{R} (default bench:contention)
  --json             one JSON object on stdout
`;

const TTL_MS = 30000;

async function main() {
  const opt = parseArgs(process.argv.slice(2), {
    redis: { type: 'string', required: true },
    mode: { type: 'string', required: true, choices: ['plain', 'redlock'] },
    workers: { type: 'int', default: 8, min: 2 },
    seconds: { type: 'number', default: 3 },
    'hold-ms': { type: 'number', default: 1 },
    'retry-ms': { type: 'number', default: 5 },
    resource: { type: 'string', default: 'bench:contention' },
    json: { type: 'bool', default: false },
  }, USAGE);

  const key = lockKey(opt.resource);
  const clients = Array.from({ length: opt.workers }, () => connect(opt.redis));
  try {
    await Promise.all(clients.map((c) => c.ping()));
  } catch (e) {
    process.stderr.write(`cannot reach Redis at ${opt.redis}: ${e.message}\n`);
    process.exit(69);
  }
  await clients[0].del(key);
  const redlockSettings = { retryCount: 1000000 };
  const locks = clients.map((c) => makeLock(opt.mode, c, opt.mode === 'redlock' ? redlockSettings : undefined));

  const start = nowUs();
  const end = start + opt.seconds * 1e6;
  // Shared across workers (one process, one clock): who released last and when
  // the release was *sent*. Sent, not answered: the next SET can only succeed
  // after the DEL ran, so acquire-reply minus release-send is never negative
  // (it includes half a round trip on each side).
  let lastReleaseSentUs = null;
  let lastHolder = null;
  let holder = null;
  let overlaps = 0;
  let errors = 0;
  let firstError = null;
  const handoffs = [];
  const otherHandoffs = [];  // to a worker other than the releaser: what a waiter sees
  let sameWorkerHandoffs = 0;
  const stats = Array.from({ length: opt.workers }, () => ({ count: 0, waits: [], longest: 0 }));

  async function acquire(w) {
    const lock = locks[w];
    if (opt.mode === 'redlock') return lock.tryAcquire(key, TTL_MS);
    for (;;) {
      const h = await lock.tryAcquire(key, TTL_MS);
      if (h || nowUs() >= end) return h;
      await sleep(opt['retry-ms']);
    }
  }

  async function worker(w) {
    const s = stats[w];
    while (nowUs() < end) {
      const waitStart = nowUs();
      let h;
      try {
        h = await acquire(w);
      } catch (e) {
        errors++;
        if (!firstError) firstError = e.message;
        await sleep(10);
        continue;
      }
      const got = nowUs();
      if (!h) {
        // A wait the run's end cut short still counts toward the longest wait.
        s.longest = Math.max(s.longest, got - waitStart);
        break;
      }
      if (got >= end) {
        // Acquired after the end: the wait lasted up to the end, no more.
        s.longest = Math.max(s.longest, end - waitStart);
        await locks[w].release(h).catch(() => {});
        break;
      }
      if (holder !== null) overlaps++;
      holder = w;
      s.count++;
      s.waits.push(got - waitStart);
      s.longest = Math.max(s.longest, got - waitStart);
      if (lastReleaseSentUs !== null) {
        handoffs.push(got - lastReleaseSentUs);
        if (lastHolder === w) sameWorkerHandoffs++;
        else otherHandoffs.push(got - lastReleaseSentUs);
      }
      await sleep(opt['hold-ms']);
      holder = null;
      lastHolder = w;
      lastReleaseSentUs = nowUs();
      try {
        if (!(await locks[w].release(h))) {
          errors++;
          if (!firstError) firstError = 'release found the lock no longer ours';
        }
      } catch (e) {
        errors++;
        if (!firstError) firstError = e.message;
      }
    }
  }

  await Promise.all(stats.map((_, w) => worker(w)));
  await Promise.all(clients.map((c) => c.quit().catch(() => c.disconnect())));

  const total = stats.reduce((a, s) => a + s.count, 0);
  const mean = total / opt.workers;
  const result = {
    peer: PEER_NAME[opt.mode],
    workers: opt.workers,
    seconds: opt.seconds,
    hold_ms: opt['hold-ms'],
    retry: opt.mode === 'plain'
      ? { sleep_ms: opt['retry-ms'] }
      : { retryCount: redlockSettings.retryCount, retryDelay_ms: 200, retryJitter_ms: 100 },
    critical_sections: total,
    critical_sections_per_s: round(total / opt.seconds),
    handoffs: handoffs.length,
    handoff_p50_us: round(percentile(handoffs, 50)),
    handoff_p99_us: round(percentile(handoffs, 99)),
    handoff_to_other_p50_us: round(percentile(otherHandoffs, 50)),
    handoff_to_other_p99_us: round(percentile(otherHandoffs, 99)),
    same_worker_handoff_ratio: handoffs.length ? round(sameWorkerHandoffs / handoffs.length, 3) : null,
    max_share_deviation: total ? round(Math.max(...stats.map((s) => Math.abs(s.count - mean) / mean)), 3) : null,
    longest_wait_ms: round(Math.max(...stats.map((s) => s.longest)) / 1000),
    per_worker: stats.map((s, w) => ({
      worker: w,
      count: s.count,
      share: total ? round(s.count / total, 3) : 0,
      p99_wait_ms: s.waits.length ? round(percentile(s.waits, 99) / 1000) : null,
      longest_wait_ms: round(s.longest / 1000),
    })),
    overlaps,
    errors,
  };
  if (firstError) result.first_error = firstError;
  if (opt.json) {
    process.stdout.write(`${JSON.stringify(result)}\n`);
  } else {
    process.stdout.write(
      `${result.peer}: ${opt.workers} workers on one key, hold ${opt['hold-ms']} ms: ` +
        `${result.critical_sections_per_s} critical sections/s, handoff p50 ${result.handoff_p50_us} us ` +
        `p99 ${result.handoff_p99_us} us (to another worker p50 ${result.handoff_to_other_p50_us} ` +
        `p99 ${result.handoff_to_other_p99_us} us), back to the releaser ${result.same_worker_handoff_ratio}, ` +
        `longest wait ${result.longest_wait_ms} ms, overlaps ${overlaps}, errors ${errors}\n`);
    for (const p of result.per_worker) {
      process.stdout.write(`  worker ${p.worker}: ${p.count} (share ${p.share}), p99 wait ${p.p99_wait_ms} ms, longest ${p.longest_wait_ms} ms\n`);
    }
  }
}

main().catch((e) => {
  process.stderr.write(`contention: ${e.stack || e}\n`);
  process.exit(1);
});
