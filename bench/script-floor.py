#!/usr/bin/env python3
"""Server CPU per operation of the lock scripts, measured on the server alone.

    bench/script-floor.py --port P [--pairs N] [--batch B] [WORKLOAD ...]

Pipes N operations (each workload's commands, pipelined by redis-cli --pipe so
the server, not a client, is the limit) into a redis-server and divides the
server's used_cpu_user+used_cpu_sys delta by N. Workloads:
  min0    EVALSHA of `return 1`, no keys, no arguments (a script's fixed cost)
  min6    the same with six keys and nine arguments (rw_acquire.lua's shape)
  mutex   a mutex pair: SET NX PX, then release.lua (the CLI bench's mutex)
  read    --batch B read acquires (a 10 s wait, so each names its place in
          the line) in one rw_acquire.lua call, then their B releases in one
          rw_release.lua call, as a LockService coalesces one loop turn's
          calls; --batch 1 is a read pair of one call each
Prints one JSON object per workload: us of server CPU per pair.
"""
import argparse, json, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src")
SCRIPTS = os.path.join(SRC, "lock", "scripts")  # --scripts overrides


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], check=True, capture_output=True, text=True).stdout


def cpu(port):
    info = dict(l.split(":", 1) for l in cli(port, "INFO", "cpu").splitlines() if ":" in l)
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def embedded(path):
    # A script as the build embeds it: each `--#include <path under src/>`
    # line replaced by that file (cmake/EmbedFiles.cmake).
    out = []
    for line in open(path).read().splitlines(True):
        inc = line.strip()
        out.append(embedded(os.path.join(SRC, inc[len("--#include "):].strip())) if inc.startswith("--#include ") else line)
    return "".join(out)


def load(port, name=None, body=None):
    body = body if body is not None else embedded(os.path.join(SCRIPTS, name))
    return cli(port, "SCRIPT", "LOAD", body).strip()


RW_KEYS = ["jg:rw:{b}:r", "jg:rw:{b}:w", "jg:fence:{b}", "jg:rw:{b}:line", "jg:rw:{b}:lexp", "jg:rw:{b}:wline"]


def token(i, reader=False):
    # The library's tokens (make_token): host/pid/job#128 random bits in hex;
    # a reader's carries 128 more (src/lock/waiter_shell.cpp), which keeps the
    # readers' zset a skiplist.
    t = "bench-host/12345/#%032x" % i
    return t + "%032x" % i if reader else t


def workload(port, name, pairs, batch):
    cmds = []
    if name in ("min0", "min6"):
        sha = load(port, body="return 1")
        for i in range(pairs):
            if name == "min0":
                cmds.append(resp("EVALSHA", sha, 0))
            else:
                cmds.append(resp("EVALSHA", sha, 6, *RW_KEYS, "tok%d" % i, 30000, 0, "r", 1, 2000, "", "", "tok%d" % i))
    elif name == "mutex":
        sha = load(port, "release.lua")
        for i in range(pairs):
            cmds.append(resp("SET", "jg:lock:m", token(i), "NX", "PX", 30000))
            cmds.append(resp("EVALSHA", sha, 2, "jg:lock:m", "jg:waiters:m", token(i), "jg:ch:m"))
    elif name == "read":
        acq, rel = load(port, "rw_acquire.lua"), load(port, "rw_release.lua")
        per = batch
        for i in range(0, pairs, per):
            toks = [token(i + j, True) for j in range(per)]
            cmds.append(acquire_call(acq, toks))
            cmds.append(release_call(rel, toks))
    else:
        sys.exit("script-floor.py: unknown workload " + name)
    data = b"".join(cmds)
    before = cpu(port)
    subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=data, check=True, capture_output=True)
    after = cpu(port)
    cli(port, "FLUSHALL")
    return (after - before) * 1e6 / pairs


def acquire_call(sha, toks):
    # rw_acquire.lua: ARGV 1 mode, 2 evicted count ('' = not checked), 3 the
    # checked epoch ('' = not compared), then per attempt: token, ttl, fence,
    # join, waiter lease, waiter id.
    args = ["r", "", ""]
    for t in toks:
        args += [t, 30000, 0, 1, 2000, t]
    return resp("EVALSHA", sha, 6, *RW_KEYS, *args)


def release_call(sha, toks):
    # rw_release.lua: KEYS the holders' (the readers'), then the six keys but
    # the fence counter; ARGV 1 channel, 2 cluster, then the tokens.
    return resp("EVALSHA", sha, 6, RW_KEYS[0], *RW_KEYS[:2], *RW_KEYS[3:], "jg:rw:{b}:ch", "0", *toks)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pairs", type=int, default=60000)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("workloads", nargs="*", default=["min0", "min6", "mutex", "read"])
    p.add_argument("--scripts", help="the lock scripts' folder (default: this tree's)")
    a = p.parse_args()
    if a.scripts:
        global SCRIPTS
        SCRIPTS = a.scripts
    for w in a.workloads:
        us = workload(a.port, w, a.pairs, a.batch if w == "read" else 1)
        print(json.dumps({"workload": w, "batch": a.batch if w == "read" else 1, "pairs": a.pairs,
                          "server_cpu_us_per_pair": round(us, 2)}))


if __name__ == "__main__":
    main()
