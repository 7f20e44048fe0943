#!/usr/bin/python3
"""Process overhead of the pathkernel CLI, side by side with a baseline binary.

Three figures, each the median over --repeats runs, each run a whole process
timed by the kernel (wait4: wall, user and system seconds, minor page faults):

  help     `pathkernel --help` (goal <= 0.3 s wall).
  demo     the commands of `make demo` (train, info, check-path, verify,
           explain, report) on their own run directory: user and system
           seconds summed over the commands, and system / user.
  threads  `train` and `verify --test 10` of the benchmark's threads row
           (gaussians3, mlp:256, full-batch GD, 100 steps) with --threads 1
           and 2: speedup = time with 1 thread / time with 2 (goal >= 1.7 for
           the attribution, `verify`'s own `seconds`).

With --baseline BIN the same runs alternate between BIN and --bin (A B A B),
and each figure is printed for both with the ratio baseline / bin. Note the
load (printed) when quoting: the machine may be shared.

  scripts/process_overhead.py --parts help --repeats 9
  scripts/process_overhead.py --baseline /path/to/old/build/pathkernel --parts demo --repeats 1
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(argv, env=None):
    """Runs argv (output discarded unless it is JSON we need); returns its figures and stdout."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO,
                            env=env if env is not None else os.environ)
    out = proc.stdout.read()
    _, status, ru = os.wait4(proc.pid, 0)
    proc.stdout.close()
    wall = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit("process_overhead: failed (%d): %s" % (os.waitstatus_to_exitcode(status), " ".join(argv)))
    return {"wall": wall, "user": ru.ru_utime, "sys": ru.ru_stime, "minflt": ru.ru_minflt}, out


def median_of(runs, key):
    return statistics.median(r[key] for r in runs)


def load():
    return open("/proc/loadavg").read().split()[0]


def help_figure(binary, _work):
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)  # as a user starts it
    f, _ = timed([binary, "--help"], env)
    return f


def demo_commands(binary, run):
    return [
        [binary, "train", "--data", "mnist", "--model", "mlp:64", "--optimizer", "sgd", "--lr", "0.1", "--batch",
         "100", "--steps", "300", "--seed", "0", "--out", run, "--force", "--quiet"],
        [binary, "info", run],
        [binary, "check-path", run, "--quiet"],
        [binary, "verify", run, "--test", "10", "--quiet"],
        [binary, "explain", run, "--test-index", "0,700,1200", "--top", "10", "--quiet"],
        [binary, "report", run, "--out", os.path.join(run, "report.html"), "--quiet"],
    ]


def demo_figure(binary, work):
    run = os.path.join(work, "demo")
    total = {"wall": 0.0, "user": 0.0, "sys": 0.0, "minflt": 0}
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    for argv in demo_commands(binary, run):
        f, _ = timed(argv, env)
        for k in total:
            total[k] += f[k]
    shutil.rmtree(run, ignore_errors=True)
    total["sys/user"] = total["sys"] / total["user"]
    return total


def threads_figure(binary, work):
    out = {}
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    for n in (1, 2):
        run = os.path.join(work, "threads_%d" % n)
        f, _ = timed([binary, "--threads", str(n), "train", "--data", "gaussians3", "--model", "mlp:256",
                      "--optimizer", "gd", "--lr", "0.1", "--steps", "100", "--seed", "0", "--out", run, "--force",
                      "--quiet"], env)
        with open(os.path.join(run, "timing.json")) as fh:
            out["train_%d" % n] = json.load(fh)["seconds"]
        f, text = timed([binary, "--threads", str(n), "verify", run, "--test", "10", "--json", "--quiet"], env)
        out["attribution_%d" % n] = json.loads(text.decode().strip().splitlines()[-1])["seconds"]
        shutil.rmtree(run, ignore_errors=True)
    out["train_speedup"] = out["train_1"] / out["train_2"]
    out["thread_speedup"] = out["attribution_1"] / out["attribution_2"]
    return out


PARTS = {"help": help_figure, "demo": demo_figure, "threads": threads_figure}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "pathkernel"))
    ap.add_argument("--baseline", help="a second pathkernel binary, run alternately with --bin")
    ap.add_argument("--parts", default="help,demo,threads")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="uncounted runs of each binary first")
    args = ap.parse_args()
    binaries = [("bin", os.path.abspath(args.bin))]
    if args.baseline:
        binaries.insert(0, ("baseline", os.path.abspath(args.baseline)))
    print("machine: %d cores, load %s at the start; bin %s%s" %
          (os.cpu_count(), load(), binaries[-1][1], "; baseline %s" % args.baseline if args.baseline else ""))
    with tempfile.TemporaryDirectory(prefix="pathkernel-overhead-") as work:
        for part in args.parts.split(","):
            runs = {name: [] for name, _ in binaries}
            for _ in range(args.warmup):  # page cache, the demo's data
                for name, binary in binaries:
                    PARTS[part](binary, work)
            for _ in range(args.repeats):
                for name, binary in binaries:
                    runs[name].append(PARTS[part](binary, work))
            keys = list(runs["bin"][0].keys())
            header = "%-8s %-16s" % (part, "figure") + "".join("%14s" % n for n, _ in binaries)
            print(header + ("%14s" % "baseline/bin" if args.baseline else ""))
            for k in keys:
                med = {n: median_of(runs[n], k) for n, _ in binaries}
                line = "%-8s %-16s" % ("", k) + "".join("%14.4g" % med[n] for n, _ in binaries)
                if args.baseline and med["bin"]:
                    line += "%14.3g" % (med["baseline"] / med["bin"])
                print(line)
            print("%-8s (median of %d; load now %s)" % ("", args.repeats, load()))


if __name__ == "__main__":
    main()
