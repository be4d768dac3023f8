"""Action solver of chapter 4 against the authors' method, on the hidden-Markov-chain problem.

Ours: L-BFGS on Cholesky factors of the order parameters, started at the GP point
(``attnlib.paths.PathAction.solve``, no Newton polishing). Reference: Adam (lr 0.1) on the raw
symmetrised matrices, as in the authors' public code. Both stop at the same tolerance,
``max |dS/dU| < tol`` over the raw entries. Reports wall and CPU time of each and the ratio
Adam / ours (CPU time on the CPU, wall time on a GPU) for every width of the paper's grid, plus
the largest difference between the two minimisers.
Usage: ``python benchmarks/bench_paths.py [--device cuda] [--draw 0] [--tol 1e-5]``.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from attnlib import paths as ap
from attnlib import resolve_device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--draw", type=int, default=0)
    parser.add_argument("--tol", type=float, default=1e-5)
    parser.add_argument("--widths", default="10,30,100,300,1000")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    print(f"device: {device}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    pr = ap.markov_problem(ap.MarkovTaskConfig(), args.draw, "four")
    xt = ap.scaled_features(pr["xi_tr"]).to(device)
    y = pr["y_tr"].to(device)
    print(
        f"{'N':>6} {'ours s':>8} {'ours cpu':>9} {'adam s':>8} {'adam cpu':>9} {'steps':>6} "
        f"{'ratio':>7} {'max|dU|':>9}"
    )
    ratios = []
    for N in [int(w) for w in args.widths.split(",")]:
        act = ap.PathAction(xt, y, [2, 2], [N, N, N], 0.01)
        r = ap.compare_solvers(act, tol=args.tol)
        ratios.append(r["speedup"] if device.type == "cpu" else r["speedup_wall"])
        print(
            f"{N:>6} {r['lbfgs_s']:>8.3f} {r['lbfgs_cpu_s']:>9.3f} {r['adam_s']:>8.2f} "
            f"{r['adam_cpu_s']:>9.2f} {r['adam_steps']:>6} {ratios[-1]:>7.1f} "
            f"{r['U_diff']:>9.1e}"
        )
    print(f"median speed-up (Adam time / ours) over widths: {statistics.median(ratios):.1f}")


if __name__ == "__main__":
    main()
