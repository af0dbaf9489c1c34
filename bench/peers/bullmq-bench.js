#!/usr/bin/env node
'use strict';
// The BullMQ peer of `jobguard bench --jobs`: M no-op jobs enqueued with
// addBulk, then one Worker per concurrency drains them; jobs/s from the
// worker's start to the M-th completion, and enqueue -> completion latency
// (each job carries its enqueue time, on the same monotonic clock as
// jobguard's, process.hrtime). One JSON object with a run per concurrency.
const { Queue, Worker } = require('bullmq');
const IORedis = require('ioredis');
const { parseArgs, nowUs, percentile, round } = require('./lib/util');

const USAGE = `usage: bullmq-bench.js --redis URL [--jobs M] [--concurrency 1,64] [--dedup] [--json]
  --redis URL        redis:// URL of the server to measure against (required)
  --jobs M           jobs per run (default 20000)
  --concurrency L    comma-separated Worker concurrencies, one run each (default 1,64)
  --dedup            every job added with a deduplication id of its own (BullMQ's
                     deduplicated jobs: the peer of jobguard's unique jobs)
  --json             one JSON object on stdout
`;

async function run(url, jobs, concurrency, dedup) {
  const name = `bench-${process.pid}-${concurrency}-${Date.now()}`;
  // BullMQ's workers need maxRetriesPerRequest: null on their connection.
  const connection = new IORedis(url, { maxRetriesPerRequest: null });
  const queue = new Queue(name, { connection });
  for (let done = 0; done < jobs;) {
    const batch = [];
    for (let i = 0; i < 1000 && done < jobs; ++i, ++done)
      batch.push({ name: 'noop', data: { id: done, t: nowUs() }, opts: dedup ? { deduplication: { id: `d${done}` } } : {} });
    await queue.addBulk(batch);
  }
  // The server's own CPU over the worker phase (INFO cpu, as `jobguard bench
  // --jobs` reads it): on a server-bound run, jobs/s follow its cost per job.
  const serverCpu = async () => {
    const info = await connection.info('cpu');
    const field = (k) => Number((info.match(new RegExp(`^${k}:([0-9.]+)`, 'm')) || [0, 'NaN'])[1]);
    return field('used_cpu_sys') + field('used_cpu_user');
  };
  const cpu0 = await serverCpu();
  const latencies = [];
  let finished = 0;
  let resolveAll;
  const all = new Promise((r) => { resolveAll = r; });
  const t0 = nowUs();
  const workerConnection = new IORedis(url, { maxRetriesPerRequest: null });
  const worker = new Worker(name, async () => undefined, {
    connection: workerConnection,
    concurrency,
    removeOnComplete: { count: 0 },
  });
  worker.on('completed', (job) => {
    latencies.push(nowUs() - job.data.t);
    if (++finished === jobs) resolveAll();
  });
  await all;
  const secs = (nowUs() - t0) / 1e6;
  const serverCpuS = (await serverCpu()) - cpu0;
  await worker.close();
  await queue.obliterate({ force: true });
  await queue.close();
  connection.disconnect();
  workerConnection.disconnect();  // a connection passed in is the caller's to close
  latencies.sort((a, b) => a - b);
  return {
    concurrency,
    jobs,
    seconds: round(secs, 3),
    jobs_per_s: round(jobs / secs, 1),
    enqueue_to_done_p50_ms: round(percentile(latencies, 50) / 1000, 2),
    enqueue_to_done_p99_ms: round(percentile(latencies, 99) / 1000, 2),
    server_cpu_s: round(serverCpuS, 3),
    server_us_per_job: round((serverCpuS * 1e6) / jobs, 2),
  };
}

async function main() {
  const opt = parseArgs(process.argv.slice(2), {
    redis: { type: 'string', required: true },
    jobs: { type: 'int', default: 20000, min: 1 },
    concurrency: { type: 'string', default: '1,64' },
    json: { type: 'bool', default: false },
    dedup: { type: 'bool', default: false },
  }, USAGE);
  const levels = opt.concurrency.split(',').map(Number);
  if (levels.some((c) => !Number.isInteger(c) || c < 1)) {
    process.stderr.write(`--concurrency: expected positive integers, got ${JSON.stringify(opt.concurrency)}\n`);
    process.exit(64);
  }
  const runs = [];
  for (const c of levels) runs.push(await run(opt.redis, opt.jobs, c, opt.dedup));
  const bullmq = require('bullmq/package.json').version;
  const out = { peer: 'bullmq', version: bullmq, jobs: opt.jobs, dedup: opt.dedup, runs, headline: runs[runs.length - 1] };
  if (opt.json) process.stdout.write(JSON.stringify(out) + '\n');
  else for (const r of runs)
    process.stdout.write(`bullmq ${bullmq} concurrency ${r.concurrency}: ${r.jobs_per_s} jobs/s, ` +
                         `enqueue->done p50 ${r.enqueue_to_done_p50_ms} ms p99 ${r.enqueue_to_done_p99_ms} ms, ` +
                         `server ${r.server_us_per_job} us/job\n`);
}

main().catch((e) => {
  process.stderr.write(`bullmq-bench.js: ${e && e.message ? e.message : e}\n`);
  process.exit(69);
});
