#!/usr/bin/env python3
# bench/batch-scripts-driver.py ROOT PORT ROUNDS
# The batched claim and finish scripts alone, without the worker or the
# stream: ROUNDS batches of 16 fresh units, each claimed by one claim_many
# call and finished by one finish_many call, with the arguments the runner
# sends (a moderate class, the key's write deferred), on the server at PORT.
# Composed from ROOT's .lua files as src/job/fused.cpp composes them. Meant to
# run against a server under callgrind, to count what the scripts cost in
# instructions (docs/bench.md, *Figures behind design choices*):
#   valgrind --tool=callgrind --callgrind-out-file=cg.out redis-server --port P --save '' &
#   PYTHONHASHSEED=0 python3 bench/batch-scripts-driver.py . P 250; redis-cli -p P shutdown nosave
# then (instructions with 250 rounds - with 0 rounds) / 4000 is per job.
# Set NOASSERT=1 to run script variants whose replies differ.
import socket, sys, hashlib, os
NOA = os.environ.get("NOASSERT")
root, port, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# A script as the build embeds it: each `--#include <path under src/>` line
# replaced by that file (cmake/EmbedFiles.cmake).
def rd(p):
    out = []
    for line in open(root + '/' + p).read().splitlines(True):
        inc = line.strip()
        out.append(rd('src/' + inc[len('--#include '):].strip()) if inc.startswith('--#include ') else line)
    return ''.join(out)
def fn(name, body): return "local function %s(KEYS, ARGV)\n%s\nend\n" % (name, body)
stored = rd('src/guard/scripts/stored.lua')
# The lock's named forms, as src/lock/composed.cpp adds them.
grant_once = ("local function grant_once(lock, fence_counter, record, token, ttl_ms, fence, evicted, epoch)\n"
              "  return acquire({lock, fence_counter, lock, lock, lock, record},\n"
              "                 {token, ttl_ms, fence, '0', '0', '0', '', evicted, '', '', '0', epoch})\nend\n")
release_held = ("local function release_held(lock, waiters, token, channel, sharded)\n"
                "  return release({lock, waiters}, {token, channel, '', sharded})\nend\n")
claim_parts = stored + fn('acquire', rd('src/lock/scripts/acquire.lua')) + grant_once + fn('idem_begin', rd('src/guard/scripts/idempotency_begin.lua'))
finish_parts = stored + fn('idem_complete', rd('src/guard/scripts/idempotency_complete.lua')) + fn('record', rd('src/guard/scripts/completion_record.lua')) + fn('release', rd('src/lock/scripts/release.lua')) + release_held
claim_many = claim_parts + fn('claim_one', rd('src/job/scripts/claim.lua')) + fn('batch_layout', rd('src/job/scripts/batch_layout.lua')) + rd('src/job/scripts/claim_many.lua')
finish_many = finish_parts + fn('finish_one', rd('src/job/scripts/finish.lua')) + fn('batch_layout', rd('src/job/scripts/batch_layout.lua')) + rd('src/job/scripts/finish_many.lua')
s = socket.create_connection(('127.0.0.1', port))
f = s.makefile('rb')
def enc(*a):
    out = [b'*%d\r\n' % len(a)]
    for x in a:
        x = x if isinstance(x, bytes) else str(x).encode()
        out.append(b'$%d\r\n%s\r\n' % (len(x), x))
    return b''.join(out)
def read():
    l = f.readline()
    t = l[:1]
    if t == b'$':
        n = int(l[1:]); 
        if n < 0: return None
        d = f.read(n + 2); return d[:-2]
    if t == b'*':
        n = int(l[1:]); return [read() for _ in range(max(n, 0))]
    if t == b'-': raise SystemExit('error: ' + l.decode())
    return l[1:].strip()
def call(*a):
    s.sendall(enc(*a)); return read()
csha = call('SCRIPT', 'LOAD', claim_many).decode()
fsha = call('SCRIPT', 'LOAD', finish_many).decode()
B = 16
def layout(calls, nk):
    n, na = len(calls), len(calls[0])
    mask = ''.join('s' if all(c[j] == calls[0][j] for c in calls) else 'p' for j in range(na))
    out = [n, nk, na, mask] + [calls[0][j] for j in range(na) if mask[j] == 's']
    for c in calls: out += [c[j] for j in range(na) if mask[j] == 'p']
    return out
p = 'bench:x:'
# The lock-state record as a check left it: the claims compare its id.
call('HSET', 'jobguard:epoch', 'id', 'bench-epoch')
for r in range(rounds):
    units = ['u%d_%d' % (r, i) for i in range(B)]
    keys, calls = [], []
    for u in units:
        keys += [p + 'lock:{%s}' % u, p + 'fence:{%s}' % u, 'jobguard:epoch', p + 'done:' + u, p + 'idem:' + u]
        calls.append(['tok-' + u, '30000', '0', '', 'bench-epoch', 'fp-' + u, 'owner-tok-' + u, '30000', '600000', 'defer'])
    rep = call('EVALSHA', csha, len(keys), *keys, *layout(calls, 5))
    if not NOA: assert rep[0][0] == b'1' or rep[0][0] == 1, rep[0]
    keys, calls = [], []
    for u in units:
        keys += [p + 'done:' + u, p + 'lock:{%s}' % u, p + 'waiters:{%s}' % u, p + 'idem:' + u]
        calls.append(['tok-' + u, p + 'released:{%s}' % u, 'worker-1', '', '600000', 'owner-tok-' + u, '600000', '', 'deferred', 'fp-' + u, str(5 + (hash(u) % 12)), '30000'])
    rep = call('EVALSHA', fsha, len(keys), *keys, *layout(calls, 4))
    if not NOA: assert rep[0] == [1, 1, 1] or rep[0] == [b'1', b'1', b'1'], rep[0]
print('ok', rounds * B)
