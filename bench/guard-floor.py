#!/usr/bin/env python3
"""bench/guard-floor.py MODE N TAG: writes, as RESP for `redis-cli --pipe`,
N jobs' Redis commands with no client in between (bench/guard-floor.sh).

MODE
  enqueue  XGROUP CREATE, then N x XADD with ids 1-0..N-0 (so the acks below
           name them without reading a reply)
  stream   the bare ceiling's commands: XREADGROUP COUNT 64 per 64 jobs, an
           XACK a job (what `jobguard bench --jobs` runs as "bare")
  class    stream + the moderate class's own writes and read, as plain
           commands: SET lock NX PX, EXISTS record key, SET key PX, SET record
           PX, DEL lock. No script, no check between them: less than any
           correct implementation can do, so what it costs the server is a
           floor under the guarded job's cost
  two      stream + SET lock NX PX and one SET XX PX over it: the fewest writes
           a lock that leaves a record could make
Keys, values and TTLs have the shape and length of the ones jobguard writes.
"""
import sys

mode, n, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
out = sys.stdout.buffer
buf = []


def cmd(*args):
    buf.append(b'*%d\r\n' % len(args))
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        buf.append(b'$%d\r\n%s\r\n' % (len(a), a))
    if len(buf) > 4096:
        out.write(b''.join(buf))
        buf.clear()


stream = 'bench:floor:%s:jobs' % tag
if mode == 'enqueue':
    cmd('XGROUP', 'CREATE', stream, 'g', '0', 'MKSTREAM')
    for i in range(1, n + 1):
        cmd('XADD', stream, '%d-0' % i, 'id', 'bench-job:%d' % i, 'enq', '1796392745719123456')
elif mode in ('stream', 'class', 'two'):
    token = '9f03f2e8.1796392576.818654:%d'
    for first in range(1, n + 1, 64):
        cmd('XREADGROUP', 'GROUP', 'g', 'c', 'COUNT', 64, 'STREAMS', stream, '>')
        for i in range(first, min(n, first + 63) + 1):
            lock = 'bench:%s:lock:{bench-job:bench-job%%3A%d:g64}' % (tag, i)
            if mode == 'class':
                done = 'bench:%s:done:bench-job:bench-job%%3A%d:g64' % (tag, i)
                idem = 'bench:%s:idem:bench-job/bench-job:%d/g64' % (tag, i)
                cmd('SET', lock, token % i, 'NX', 'PX', 600000)
                cmd('EXISTS', done, idem)
                cmd('SET', idem, 'i1 completed 1796392745719 1796392775719 1796392745720\ng64\nvm/8874/5b6a38288f32f4e3\n',
                    'PX', 600000)
                cmd('SET', done, 'r1 1796392745717\nvm/8874\n', 'PX', 600000)
                cmd('DEL', lock)
            elif mode == 'two':
                cmd('SET', lock, token % i, 'NX', 'PX', 600000)
                cmd('SET', lock, 'r1 1796392745717\nvm/8874\n', 'XX', 'PX', 600000)
            cmd('XACK', stream, 'g', '%d-0' % i)
else:
    sys.exit('guard-floor.py: MODE is enqueue, stream, class or two, not %r' % mode)
out.write(b''.join(buf))
