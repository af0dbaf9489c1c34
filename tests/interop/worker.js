#!/usr/bin/env node
'use strict';
// One Node.js worker of the interop test: takes jobguard:lock:{R} with the
// plain ioredis pattern or node-redlock, appends "enter" and "exit" lines to
// the shared log while holding it, and releases. check-log.js then proves no
// two holders overlapped, whatever mix of Node workers and `jobguard run`.
// --mode none takes no lock at all: it exists to show the check catches overlap.
const fs = require('node:fs');
const path = require('node:path');
const peers = path.join(__dirname, '..', '..', 'bench', 'peers', 'lib');
const { lockKey, connect, makeLock } = require(path.join(peers, 'locks'));
const { parseArgs, sleep } = require(path.join(peers, 'util'));

const USAGE = `usage: worker.js --redis URL --resource R --mode plain|redlock|none --id ID --log FILE [options]
  --iterations N   critical sections to complete (default 20)
  --hold-ms H      time inside, between the enter and exit lines (default 5)
  --retry-ms R     pause between attempts while the lock is busy (default 3)
  --ttl-ms T       lock TTL (default 5000, as jobguard run --ttl 5s)
  --deadline-s D   give up (exit 1) when not done by then (default 60)
`;

function wallNs() {
  return BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e3)) * 1000n;
}

async function main() {
  const opt = parseArgs(process.argv.slice(2), {
    redis: { type: 'string', required: true },
    resource: { type: 'string', required: true },
    mode: { type: 'string', required: true, choices: ['plain', 'redlock', 'none'] },
    id: { type: 'string', required: true },
    log: { type: 'string', required: true },
    iterations: { type: 'int', default: 20, min: 1 },
    'hold-ms': { type: 'number', default: 5 },
    'retry-ms': { type: 'number', default: 3 },
    'ttl-ms': { type: 'int', default: 5000, min: 1 },
    'deadline-s': { type: 'number', default: 60 },
  }, USAGE);
  if (/\s/.test(opt.id)) {
    process.stderr.write(`--id must not contain whitespace, got ${JSON.stringify(opt.id)}\n`);
    process.exit(64);
  }

  const key = lockKey(opt.resource);
  const client = connect(opt.redis);
  const deadline = Date.now() + opt['deadline-s'] * 1000;
  // The loop checks the deadline between attempts, but one attempt against an
  // unreachable server can take several reconnect rounds: this bounds the whole.
  setTimeout(() => {
    process.stderr.write(`worker: ${opt.id}: not done after ${opt['deadline-s']} s, giving up\n`);
    process.exit(1);
  }, opt['deadline-s'] * 1000).unref();
  // node-redlock waits in its own retry loop; its 200 ms default delay would
  // only make the test slow, not different in kind. Its retry count is sized to
  // the deadline so an unreachable Redis ends the worker instead of hanging it.
  const lock = opt.mode === 'none' ? null : makeLock(opt.mode, client, {
    retryCount: Math.ceil((opt['deadline-s'] * 1000) / Math.max(1, opt['retry-ms'])),
    retryDelay: opt['retry-ms'],
    retryJitter: Math.max(1, Math.floor(opt['retry-ms'] / 2)),
  });

  for (let i = 0; i < opt.iterations; i++) {
    let handle = null;
    if (lock) {
      while (!handle) {
        if (Date.now() > deadline) throw new Error(`${opt.id}: not done after ${opt['deadline-s']} s (iteration ${i + 1}/${opt.iterations})`);
        handle = await lock.tryAcquire(key, opt['ttl-ms']);
        if (!handle) await sleep(opt['retry-ms']);
      }
    }
    fs.appendFileSync(opt.log, `enter ${opt.id} ${wallNs()} key=${key}\n`);
    // While we hold it the stored value must be exactly our token: a holder
    // from another implementation that overwrote or deleted it would show here.
    const stored = handle ? await client.get(key) : null;
    await sleep(opt['hold-ms']);
    const verdict = !handle ? 'unlocked' : stored === handle.token ? 'ok' : `mismatch:${JSON.stringify(stored)}`;
    fs.appendFileSync(opt.log, `exit ${opt.id} ${wallNs()} holder=${verdict}\n`);
    if (handle && !(await lock.release(handle))) {
      throw new Error(`${opt.id}: release found the lock no longer ours (iteration ${i + 1})`);
    }
  }
  await client.quit().catch(() => client.disconnect());
}

main().catch((e) => {
  process.stderr.write(`worker: ${e.message || e}\n`);
  process.exit(1);
});
