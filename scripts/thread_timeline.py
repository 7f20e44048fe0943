#!/usr/bin/env python3
"""Each thread's share of a core, second by second, from a perf sampling of
a pathkernel command: which thread is the critical path and how busy the
others are (BENCHMARKS.md's section on the user CNN's one point).

    perf record -F 199 -s -o T.data build/pathkernel --quiet verify R --test 1
    perf script -i T.data -F tid,time | /usr/bin/python3 scripts/thread_timeline.py --hz 199

Prints, per second from the first sample, every busy thread's samples over
the sampling rate (1.00 = a whole core) and their sum; then each thread's
mean over the seconds after the first two (the run's opening).
"""
import argparse
import collections
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hz", type=float, required=True, help="perf record's -F")
    parser.add_argument("--threads", type=int, default=6, help="the busiest threads shown")
    args = parser.parse_args()
    samples = collections.Counter()
    first = None
    for line in sys.stdin:
        fields = line.split()
        if len(fields) < 2:
            continue
        tid, time = fields[0], float(fields[1].rstrip(":"))
        first = time if first is None else min(first, time)
        samples[(tid, time)] += 1
    if first is None:
        sys.exit("no samples on standard input: expected `perf script -F tid,time` lines")
    per_second = collections.Counter()
    for (tid, time), n in samples.items():
        per_second[(tid, int(time - first))] += n
    totals = collections.Counter()
    for (tid, _), n in per_second.items():
        totals[tid] += n
    tids = [t for t, _ in totals.most_common(args.threads)]
    seconds = range(max(s for _, s in per_second) + 1)
    print("second " + " ".join(f"{t:>8}" for t in tids) + "      sum")
    for s in seconds:
        shares = [per_second[(t, s)] / args.hz for t in tids]
        print(f"{s:6d} " + " ".join(f"{v:8.2f}" for v in shares) + f" {sum(shares):8.2f}")
    steady = [s for s in seconds if s >= 2][:-1] or list(seconds)
    means = [sum(per_second[(t, s)] for s in steady) / args.hz / len(steady) for t in tids]
    print("  mean " + " ".join(f"{v:8.2f}" for v in means) + f" {sum(means):8.2f}")


if __name__ == "__main__":
    main()
