#!/usr/bin/env node
'use strict';
// Turns the JSON lines of `run.sh --json` (stdin or a file) into the Markdown
// tables docs/peers.md quotes, so the doc shows exactly what one run printed.
const fs = require('node:fs');

const text = fs.readFileSync(process.argv[2] || 0, 'utf8');
const rows = text.split('\n').filter((l) => l.trim().startsWith('{')).map((l) => JSON.parse(l));
const bench = rows.filter((r) => 'ops_per_s' in r);
const cont = rows.filter((r) => 'critical_sections' in r);
const out = [];
if (bench.length) {
  out.push('| peer | workers | acquire+release/s | p50 µs | p99 µs | errors |', '|---|---:|---:|---:|---:|---:|');
  for (const r of bench) out.push(`| ${r.peer} | ${r.workers} | ${r.ops_per_s} | ${r.p50_us} | ${r.p99_us} | ${r.errors} |`);
  out.push('');
}
if (cont.length) {
  out.push('| peer | critical sections/s | handoff p50/p99 µs | to another worker p50/p99 µs | back to releaser | max share deviation | longest wait ms | overlaps |',
    '|---|---:|---:|---:|---:|---:|---:|---:|');
  for (const r of cont) {
    out.push(`| ${r.peer} | ${r.critical_sections_per_s} | ${r.handoff_p50_us} / ${r.handoff_p99_us} | ` +
      `${r.handoff_to_other_p50_us} / ${r.handoff_to_other_p99_us} | ${Math.round(r.same_worker_handoff_ratio * 1000) / 10}% | ` +
      `${Math.round(r.max_share_deviation * 100)}% | ${r.longest_wait_ms} | ${r.overlaps} |`);
  }
  out.push('');
  out.push(`| worker | ${cont.map((r) => `${r.peer} share · p99 wait · longest wait (ms)`).join(' | ')} |`,
    `|---:|${cont.map(() => '---:').join('|')}|`);
  for (let w = 0; w < cont[0].per_worker.length; w++) {
    out.push(`| ${w} | ${cont.map((r) => {
      const p = r.per_worker[w];
      return p ? `${(p.share * 100).toFixed(1)}% · ${p.p99_wait_ms ?? '–'} · ${p.longest_wait_ms}` : '';
    }).join(' | ')} |`);
  }
}
process.stdout.write(`${out.join('\n')}\n`);
