#!/usr/bin/env node
'use strict';
// Reads the interop log (lines appended with O_APPEND, so file order is the
// order the writes happened) and proves mutual exclusion: every "enter ID" is
// followed by "exit ID" of the same ID before any other enter. Also checks that
// each holder saw its own token in the key, that jobguard exported the agreed
// key name, and that every kind of worker (the ID prefix before '-') got in.
//   check-log.js --log FILE --key KEY --kinds plain,redlock,jg [--pairs N]
// Exit 0 when all hold; 1 with one line per violation otherwise.
const fs = require('node:fs');
const path = require('node:path');
const { parseArgs } = require(path.join(__dirname, '..', '..', 'bench', 'peers', 'lib', 'util'));

function check(text, { key, kinds, pairs }) {
  const problems = [];
  const seen = new Map();
  let holder = null;  // { id, line }
  let count = 0;
  const lines = text.split('\n');
  lines.forEach((raw, i) => {
    if (raw === '') return;
    const n = i + 1;
    const [ev, id, , ...rest] = raw.split(' ');
    const attrs = Object.fromEntries(rest.map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]));
    if (ev === 'enter') {
      if (holder) problems.push(`line ${n}: ${id} entered while ${holder.id} (line ${holder.line}) was inside: overlap`);
      holder = { id, line: n };
      if (attrs.key !== key) problems.push(`line ${n}: ${id} used key ${JSON.stringify(attrs.key)}, expected ${JSON.stringify(key)}`);
      const kind = id.split('-')[0];
      seen.set(kind, (seen.get(kind) || 0) + 1);
      count++;
    } else if (ev === 'exit') {
      if (!holder || holder.id !== id) {
        problems.push(`line ${n}: exit of ${id} but the holder was ${holder ? `${holder.id} (line ${holder.line})` : 'nobody'}`);
      }
      holder = null;
      if (attrs.holder !== 'ok') problems.push(`line ${n}: ${id} did not find its own token in the key while inside (${attrs.holder})`);
    } else {
      problems.push(`line ${n}: unreadable line ${JSON.stringify(raw)}`);
    }
  });
  if (holder) problems.push(`end of log: ${holder.id} (line ${holder.line}) entered and never exited`);
  for (const kind of kinds) {
    if (!seen.get(kind)) problems.push(`no worker of kind ${kind} ever got the lock`);
  }
  if (pairs !== undefined && count !== pairs) problems.push(`expected ${pairs} critical sections, the log has ${count}`);
  return { problems, count, seen };
}

function main() {
  const opt = parseArgs(process.argv.slice(2), {
    log: { type: 'string', required: true },
    key: { type: 'string', required: true },
    kinds: { type: 'string', default: '' },
    pairs: { type: 'int', default: undefined },
  }, 'usage: check-log.js --log FILE --key KEY [--kinds a,b,c] [--pairs N]\n');
  let text;
  try {
    text = fs.readFileSync(opt.log, 'utf8');
  } catch (e) {
    process.stderr.write(`check-log: cannot read ${opt.log}: ${e.message}\n`);
    process.exit(1);
  }
  const kinds = opt.kinds ? opt.kinds.split(',') : [];
  const { problems, count, seen } = check(text, { key: opt.key, kinds, pairs: opt.pairs });
  const summary = [...seen].map(([k, v]) => `${k}=${v}`).join(' ');
  if (problems.length) {
    for (const p of problems.slice(0, 20)) process.stderr.write(`check-log: ${p}\n`);
    if (problems.length > 20) process.stderr.write(`check-log: ... ${problems.length - 20} more\n`);
    process.stdout.write(`FAIL: ${problems.length} problem(s) in ${count} critical sections (${summary})\n`);
    process.exit(1);
  }
  process.stdout.write(`ok: ${count} critical sections, no overlap (${summary})\n`);
}

if (require.main === module) main();
module.exports = { check };
