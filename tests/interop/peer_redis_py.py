#!/usr/bin/python3
"""A Python worker that shares jobguard's locks through redis-py's own
redis.lock.Lock (Debian python3-redis), named with jobguard's key for the
resource: jobguard:lock:{R}. Driven by tests/cli/run/interop_peers_test.cpp.

  peer_redis_py.py --host H --port P loop --resource R --id ID --log FILE
                   [--iterations N] [--hold-ms H] [--ttl-ms T] [--deadline-s D]
      N critical sections: acquire (blocking), append "enter ID key=K", check
      that the key holds this lock's token, append "exit ID holder=ok|...",
      release. Exit 0 when all are done, 1 otherwise.
  peer_redis_py.py --host H --port P serve
      One request per line on stdin, one answer line on stdout; EOF ends it.
      key R                  -> key K         (the name this peer uses for R)
      acquire R TTL_MS WAIT_MS -> ok TOKEN | busy
      release                -> released | not-owned   (the lock acquire took)
      extend MS              -> extended | not-owned   (adds MS to its TTL)
      reacquire              -> reacquired | not-owned (TTL back to TTL_MS)
      release-as R TOKEN     -> released | not-owned   (a Lock told TOKEN)
      extend-as R TOKEN MS   -> extended | not-owned
      Anything else, or a Redis error: "error <text>".
Exit status: 0 ok; 1 a worker failed; 64 usage; 69 redis-py not importable.
"""
import argparse
import os
import sys
import time

try:
    import redis
    from redis.exceptions import LockError, LockNotOwnedError
except ImportError as e:  # Debian: python3-redis, for /usr/bin/python3
    print(f"peer_redis_py: cannot import redis-py ({e}); install Debian's python3-redis", file=sys.stderr)
    sys.exit(69)

PREFIX = "jobguard:lock"


def lock_key(resource):
    # jobguard's KeyBuilder: <prefix>:lock:{<resource>}; the braces are the
    # Cluster hash tag that keeps the lock in its resource's slot.
    return f"{PREFIX}:{{{resource}}}"


def connect(args):
    # Deadlines on connect and on every reply: a stalled server fails the
    # peer instead of hanging it.
    return redis.Redis(host=args.host, port=args.port, db=0, socket_timeout=5, socket_connect_timeout=5)


def make_lock(r, resource, ttl_ms, sleep_s=0.005):
    # thread_local=False: the token is this object's, not a thread's (the
    # serve loop and release-as hand tokens around explicitly).
    return r.lock(lock_key(resource), timeout=ttl_ms / 1000.0, sleep=sleep_s, thread_local=False)


def loop(args):
    r = connect(args)
    key = lock_key(args.resource)
    deadline = time.monotonic() + args.deadline_s
    for i in range(args.iterations):
        left = deadline - time.monotonic()
        lock = make_lock(r, args.resource, args.ttl_ms)
        if left <= 0 or not lock.acquire(blocking=True, blocking_timeout=left):
            print(f"peer_redis_py: {args.id}: not done after {args.deadline_s} s (iteration {i + 1})", file=sys.stderr)
            return 1
        token = lock.local.token.decode()
        append(args.log, f"enter {args.id} key={key}")
        stored = r.get(key)
        time.sleep(args.hold_ms / 1000.0)
        verdict = "ok" if stored is not None and stored.decode() == token else f"mismatch:{stored!r}"
        append(args.log, f"exit {args.id} holder={verdict}")
        try:
            lock.release()
        except LockNotOwnedError:
            print(f"peer_redis_py: {args.id}: release found the lock no longer ours (iteration {i + 1})", file=sys.stderr)
            return 1
    return 0


def append(path, line):
    # One write with O_APPEND: lines of every process stay whole and in the
    # order they were written.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def serve(args):
    r = connect(args)
    held = None
    for raw in sys.stdin:
        words = raw.split()
        try:
            answer = handle(r, words, held)
            if isinstance(answer, tuple):
                answer, held = answer
        except (redis.RedisError, LockError, ValueError, IndexError) as e:
            answer = f"error {type(e).__name__}: {e}".replace("\n", " ")
        print(answer, flush=True)
    return 0


def foreign(r, resource, token, ttl_ms=None):
    lock = make_lock(r, resource, ttl_ms or 1000)
    lock.local.token = token.encode()
    return lock


def handle(r, words, held):
    cmd = words[0] if words else ""
    if cmd == "key" and len(words) == 2:
        return f"key {make_lock(r, words[1], 1000).name}"
    if cmd == "acquire" and len(words) == 4:
        lock = make_lock(r, words[1], int(words[2]))
        wait_s = int(words[3]) / 1000.0
        if lock.acquire(blocking=wait_s > 0, blocking_timeout=wait_s if wait_s > 0 else None):
            return f"ok {lock.local.token.decode()}", lock
        return "busy", held
    if cmd == "release" and held is not None:
        try:
            held.release()
            return "released", None
        except LockNotOwnedError:
            return "not-owned", None
    if cmd == "extend" and held is not None and len(words) == 2:
        try:
            held.extend(int(words[1]) / 1000.0)
            return "extended"
        except LockNotOwnedError:
            return "not-owned"
    if cmd == "reacquire" and held is not None:
        try:
            held.reacquire()
            return "reacquired"
        except LockNotOwnedError:
            return "not-owned"
    if cmd == "release-as" and len(words) == 3:
        try:
            foreign(r, words[1], words[2]).release()
            return "released"
        except LockNotOwnedError:
            return "not-owned"
    if cmd == "extend-as" and len(words) == 4:
        try:
            foreign(r, words[1], words[2]).extend(int(words[3]) / 1000.0)
            return "extended"
        except LockNotOwnedError:
            return "not-owned"
    return f"error unknown request {' '.join(words)!r}"


def main():
    p = argparse.ArgumentParser(description="redis-py lock peer of jobguard")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    sub = p.add_subparsers(dest="mode", required=True)
    lp = sub.add_parser("loop")
    lp.add_argument("--resource", required=True)
    lp.add_argument("--id", required=True)
    lp.add_argument("--log", required=True)
    lp.add_argument("--iterations", type=int, default=10)
    lp.add_argument("--hold-ms", type=float, default=5)
    lp.add_argument("--ttl-ms", type=int, default=5000)
    lp.add_argument("--deadline-s", type=float, default=60)
    sub.add_parser("serve")
    try:
        args = p.parse_args()
    except SystemExit as e:
        sys.exit(64 if e.code else 0)
    if args.mode == "loop":
        if any(c.isspace() for c in args.id) or args.iterations < 1:
            print("peer_redis_py: --id must have no whitespace and --iterations must be >= 1", file=sys.stderr)
            sys.exit(64)
        sys.exit(loop(args))
    sys.exit(serve(args))


if __name__ == "__main__":
    main()
