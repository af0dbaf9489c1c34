#!/usr/bin/env node
'use strict';
// The BullMQ peer of `jobguard bench --jobs`: M no-op jobs enqueued with
// addBulk, then one Worker per concurrency drains them; jobs/s from the
// worker's start to the M-th completion, and enqueue -> completion latency
// (each job carries its enqueue time, on the same monotonic clock as
// jobguard's, process.hrtime). One JSON object with a run per concurrency.
// With --rate, the peer of `jobguard bench --jobs M --rate`: BullMQ's rate
// limiter (the Worker's `limiter: { max, duration }`, one budget per queue)
// and its cost and pace, in the same JSON shape.
const { Queue, Worker } = require('bullmq');
const IORedis = require('ioredis');
const { parseArgs, usageError, nowUs, percentile, round } = require('./lib/util');

const USAGE = `usage: bullmq-bench.js --redis URL [--jobs M] [--concurrency 1,64] [--dedup | --rate N/PERIOD [--window S]] [--json]
  --redis URL        redis:// URL of the server to measure against (required)
  --jobs M           jobs per run (default 20000)
  --concurrency L    comma-separated Worker concurrencies, one run each (default 1,64)
  --dedup            every job added with a deduplication id of its own (BullMQ's
                     deduplicated jobs: the peer of jobguard's unique jobs)
  --rate N/PERIOD    the rate limiter instead (PERIOD: s, min, h, or e.g. 500ms, 2s):
                     M jobs unlimited and under max 1000000 a second at each
                     concurrency; then, at the last, a backlog under max N per
                     PERIOD for the whole periods in --window S (default 10):
                     starts/s and the most in one period
  --json             one JSON object on stdout
`;

// "N/PERIOD" -> { max, duration } in ms. BullMQ's open-source limiter has one
// budget per queue: a per-key limit (groups) is BullMQ Pro's.
function parseRate(text) {
  const m = /^([0-9]+)\/(s|sec|min|h|[0-9]+(?:ms|s|m|h))$/.exec(text);
  if (!m) {
    if (text.includes('=')) usageError(`--rate ${JSON.stringify(text)}: per-key limits (groups) are BullMQ Pro's, not in bullmq`);
    usageError(`--rate: expected N/PERIOD (PERIOD s, min, h, or e.g. 500ms, 2s), got ${JSON.stringify(text)}`);
  }
  const unit = { ms: 1, s: 1000, sec: 1000, m: 60000, min: 60000, h: 3600000 };
  const p = /^([0-9]*)([a-z]+)$/.exec(m[2]);
  const duration = (p[1] === '' ? 1 : Number(p[1])) * unit[p[2]];
  const max = Number(m[1]);
  if (max < 1 || duration < 1) usageError(`--rate ${JSON.stringify(text)}: the count and the period must be more than 0`);
  return { max, duration };
}

async function run(url, jobs, concurrency, { dedup = false, limiter, starts } = {}) {
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
  const client0 = process.cpuUsage();
  const latencies = [];
  let finished = 0;
  let resolveAll;
  const all = new Promise((r) => { resolveAll = r; });
  const t0 = nowUs();
  const workerConnection = new IORedis(url, { maxRetriesPerRequest: null });
  const processor = starts ? async () => { starts.push(nowUs()); } : async () => undefined;
  const worker = new Worker(name, processor, {
    connection: workerConnection,
    concurrency,
    removeOnComplete: { count: 0 },
    ...(limiter ? { limiter } : {}),
  });
  worker.on('completed', (job) => {
    latencies.push(nowUs() - job.data.t);
    if (++finished === jobs) resolveAll();
  });
  await all;
  const secs = (nowUs() - t0) / 1e6;
  const serverCpuS = (await serverCpu()) - cpu0;
  const client = process.cpuUsage(client0);
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
    server_cpu_pct: round((100 * serverCpuS) / secs, 2),
    client_us_per_job: round((client.user + client.system) / jobs, 2),
  };
}

// The most of the sorted times `t` in any half-open window of `w`.
function mostWithin(t, w) {
  let most = 0;
  for (let i = 0, j = 0; i < t.length; ++i) {
    while (t[i] - t[j] >= w) ++j;
    most = Math.max(most, i - j + 1);
  }
  return most;
}

// As jobguard's apps/jobguard/bench/rate.cpp: the starts' rate from the first to the last
// (k whole periods), the most in any one period and in any tenth of one.
function pace(starts, { max, duration }) {
  const t = Float64Array.from(starts).sort();
  const perUs = duration * 1000;
  const limitPerS = (max * 1e6) / perUs;
  const spanS = t.length > 1 ? (t[t.length - 1] - t[0]) / 1e6 : 0;
  const achieved = spanS > 0 ? (t.length - 1) / spanS : 0;
  const peak = mostWithin(t, perUs), tenth = mostWithin(t, Math.max(1, perUs / 10));
  return {
    limit_count: max, limit_period_ms: duration, limit_per_s: limitPerS, starts: t.length, span_s: spanS,
    achieved_per_s: achieved, achieved_over_limit: achieved / limitPerS,
    peak_in_period: peak, peak_over_limit: peak / max,
    peak_in_tenth_period: tenth, peak_tenth_over_limit: (tenth * 10) / max,
  };
}

// Two runs of one kind as one: jobs/s over both, CPU per job over both.
function sum(a, b) {
  const jobs = a.jobs + b.jobs, seconds = a.seconds + b.seconds, server = a.server_cpu_s + b.server_cpu_s;
  const client = a.client_us_per_job * a.jobs + b.client_us_per_job * b.jobs;
  return {
    concurrency: a.concurrency, jobs, seconds: round(seconds, 3), jobs_per_s: round(jobs / seconds, 1),
    server_cpu_s: round(server, 3), server_us_per_job: round((server * 1e6) / jobs, 2),
    server_cpu_pct: round((100 * server) / seconds, 2), client_us_per_job: round(client / jobs, 2),
  };
}

async function runRate(opt, levels, limit) {
  const periods = Math.max(1, Math.round((opt.window * 1000) / limit.duration));
  const paceJobs = limit.max * periods + 1;
  if (paceJobs > 10000000) usageError(`--rate: ${paceJobs} jobs over the window's ${periods} periods: more than 10,000,000`);
  const high = { max: 1000000, duration: 1000 };  // far above what a worker reaches
  const overhead = [];
  for (const c of levels) {
    // Unlimited, limited, then the other way round: a drift of the host's
    // load over the run weighs on each alike.
    const runs = [];
    for (const limited of [false, true, true, false])
      runs.push(await run(opt.redis, opt.jobs, c, limited ? { limiter: high } : {}));
    const [unlimited, limited] = [sum(runs[0], runs[3]), sum(runs[1], runs[2])];
    overhead.push({
      concurrency: c, unlimited, limited,
      limited_over_unlimited: limited.jobs_per_s / unlimited.jobs_per_s,
      limited_server_us_over_unlimited: limited.server_cpu_s / unlimited.server_cpu_s,
    });
  }
  const starts = [];
  const c = levels[levels.length - 1];
  const r = await run(opt.redis, paceJobs, c, { limiter: limit, starts });
  return { jobs: opt.jobs, overhead, accuracy: { ...pace(starts, limit), concurrency: c, run: r } };
}

function rateText(out) {
  let text = `bullmq ${out.version} --jobs ${out.jobs} --rate ${out.rate}: Worker limiter, no-op processor\n`;
  for (const o of out.overhead)
    text += `  concurrency ${o.concurrency}: unlimited ${o.unlimited.jobs_per_s} jobs/s, max 1000000/s ` +
            `${o.limited.jobs_per_s} (${o.limited_over_unlimited.toFixed(3)}x)\n`;
  const a = out.accuracy;
  return text + `  pace, ${a.limit_count}/${a.limit_period_ms} ms at concurrency ${a.concurrency}: ${a.starts} starts at ` +
         `${a.achieved_per_s.toFixed(1)}/s (${a.achieved_over_limit.toFixed(3)}x the limit); most in one period ` +
         `${a.peak_in_period} (${a.peak_over_limit.toFixed(3)}x), in a tenth ${a.peak_in_tenth_period} ` +
         `(${a.peak_tenth_over_limit.toFixed(2)}x); server CPU ${a.run.server_cpu_pct}% of a core\n`;
}

async function main() {
  const opt = parseArgs(process.argv.slice(2), {
    redis: { type: 'string', required: true },
    jobs: { type: 'int', default: 20000, min: 1 },
    concurrency: { type: 'string', default: '1,64' },
    json: { type: 'bool', default: false },
    dedup: { type: 'bool', default: false },
    rate: { type: 'string' },
    window: { type: 'number', default: 10 },
  }, USAGE);
  const levels = opt.concurrency.split(',').map(Number);
  if (levels.some((c) => !Number.isInteger(c) || c < 1)) {
    process.stderr.write(`--concurrency: expected positive integers, got ${JSON.stringify(opt.concurrency)}\n`);
    process.exit(64);
  }
  const bullmq = require('bullmq/package.json').version;
  if (opt.rate !== undefined) {
    if (opt.dedup) usageError('--rate and --dedup are separate runs: pick one');
    const out = { peer: 'bullmq', version: bullmq, rate: opt.rate, ...(await runRate(opt, levels, parseRate(opt.rate))) };
    if (opt.json) process.stdout.write(JSON.stringify(out) + '\n');
    else process.stdout.write(rateText(out));
    return;
  }
  const runs = [];
  for (const c of levels) runs.push(await run(opt.redis, opt.jobs, c, { dedup: opt.dedup }));
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
