#!/usr/bin/env python3
"""The ratios of bench/compare.sh --jobs M --rate N/PERIOD, one JSON object.

Arguments: for each round, the 1-minute load average before it, then the
JSON of `jobguard bench --jobs M --rate` and of `bullmq-bench.js --rate`.
Every ratio is taken within its round (both sides measured back to back
against the same server), then the median and the range over the rounds.
"""
import json
import statistics
import sys


def round_ratios(jg, bull):
    r = {}
    for g, b in zip(jg["overhead"], bull["overhead"]):
        c = g["concurrency"]
        r[f"concurrency_{c}"] = {
            # The limiter's own cost on each side: jobs/s under a limit no
            # worker reaches over jobs/s with none, in the same round.
            "jobguard_limited_over_unlimited": g["limited_over_unlimited"],
            "bullmq_limited_over_unlimited": b["limited_over_unlimited"],
            "jobguard_per_key_over_unlimited": g["per_key_over_unlimited"],
            # The same as the server's CPU per job, limited over unlimited:
            # steadier than jobs/s where the host's load moves the client.
            "jobguard_limited_server_us_over_unlimited": g["limited_server_us_over_unlimited"],
            "bullmq_limited_server_us_over_unlimited": b["limited_server_us_over_unlimited"],
            "jobguard_per_key_server_us_over_unlimited": g["per_key_server_us_over_unlimited"],
            "guarded_limited_vs_bullmq_limited": g["limited"]["jobs_per_s"] / b["limited"]["jobs_per_s"],
            "guarded_vs_bullmq_unlimited": g["unlimited"]["jobs_per_s"] / b["unlimited"]["jobs_per_s"],
        }
    ga, ba = jg["accuracy"], bull["accuracy"]
    r["pace"] = {
        "jobguard_achieved_over_limit": ga["achieved_over_limit"],
        "bullmq_achieved_over_limit": ba["achieved_over_limit"],
        "jobguard_peak_over_limit": ga["peak_over_limit"],
        "bullmq_peak_over_limit": ba["peak_over_limit"],
        "jobguard_peak_tenth_over_limit": ga["peak_tenth_over_limit"],
        "bullmq_peak_tenth_over_limit": ba["peak_tenth_over_limit"],
        # What a backlog waiting for its turns costs the server, per second.
        "jobguard_server_cpu_pct": ga["run"]["server_cpu_pct"],
        "bullmq_server_cpu_pct": ba["run"]["server_cpu_pct"],
    }
    return r


def main(argv):
    if len(argv) % 3 != 0 or not argv:
        sys.exit("rate-summary.py: expected LOAD JOBGUARD_JSON BULLMQ_JSON per round")
    rounds = []
    for i in range(0, len(argv), 3):
        jg, bull = json.loads(argv[i + 1]), json.loads(argv[i + 2])
        rounds.append({"load_avg_1m": float(argv[i]), "jobguard": jg, "bullmq": bull,
                       "ratios": round_ratios(jg, bull)})
    median, spread = {}, {}
    for group, figures in rounds[0]["ratios"].items():
        median[group], spread[group] = {}, {}
        for k in figures:
            xs = [x["ratios"][group][k] for x in rounds]
            median[group][k] = statistics.median(xs)
            spread[group][k] = [min(xs), max(xs)]
    print(json.dumps({"rate": rounds[0]["jobguard"]["rate"], "jobs": rounds[0]["jobguard"]["jobs"],
                      "load_avg_1m": [x["load_avg_1m"] for x in rounds], "rounds": rounds,
                      "ratios_median": median, "ratios_range": spread}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
