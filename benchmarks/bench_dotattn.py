"""Benchmark: the vectorised fixed-point solver of attnlib.dotattn against the reference scheme.

The reference scheme (a faithful re-implementation of the published solver's numerics): the
12-node Stroud-Secrest rule squared (144 nodes in 4-d), a per-node quasi-Newton proximal step
(scipy BFGS with numerical gradient, started at 0, recomputed inside each of the four conjugate
averages), damping 0.8, stopping tolerance 1e-4 on (q, m, theta), unrestricted iteration from the
published starting points.

For each (alpha, branch) point we report CPU seconds of
* ours: ``solve_fixed_points`` (8^4 Gauss-Hermite nodes, Newton prox, damping 0.8 + Anderson,
  tolerance 1e-7), one point alone, and per point inside a batch of points;
* the reference: by default its measured time per iteration times the number of iterations its
  144-node map needs (counted by iterating that same map with the batched prox, which follows the
  same iterates); with ``--full-reference`` the reference scheme is also run to the end.
Accuracy: both are compared with a 12^4-node solve of ours (the most accurate available).

Usage::

    python benchmarks/bench_dotattn.py [--full-reference] [--out results.json]

CPU times are single-threaded (torch.set_num_threads(1)); wall times on a shared machine are not
meaningful.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from attnlib import dotattn as da

OMEGA = 0.3
POINTS = [(2.0, "semantic"), (2.0, "positional"), (1.25, "semantic"), (1.25, "positional")]


def cpu_time(fn):
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full-reference", action="store_true",
                        help="also run the reference scheme to convergence (minutes per point)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cfg = da.TheoryConfig(n_nodes=8)
    hi = da.TheoryConfig(n_nodes=12)
    rows = []
    for alpha, branch in POINTS:
        ours, t_ours = cpu_time(lambda a=alpha, b=branch: da.solve_fixed_points(a, OMEGA, b, cfg))
        best = da.solve_fixed_points(alpha, OMEGA, branch, hi)
        # reference: one channel evaluation at our fixed point, and its iteration count
        _, t_iter = cpu_time(lambda o=ours, a=alpha: da.reference_channel_hats(
            float(o.q[0]), float(o.m[0]), float(o.theta[0]), float(o.V[0]), a, OMEGA))
        ref_fast = da.reference_solve(alpha, OMEGA, branch, fast_prox=True)
        n_ref = ref_fast[-1]
        row = {
            "alpha": alpha, "branch": branch,
            "ours_cpu_s": t_ours, "ours_iterations": int(ours.n_iter[0]),
            "reference_cpu_s_per_iteration": t_iter, "reference_iterations": n_ref,
            "reference_cpu_s_estimated": t_iter * n_ref,
            "speedup_estimated": t_iter * n_ref / t_ours,
            "ours_abs_err_theta": abs(float(ours.theta[0]) - float(best.theta[0])),
            "ours_abs_err_m": abs(float(ours.m[0]) - float(best.m[0])),
            "ours_rel_err_q": abs(float(ours.q[0]) / float(best.q[0]) - 1),
            "reference_abs_err_theta": abs(abs(ref_fast[2]) - float(best.theta[0])),
            "reference_abs_err_m": abs(abs(ref_fast[1]) - float(best.m[0])),
            "reference_rel_err_q": abs(ref_fast[0] / float(best.q[0]) - 1),
        }
        if args.full_reference:
            ref, t_ref = cpu_time(lambda a=alpha, b=branch: da.reference_solve(a, OMEGA, b))
            row.update(reference_cpu_s=t_ref, reference_iterations_full=ref[-1],
                       speedup=t_ref / t_ours)
        rows.append(row)
        print(json.dumps(row))
    alphas = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    _, t_batch = cpu_time(lambda: da.solve_fixed_points(
        alphas * 2, OMEGA, ["positional"] * len(alphas) + ["semantic"] * len(alphas), cfg))
    per_point_batched = t_batch / (2 * len(alphas))
    ref_mean = float(np.mean([r["reference_cpu_s_estimated"] for r in rows]))
    summary = {
        "ours_cpu_s_per_point_single": float(np.mean([r["ours_cpu_s"] for r in rows])),
        "ours_cpu_s_per_point_batched": per_point_batched,
        "reference_cpu_s_per_point_estimated": ref_mean,
        "speedup_single": ref_mean / float(np.mean([r["ours_cpu_s"] for r in rows])),
        "speedup_batched": ref_mean / per_point_batched,
        "points": rows,
    }
    if args.full_reference:
        summary["speedup_full_reference"] = float(
            np.mean([r["reference_cpu_s"] for r in rows]) / summary["ours_cpu_s_per_point_single"])
    print(json.dumps({k: v for k, v in summary.items() if k != "points"}, indent=2))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(summary, fh, indent=2)
    return summary


if __name__ == "__main__":
    main()
