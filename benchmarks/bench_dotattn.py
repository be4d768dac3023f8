"""Benchmark: the vectorised fixed-point solver of attnlib.dotattn against the reference scheme.

The reference is the published scheme as published (:mod:`attnlib.dotattn.reference`): the
12-node Stroud-Secrest rule squared (144 nodes in 4-d), a per-node quasi-Newton proximal step
(scipy BFGS with numerical gradient, started at 0, on the notebook's 2x2 form of the Moreau
objective, recomputed inside each of the four conjugate averages), damping 0.8, the stopping test
on the *undamped* change of (q, m, theta) below 1e-4, the state before that update returned,
unrestricted iteration from the published starting points, and the degree-11 Rabinowitz-Richter
rule for the test error and the free entropy. Its values are checked against rows of the
authors' tables (``PUBLISHED_ROWS``).

For each (alpha, branch) point we report CPU seconds of

* ours: ``solve_fixed_points`` with the default ``TheoryConfig`` (8^4 Gauss-Hermite nodes folded by
  the branch's symmetry group, Newton prox, damping 0.8 + Anderson, tolerance 1e-7), one point
  alone, and per point inside a batch of 14 points (7 alphas x 2 branches, how the chapter solves);
  one untimed warm-up solve first (torch's one-off start-up cost, ~0.5 s, is not the solver's);
* the reference: its measured time per conjugate evaluation (576 BFGS solves) times the number
  of conjugate evaluations its iteration needs (counted by iterating the same 144-node map with
  the batched prox, which follows the same iterates), plus 784 BFGS solves for its free entropy;
  with ``--full-reference`` the reference scheme is also run to the end with BFGS.

Accuracy: both are compared with a converged solution of the same equations computed with a
randomised quasi-Monte Carlo rule (scrambled Sobol', 2^18 points, two scrambles averaged; their
difference is reported as the uncertainty of that reference solution). Product rules such as
Gauss-Hermite converge slowly on the positional branch, where the proximal point jumps between
local minima, so a larger product rule is not a trustworthy yardstick there. The test error of the
reference scheme's overlaps is evaluated with the same accurate (prox-free) integral as ours.

Usage::

    python benchmarks/bench_dotattn.py [--full-reference] [--out FILE]

``--out`` writes the results with a provenance record (the committed copy is
``benchmarks/results/bench_dotattn.json``; the chapter quotes its accuracy figures from there).
CPU times are single-threaded (torch.set_num_threads(1)).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import time

import numpy as np
import torch

import attnlib
from attnbook.runs import git_commit
from attnlib import dotattn as da
from attnlib.dotattn.reference import PUBLISHED_ROWS

OMEGA = 0.3
POINTS = [(2.0, "semantic"), (2.0, "positional"), (1.25, "semantic"), (1.25, "positional")]
BATCH_ALPHAS = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
REF_CROSSING_ALPHAS = [1.2, 1.24, 1.28, 1.32]
TRUTH_LOG2_POINTS = 18
TRUTH_SCRAMBLES = (1, 2)


def cpu_time(fn):
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


sobol_gaussian = da.sobol_gaussian


def reference_solution(alphas, branches, start) -> dict:
    """Converged overlaps and errors from randomised QMC (mean and spread over the scrambles).

    Started from ``start`` (our solution): near alpha_c the semantic fixed point's basin is narrow,
    and from the published starting point a noisier rule can slide to theta = 0.
    """
    init = np.stack([start.q, start.m, start.V, start.theta], 1)
    sols = [da.solve_fixed_points(alphas, OMEGA, branches, init=init,
                                  quadrature=sobol_gaussian(TRUTH_LOG2_POINTS, s))
            for s in TRUTH_SCRAMBLES]
    out = {}
    for key in ("q", "m", "theta", "V", "eps_t", "eps_g"):
        vals = np.stack([getattr(s, key) for s in sols])
        out[key] = vals.mean(0)
        out[key + "_spread"] = np.abs(vals[0] - vals[-1])
    out["converged"] = np.all([s.converged for s in sols], axis=0)
    return out


def rel(a, b):
    return float(abs(a / b - 1)) if b != 0 else float(abs(a - b))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full-reference", action="store_true",
                        help="also run the reference scheme to convergence (minutes per point)")
    parser.add_argument("--out", default=None, help="write the results (JSON, with provenance) here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    cfg = da.TheoryConfig()
    da.solve_fixed_points(1.0, OMEGA, "positional", cfg)  # warm-up, untimed
    alphas = [a for a, _ in POINTS]
    branches = [b for _, b in POINTS]
    truth = reference_solution(alphas, branches, da.solve_fixed_points(alphas, OMEGA, branches, cfg))
    rows = []
    for i, (alpha, branch) in enumerate(POINTS):
        ours, t_ours = cpu_time(lambda a=alpha, b=branch: da.solve_fixed_points(a, OMEGA, b, cfg))
        # reference: one channel evaluation at our fixed point, and its iteration count
        _, t_iter = cpu_time(lambda o=ours, a=alpha: da.reference_channel_hats(
            float(o.q[0]), float(o.m[0]), float(o.theta[0]), float(o.V[0]), a, OMEGA))
        ref = da.reference_solve(alpha, OMEGA, branch, prox="newton")
        rq, rm, rt, rV = ref["q"], abs(ref["m"]), abs(ref["theta"]), ref["V"]
        n_ref = ref["n_channel"]
        t_prox = t_iter / 576  # one BFGS proximal solve
        pub = PUBLISHED_ROWS.get((branch, alpha))
        r_eg = float(da.test_error_theory(rq, rm, rt, OMEGA, cfg.sigma, cfg.A, n_nodes=cfg.n_nodes_eg)[0])
        ov = "theta" if branch == "semantic" else "m"
        row = {
            "alpha": alpha, "branch": branch,
            "ours_cpu_s": t_ours, "ours_iterations": int(ours.n_iter[0]),
            "reference_cpu_s_per_iteration": t_iter, "reference_iterations": ref["n_iter"],
            "reference_channel_evaluations": n_ref,
            "reference_cpu_s_estimated": t_iter * n_ref + 784 * t_prox,
            "speedup_estimated": (t_iter * n_ref + 784 * t_prox) / t_ours,
            "reference_vs_published_rel_err": None if pub is None else {
                k: rel(abs(ref[k]), abs(pub[k])) for k in ("q", ov, "V", "mse", "Phi")},
            "ours_vs_published_rel_err": None if pub is None else {
                "q": rel(ours.q[0], pub["q"]), ov: rel(getattr(ours, ov)[0], pub[ov]),
                "V": rel(ours.V[0], pub["V"]), "eps_g": rel(2 * ours.eps_g[0], pub["mse"]),
                "eps_t": rel(ours.eps_t[0], -pub["Phi"])},
            "truth_converged": bool(truth["converged"][i]),
            "ours_rel_err": {
                "q": rel(ours.q[0], truth["q"][i]), ov: rel(getattr(ours, ov)[0], truth[ov][i]),
                "V": rel(ours.V[0], truth["V"][i]), "eps_g": rel(ours.eps_g[0], truth["eps_g"][i]),
                "eps_t": rel(ours.eps_t[0], truth["eps_t"][i])},
            "reference_rel_err": {
                "q": rel(rq, truth["q"][i]), ov: rel(rm if ov == "m" else rt, truth[ov][i]),
                "V": rel(rV, truth["V"][i]), "eps_g": rel(r_eg, truth["eps_g"][i])},
            "truth_rel_spread": {
                "q": rel(truth["q"][i] + truth["q_spread"][i], truth["q"][i]),
                ov: rel(truth[ov][i] + truth[ov + "_spread"][i], truth[ov][i]),
                "V": rel(truth["V"][i] + truth["V_spread"][i], truth["V"][i]),
                "eps_g": rel(truth["eps_g"][i] + truth["eps_g_spread"][i], truth["eps_g"][i])},
        }
        if args.full_reference:
            full, t_ref = cpu_time(lambda a=alpha, b=branch: da.reference_solve(a, OMEGA, b, prox="bfgs"))
            row.update(reference_cpu_s=t_ref, reference_iterations_full=full["n_iter"],
                       speedup=t_ref / t_ours,
                       reference_bfgs_vs_newton_rel_err={
                           k: rel(abs(full[k]), abs(ref[k])) for k in ("q", ov, "V", "mse", "Phi")})
        rows.append(row)
        print(json.dumps(row))
    _, t_batch = cpu_time(lambda: da.solve_fixed_points(
        BATCH_ALPHAS * 2, OMEGA, ["positional"] * len(BATCH_ALPHAS) + ["semantic"] * len(BATCH_ALPHAS), cfg))
    per_point_batched = t_batch / (2 * len(BATCH_ALPHAS))
    # where the published scheme itself puts alpha_c at omega = 0.3 (its 144-node cubature)
    ref_gap = []
    for a in REF_CROSSING_ALPHAS:
        sem, pos = (da.reference_solve(a, OMEGA, b, prox="newton") for b in ("semantic", "positional"))
        ref_gap.append(pos["Phi"] - sem["Phi"])  # eps_t^sem - eps_t^pos
    ref_alpha_c = da.find_crossing(REF_CROSSING_ALPHAS, ref_gap)
    ref_mean = float(np.mean([r["reference_cpu_s_estimated"] for r in rows]))
    ours_single = float(np.mean([r["ours_cpu_s"] for r in rows]))
    worse = [(r["alpha"], r["branch"], k) for r in rows for k, v in r["ours_rel_err"].items()
             if k in r["reference_rel_err"] and v > r["reference_rel_err"][k]]
    summary = {
        "ours_cpu_s_per_point_single": ours_single,
        "ours_cpu_s_per_point_batched": per_point_batched,
        "reference_cpu_s_per_point_estimated": ref_mean,
        "speedup_single": ref_mean / ours_single,
        "speedup_batched": ref_mean / per_point_batched,
        "ours_max_rel_err": max(max(r["ours_rel_err"].values()) for r in rows),
        "reference_max_rel_err": max(max(r["reference_rel_err"].values()) for r in rows),
        "reference_vs_published_max_rel_err": max(
            max(r["reference_vs_published_rel_err"].values()) for r in rows
            if r["reference_vs_published_rel_err"]),
        "reference_iterations": {f'{r["branch"]} {r["alpha"]:g}': r["reference_iterations"] for r in rows},
        "reference_alpha_c_omega03": ref_alpha_c,
        "reference_gap_omega03": dict(zip(map(str, REF_CROSSING_ALPHAS), ref_gap, strict=True)),
        "ours_less_accurate_on": worse,
        "points": rows,
    }
    if args.full_reference:
        summary["speedup_full_reference"] = float(
            np.mean([r["reference_cpu_s"] for r in rows]) / ours_single)
    summary["provenance"] = {
        "script": "benchmarks/bench_dotattn.py",
        "attnlib_version": attnlib.__version__, "git_commit": git_commit(),
        "torch_version": torch.__version__, "threads": 1, "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "truth": f"scrambled Sobol 2^{TRUTH_LOG2_POINTS} points, scrambles {list(TRUTH_SCRAMBLES)}",
        "wall_s": round(time.perf_counter() - t_start, 1),
        "load_average_at_end": [round(v, 2) for v in os.getloadavg()],
        "note": "2-core CPU shared with other jobs while measuring: absolute seconds are inflated; "
                "ours and the reference were timed in the same run under the same load",
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "points"}, indent=2))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(summary, fh, indent=2)
            fh.write("\n")
    return summary


if __name__ == "__main__":
    main()
