"""propop against an earlier checkout of itself: issue 28's "no case slower than on today's main".

Each case of :mod:`benchmarks.versus_child` (issue 28's grid: the MLP and RNN
backpropagation of its table by substitution, cyclic reduction and ``auto``; the
Newton forward at DEER's two settings) runs in processes that alternate between
the two trees, ``--rounds`` of each, under glibc's defaults as a user's process
runs. A process imports the propop of one tree (``PYTHONPATH``; checked: it says
which file it imported) and times its jobs and a tight NumPy loop of the case's
size in interleaved, shuffled rounds. The loop is the same code in both trees'
processes: each round's *drift-corrected* ratio is ``(new / its loop) / (old / its
loop)``, and the table gives its median over the rounds with the raw medians
beside it. Both trees' answers must agree (a fingerprint of each job's gradients
or states, to ``1e-8``): the same job, not a cheaper one.

Run: ``python -m benchmarks.versus --old PATH [--save]``, ``PATH`` a checkout of the
earlier tree (``git worktree add /tmp/old f5265c1``: main when issue 28 was filed),
about seven minutes (``--case NAME`` for some cases alone: saved as
``versus_cases``); ``--quick``: two tiny cases against this tree itself, a check that
it runs.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
from typing import Any

from .common import arguments, each, publish

CHILD = pathlib.Path(__file__).with_name("versus_child.py")
HERE = CHILD.parent.parent
CASES = ("MLP l=1024 n=8 r=1", "MLP l=256 n=32 r=32", "MLP l=64 n=128 r=32",
         "RNN H=20 r=16 tau=10000", "RNN H=8 r=1 tau=65536",
         "Elman Newton forward H=8 tau=10000", "GRU Newton forward in=2 H=2 batch=16 tau=10000")
QUICK = ("quick MLP l=3 n=4 r=2", "quick Elman Newton forward H=3 tau=9")
SAME = 0.05  # a drift-corrected ratio within 5% of one reads "alike"
# a process's hang guard: the slowest (the old tree's GRU) runs five rounds of its 1.2 s
# and 3.0 s jobs after their warm-up, about 25 s; 1800 s is room on a loaded machine
HANG = 1800.0


def child(tree: pathlib.Path, case: str, seconds: float,
          timeout: float = HANG) -> dict[str, Any]:
    """One process of ``tree``'s propop on ``case`` (:func:`benchmarks.versus_child.measure`).

    ``timeout``: a hang guard (``subprocess.TimeoutExpired``), never a judged time.
    """
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, str(CHILD), case, str(seconds)], env=env,
                          capture_output=True, text=True, cwd=tree, timeout=timeout)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"{case} in {tree}: {last}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    imported = pathlib.Path(out["propop"]).resolve()
    if tree.resolve() not in imported.parents:
        raise RuntimeError(f"the process for {tree} imported propop from {imported}")
    return out


def row(case: str, old: pathlib.Path, new: pathlib.Path, rounds: int,
        seconds: float) -> dict[str, Any]:
    """``case`` in ``rounds`` alternating pairs of processes; the answers compared."""
    runs: dict[str, list] = {"old": [], "new": []}
    for _ in range(rounds):
        for which, tree in (("old", old), ("new", new)):
            runs[which].append(child(tree, case, seconds))
    for job, (squares, first) in runs["new"][0]["fingerprints"].items():
        theirs = runs["old"][0]["fingerprints"][job]
        if not all(abs(a - b) <= 1e-8 * max(abs(a), abs(b), 1e-300)
                   for a, b in zip((squares, first), theirs)):
            raise RuntimeError(f"{case}, {job}: the two trees' answers differ "
                               f"({[squares, first]} against {theirs})")
    return {"case": case, "runs": runs}


def summary(r: dict, job: str) -> tuple[float, float, float]:
    """``(old ms, new ms, drift-corrected new / old)``: medians over the processes."""
    def ms(which: str) -> float:
        return 1e3 * statistics.median(run["medians"][job] for run in r["runs"][which])

    def scaled(run: dict) -> float:
        return run["medians"][job] / run["medians"]["loop"]

    corrected = statistics.median(scaled(n) / scaled(o)
                                  for o, n in zip(r["runs"]["old"], r["runs"]["new"]))
    return ms("old"), ms("new"), corrected


def table(rows: list[dict], old: str) -> str:
    """One line per case and job: both trees' times and their drift-corrected ratio."""
    out = [f"**propop against {old}**: median time of a call [ms] in each tree's processes "
           "(glibc's defaults), and the new tree's time over the old's, each process's "
           "time divided by its own tight NumPy loop's (the machine's drift taken out); "
           f"within {SAME:.0%} of 1 reads alike", "",
           "| case | job | old [ms] | new [ms] | new / old | verdict |",
           "|---|---|---:|---:|---:|---|"]
    for r in rows:
        for job in r["runs"]["new"][0]["medians"]:
            if job == "loop":
                continue
            before, after, ratio = summary(r, job)
            verdict = ("alike" if abs(ratio - 1) <= SAME else
                       "faster" if ratio < 1 else "**slower**")
            out.append(f"| {r['case']} | {job} | {before:.1f} | {after:.1f} | "
                       f"{ratio:.2f}x | {verdict} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    """Every case against ``--old`` (``--quick``: tiny cases against this tree)."""
    parser = arguments("versus")
    parser.add_argument("--old", help="a checkout of the earlier propop tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="the least each process times its jobs for")
    parser.add_argument("--case", action="append", choices=CASES,
                        help="only this case (repeatable)")
    parser.add_argument("--quick", action="store_true",
                        help="two tiny cases against this tree itself: a check that it runs")
    args = parser.parse_args(argv)
    if args.old is None and not args.quick:
        parser.error("--old PATH is needed (a checkout of the earlier tree), or --quick")
    old = pathlib.Path(args.old) if args.old else HERE
    if not (old / "propop" / "__init__.py").is_file():
        parser.error(f"--old {old}: no propop package there (a checkout of propop's tree, "
                     "say git worktree add /tmp/old f5265c1)")
    cases = QUICK if args.quick else args.case or CASES
    rounds, seconds = (1, 0.0) if args.quick else (args.rounds, args.seconds)
    rows = [row(case, old, HERE, rounds, seconds) for case in each(cases, "versus")]
    name = "versus" + ("_quick" if args.quick else "_cases" if args.case else "")
    publish(name, rows, table(rows, _describe(old)))


def _describe(tree: pathlib.Path) -> str:
    """The tree's commit (``git rev-parse``), or its path."""
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return f"commit {done.stdout.strip()}" if done.returncode == 0 else str(tree)


if __name__ == "__main__":
    main()
