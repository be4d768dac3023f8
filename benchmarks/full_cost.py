"""What the `full` profile of each chapter costs on a CPU: probes at full size, scaled.

No full sweep is run. Each probe times one point (or a few steps) of a chapter's `full` sweep at
its full sizes, single-threaded, in CPU seconds (``time.process_time``: on a shared machine CPU
time is steadier than wall time). A probe that would take too long on this CPU is run at two
smaller sizes of its dominant dimension; the growth between them gives the exponent used to
extrapolate to the full size. Tables whose per-point cost was already measured by a committed
benchmark (chapter 3's theory solver, chapter 4's solvers and sampler) take it from
``benchmarks/results/``; the remaining tables are scaled from the measured ``quick`` run
(per-point wall time in the quick build's sweep checkpoints) by the ratio of their sizes.

    .venv/bin/python benchmarks/full_cost.py probe ch1-curves ch1-mc ch1-heads ch3-gd
    .venv/bin/python benchmarks/full_cost.py report      # writes the JSON and the markdown table
    .venv/bin/python benchmarks/full_cost.py table       # the markdown table again, estimates kept
    .venv/bin/python benchmarks/full_cost.py store 01-random-features kernel-mc max-floor
    .venv/bin/python benchmarks/full_cost.py measured 04-attention-paths hmc-theory 21.5
    .venv/bin/python benchmarks/full_cost.py measured 01-random-features samples-to-risk 734 \
        --partial "56 points finished"                      # a run stopped midway: a lower bound

``store`` computes single tables of a chapter's ``full`` profile and stores them in ``results/``
without running the whole chapter: it executes the chapter's own code (its parameter and set-up
cells, then, for each table named in order, the statements of the cell that computes it, up to
the call that stores it), so the stored table has exactly the key the chapter's ``full`` run
looks for. A table already stored is loaded instead; name it first when a later table's cell
needs the names its cell binds (``store`` checks this before it runs anything, and names the cell
that binds a missing name; a function from a cell that stores nothing goes in ``--defs``). The
CPU seconds it took (this process and its Dask workers) are written to
``benchmarks/results/full_runs.json``;
``measured`` enters the CPU seconds of a table stored by a whole-chapter run. ``--points K``
stores the first K points only (a partial table); a later ``store`` of a table whose stored copy
is partial takes that copy's points over into the sweep's checkpoint and computes the rest:

    .venv/bin/python benchmarks/full_cost.py store 01-random-features brfa --points 6   # one machine
    .venv/bin/python benchmarks/full_cost.py store 01-random-features brfa              # the rest, later

The last column says, per table, whether a ``full`` run stores it in ``results/`` and, where it
is stored, the measured wall time, device and date from its provenance record (``table`` re-reads
``results/`` without re-estimating, after a ``full`` run has stored new tables).

The report writes ``benchmarks/results/full_cost.json`` (every number, its basis and the
provenance) and ``book/full-cost-table.md`` (the table the reproducibility page includes).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
PROBES = RESULTS / "full_cost_probes.json"
MEASURED = RESULTS / "full_runs.json"  # CPU seconds of the full tables actually computed
OUT = RESULTS / "full_cost.json"
TABLE = ROOT / "book" / "full-cost-table.md"
CHAPTERS = {"00": "00-attention", "01": "01-random-features", "02": "02-provable-mha",
            "03": "03-positional-semantic", "04": "04-attention-paths"}
#: Tables that a chapter's ``full`` run stores in ``results/<chapter>/<table>.csv`` (chapter 3's
#: rows name theirs explicitly).
STORES = {"00": {"neff"},
          "01": {"kernel-mc", "kernel-curves", "samples-to-risk", "max-floor", "heads", "brfa",
                 "crossing", "key-key"},
          "02": {"ablation", "moments", "regimes", "limit", "hard"},
          "03": {"histogram"},  # the other chapter-3 rows say so themselves (stored="yes")
          "04": {"hmc-theory", "two-path", "hmc-sampling", "glyphs-theory", "glyphs-pruning"}}
#: Tables stored in parts (one CSV per width): the table's name, then ``-N<width>``.
PARTS = {("04", "hmc-sampling"): [10, 30, 100]}


def _cpu(fn, **kw) -> float:
    t0 = time.process_time()
    fn(**kw)
    return time.process_time() - t0


# ---- probes ------------------------------------------------------------------------------------
def probe_ch1_curves() -> dict:
    """Chapter 1 kernel learning curves (one seed, N = 8) at n_max = 1024, 2048, 4096."""
    from attnlib import random_qk as rq

    full = rq.PROFILES["full"]
    out = {}
    for n_max in (1024, 2048, 4096):
        out[str(n_max)] = _cpu(rq.kernel_curves_point, d=full.d, N=8,
                               n_list=[n for n in full.n_list if n <= n_max], n_val=full.n_val,
                               n_test=full.n_test, seed=0, lambdas=list(full.lambdas))
        print(f"ch1-curves n_max={n_max}: {out[str(n_max)]:.1f} CPU s", flush=True)
    return {"cpu_s_by_n_max": out, "N": 8, "full_n_max": max(full.n_list)}


def probe_ch1_mc() -> dict:
    """Chapter 1 kernel Monte Carlo: the one full point."""
    from attnlib import random_qk as rq

    full = rq.PROFILES["full"]
    s = _cpu(rq.kernel_mc_point, d=full.d, N=full.N, sequences=full.mc_sequences,
             heads=list(full.mc_heads), repeats=full.mc_repeats, seed=0)
    print(f"ch1-mc: {s:.1f} CPU s", flush=True)
    return {"cpu_s": s}


def probe_ch1_heads() -> dict:
    """Chapter 1 heads sweep at n_max = 1024 with heads up to 2048 (cost ~ rows x n_max x M)."""
    from attnlib import random_qk as rq

    full = rq.PROFILES["full"]
    heads = [m for m in full.heads_list if m <= 2048]
    s = _cpu(rq.heads_sweep_point, d=full.d, N=full.N, n_list=[1024], n_val=full.n_val,
             n_test=full.n_test, seed=0, lambdas=list(full.lambdas), heads_list=heads)
    print(f"ch1-heads: {s:.1f} CPU s", flush=True)
    return {"cpu_s": s, "n_max": 1024, "max_heads": 2048}


def probe_ch1_brfa() -> dict:
    """Chapter 1 RFA/BRFA learning curves (every bias, the full number of heads) at n_max = 1024,
    and the crossing experiment at n_max = 800 (cost ~ rows x n_max x heads)."""
    from attnlib import random_qk as rq

    full = rq.PROFILES["full"]
    brfa = _cpu(rq.heads_curves_point, d=full.d, N=full.N, n_list=[n for n in full.n_list if n <= 1024],
                n_val=full.n_val, n_test=full.n_test, seed=0, lambdas=list(full.lambdas),
                heads=full.heads, biases=list(full.bias_list))
    print(f"ch1-brfa: {brfa:.1f} CPU s", flush=True)
    cross = _cpu(rq.heads_curves_point, d=full.small_d, N=full.small_N,
                 n_list=[n for n in full.small_n_list if n <= 800], n_val=full.n_val,
                 n_test=full.n_test, seed=0, lambdas=list(full.lambdas), heads=full.heads,
                 biases=[0.0, full.bias], targets=["geg2"])
    print(f"ch1-crossing: {cross:.1f} CPU s", flush=True)
    return {"brfa_cpu_s": brfa, "brfa_n_max": 1024, "crossing_cpu_s": cross, "crossing_n_max": 800}


#: chapter 3's full profile trains its d = 1000 GD tables one alpha and one block of this many
#: seeds a point (its ``seed_block``)
CH3_SEED_BLOCK = 2


def probe_ch3_gd() -> dict:
    """Chapter 3 GD at d = 1000 as the full profile trains it: one alpha and one block of
    ``CH3_SEED_BLOCK`` seeds, both initialisations; once with the 25 omegas of the phase diagram
    in one batch and once with omega = 0.3 alone. A step's cost is the difference between 25 and
    5 steps, at alpha = 1 and alpha = 2 (it grows faster than n = alpha d: more of the data falls
    out of the cache); the test set (50 000 sequences a seed, once a point) is timed apart."""
    from attnlib import dotattn as da

    seeds = CH3_SEED_BLOCK
    out = {"per_seed_step_s": {}, "seeds": seeds, "d": 1000}
    for key, omegas in (("25 omegas", list(np.round(np.linspace(0.02, 0.5, 25), 4))),
                        ("one omega", [0.3])):
        out["per_seed_step_s"][key] = {}
        for alpha in (1.0, 2.0):
            t = {steps: _cpu(da.train_attention, alphas=[alpha], omegas=omegas,
                             config=da.SimConfig(d=1000, n_seeds=seeds, steps=steps, n_test=500),
                             seed=0, device="cpu") for steps in (5, 25)}
            out["per_seed_step_s"][key][str(alpha)] = (t[25] - t[5]) / 20 / seeds
            print(f"ch3-gd {key}, alpha = {alpha:g}: "
                  f"{out['per_seed_step_s'][key][str(alpha)]:.4f} CPU s a seed and step", flush=True)
    t = {n: _cpu(da.train_attention, alphas=[1.0], omegas=[0.3],
                 config=da.SimConfig(d=1000, n_seeds=seeds, steps=1, n_test=n), seed=0, device="cpu")
         for n in (500, 50_000)}
    out["test_s_per_seed"] = (t[50_000] - t[500]) / seeds
    print(f"ch3-gd test set: {out['test_s_per_seed']:.1f} CPU s a seed", flush=True)
    return out


def ch3_gd_cost(probe: dict, omegas: str, alphas, seeds: int, steps: int = 5000) -> float:
    """CPU seconds of a GD table of chapter 3 from :func:`probe_ch3_gd`: per seed and alpha,
    ``steps`` steps at the probe's cost, interpolated as a power of alpha between alpha = 1 and 2,
    plus the test set."""
    c = probe["per_seed_step_s"][omegas]
    power = math.log2(c["2.0"] / c["1.0"])
    per_seed = sum(steps * c["1.0"] * a**power + probe["test_s_per_seed"] for a in alphas)
    return seeds * per_seed


def probe_ch4_images() -> dict:
    """Chapter 4's image experiment as the full profile runs it: drawing episodes (CPU s per
    1000), one Adam step of one width-512 network on a batch of 128 episodes (the difference
    between 105 and 5 steps, from a pool of 4000), and the theory at the scoring width N = 10
    with P = 600 training episodes (one solve at T = 0.1, on the features of the network after
    those steps). Each is timed after a first call (allocations, kernel selection)."""
    import dataclasses

    from attnlib import glyphs as ag
    from attnlib import paths as ap

    cfg = ap.IMAGE_PROFILES["full"]
    glyph_set = ag.make_glyphs(cfg.glyphs)
    g = torch.Generator().manual_seed(0)
    pool = ap.make_episodes(glyph_set, 4000, "train", g, cfg.patch)
    ep_s = _cpu(ap.make_episodes, glyphs=glyph_set, n=4000, split="train", generator=g, patch=cfg.patch) / 4
    t = {}
    for steps in (2, 5, 105):  # the first run warms up
        c = dataclasses.replace(cfg, gd_steps=steps, gd_warmup=0)
        t0 = time.process_time()
        (net,), _ = ap.train_icl_nets(c, pool.x, pool.y, [torch.Generator().manual_seed(1)], [0])
        t[steps] = time.process_time() - t0
    step_s = (t[105] - t[5]) / 100
    print(f"ch4-images: {ep_s:.2f} CPU s per 1000 episodes, {step_s:.3f} CPU s an Adam step", flush=True)
    with torch.no_grad():
        tr, te = pool[: cfg.P], pool[cfg.P: cfg.P + cfg.n_test]
        xt = [ap.scaled_features(ap.path_features(ep.x, [A.double() for A in net.attention(ep.x.float())],
                                                  "mean")) for ep in (tr, te)]
    t0 = time.process_time()
    ap.PathAction(xt[0], tr.y, [4, 4], [10, 10, 10], 0.1).solve(newton_steps=0, gtol=1e-9)
    solve_s = time.process_time() - t0
    print(f"ch4-images: theory at N = 10, P = {cfg.P}: {solve_s:.1f} CPU s", flush=True)
    return {"episodes_s_per_1000": ep_s, "step_s": step_s, "solve_N10_s": solve_s, "width": cfg.width,
            "batch": cfg.gd_batch, "P": cfg.P}


PROBE = {"ch1-curves": probe_ch1_curves, "ch1-mc": probe_ch1_mc, "ch1-heads": probe_ch1_heads,
         "ch1-brfa": probe_ch1_brfa, "ch3-gd": probe_ch3_gd, "ch4-images": probe_ch4_images}


# ---- the measured quick run --------------------------------------------------------------------
def quick_sweeps() -> dict:
    """Per-sweep wall time of the book's quick build (from its sweep checkpoints) and the chapters'
    quick wall times, when the quick build's outputs are on this machine."""
    records_path = ROOT / "book" / "_cache" / "executions.json"
    out = {}
    if not records_path.exists():
        return out
    for slot, rec in json.loads(records_path.read_text()).items():
        if "@" in slot:
            continue
        from attnbook.checkpoints import read_checkpoint, resumable

        sweeps = {}
        for path in resumable(ROOT / "book" / "_cache" / "sweeps" / slot):  # <name>.<key>.jsonl
            done = read_checkpoint(path)
            sweeps[path.stem.rsplit(".", 1)[0]] = {
                "points": len(done), "wall_s": round(sum(r[0]["elapsed_s"] for r in done.values()), 2)}
        out[slot] = {"wall_s": rec.get("wall_s"), "sweeps": sweeps}
    return out


# ---- estimates ---------------------------------------------------------------------------------
def estimates(probes: dict, quick: dict) -> list[dict]:
    """One row per table of the `full` profile: points, basis, estimated CPU seconds (one core)."""
    from attnlib import mha
    from attnlib import random_qk as rq

    q1, f1 = rq.PROFILES["quick"], rq.PROFILES["full"]
    q2, f2 = mha.PROFILES["quick"], mha.PROFILES["full"]
    bench3 = json.loads((RESULTS / "bench_dotattn.json").read_text())
    bench4 = json.loads((RESULTS / "bench_paths.json").read_text())
    rows = []

    def qs(chapter, sweep):
        return quick.get(chapter, {}).get("sweeps", {}).get(sweep, {}).get("wall_s", float("nan"))

    def row(chapter, table, points, basis, cpu_s, gpu, stored=None):
        if stored is None:
            stored = "yes" if table.split(" ")[0] in STORES.get(chapter, ()) else "no"
        rows.append({"chapter": chapter, "table": table, "points": points, "basis": basis,
                     "cpu_s": None if cpu_s is None or math.isnan(cpu_s) else round(cpu_s), "gpu": gpu,
                     "stored": stored})

    # chapter 0: 49 score scales x 400 layers (quick: 25 x 24); cost per point ~ layers
    row("00", "neff", 49, "quick sweep x (49/25 points) x (400/24 layers)",
        qs("00-attention", "neff") * 49 / 25 * 400 / 24, "no (seconds)")

    # chapter 1
    c = probes.get("ch1-curves", {}).get("cpu_s_by_n_max", {})
    if c:
        p = math.log(c["4096"] / c["2048"], 2) if "4096" in c else math.log(c["2048"] / c["1024"], 2)
        last = c.get("4096") or c["2048"]
        n_last = 4096 if "4096" in c else 2048
        t_full = last * (max(f1.n_list) / n_last) ** p
        n_pts = len(f1.N_list) * f1.seeds
        row("01", "kernel-curves", n_pts,
            f"probe, one seed, N = 8, n_max 1024/2048/4096: {c['1024']:.0f}/{c['2048']:.0f}/"
            f"{c.get('4096', float('nan')):.0f} CPU s, growth n^{p:.2f} to n = {max(f1.n_list)}: "
            f"{t_full:.0f} s a point", t_full * n_pts, "yes (n x n eigendecompositions)")
        row("01", "key-key", f1.seeds, "probe: RFA only at n <= 4096, about half the kernel-curves "
            "point at n_max = 4096", f1.seeds * last / 2 * (4096 / n_last) ** p, "yes")
        floor_growth = (max(f1.floor_n_list) / max(q1.floor_n_list)) ** p
        row("01", "max-floor", f1.seeds, f"quick sweep x (n_max {max(f1.floor_n_list)}/"
            f"{max(q1.floor_n_list)})^{p:.2f} x ({f1.seeds}/{q1.seeds} seeds)",
            qs("01-random-features", "max-floor") * floor_growth * f1.seeds / q1.seeds, "yes")
    if "ch1-mc" in probes:
        row("01", "kernel-mc", 1, "probe: the full point", probes["ch1-mc"]["cpu_s"], "yes")
    if "ch1-heads" in probes:
        h = probes["ch1-heads"]
        rows_full, rows_probe = max(f1.n_list) + f1.n_val + f1.n_test, h["n_max"] + f1.n_val + f1.n_test
        scale = rows_full * max(f1.n_list) / (rows_probe * h["n_max"]) * max(f1.heads_list) / h["max_heads"]
        row("01", "heads", f1.seeds, f"probe at n_max = {h['n_max']}, M <= {h['max_heads']}: "
            f"{h['cpu_s']:.0f} CPU s, x{scale:.0f} (kernel accumulation ~ rows x n_max x M); the ridge "
            f"solves at n = {max(f1.n_list)} come on top: a lower bound",
            h["cpu_s"] * scale * f1.seeds, "yes (the finite-head kernel is one large matmul)")
    if "ch1-brfa" in probes:
        b = probes["ch1-brfa"]
        other = f1.n_val + f1.n_test
        sb = (max(f1.n_list) + other) * max(f1.n_list) / ((b["brfa_n_max"] + other) * b["brfa_n_max"])
        row("01", "brfa", f1.brfa_seeds, f"probe at n_max = {b['brfa_n_max']}, every bias, "
            f"{f1.heads} heads: {b['brfa_cpu_s']:.0f} CPU s, x{sb:.0f} (finite-head kernel ~ rows x "
            "n_max); the ridge solves at the largest n come on top: a lower bound",
            b["brfa_cpu_s"] * sb * f1.brfa_seeds, "yes (one large matmul per bias)")
        sc = ((max(f1.small_n_list) + other) * max(f1.small_n_list)
              / ((b["crossing_n_max"] + other) * b["crossing_n_max"]))
        row("01", "crossing", f1.seeds, f"probe at n_max = {b['crossing_n_max']}: "
            f"{b['crossing_cpu_s']:.0f} CPU s, x{sc:.0f} (rows x n_max): a lower bound",
            b["crossing_cpu_s"] * sc * f1.seeds, "yes")
    s2r = ((len(f1.s2r_N_list) + len(f1.s2r_d_list)) / (len(q1.s2r_N_list) + len(q1.s2r_d_list))
           * f1.seeds / q1.seeds * (f1.n_val + f1.n_test) / (q1.n_val + q1.n_test))
    row("01", "samples-to-risk", "about 100", f"quick sweep x {s2r:.0f} (settings, seeds, validation "
        "and test rows); the sample sizes follow the theory, larger at d = 12 and N = 32: a lower bound",
        qs("01-random-features", "samples-to-risk") * s2r, "yes")

    # chapter 2 (point functions defined in the chapter: scaled from the quick run)
    n_abl = len(f2.ablation_heads) * f2.ablation_instances + len(f2.sharp_heads) * f2.sharp_instances
    n_abl_q = len(q2.ablation_heads) * q2.ablation_instances + len(q2.sharp_heads) * q2.sharp_instances
    fa = f2.n_ablation / q2.n_ablation
    row("02", "ablation", n_abl, f"quick sweep per point x {fa:.0f} (examples) x {n_abl}/{n_abl_q} "
        "points; m = 3 (not in quick) costs more: a lower bound",
        qs("02-provable-mha", "ablation") / n_abl_q * fa * n_abl, "little (small tensors, many steps)")
    n_hard = len(f2.hard_heads) * len(f2.hard_dims) + 1
    n_hard_q = len(q2.hard_heads) * len(q2.hard_dims) + 1
    fh = f2.adam_seeds / q2.adam_seeds * f2.adam_max_steps / q2.adam_max_steps
    row("02", "hard", n_hard, f"quick sweep per point x {fh:.0f} (seeds x step cap; runs stop "
        "earlier on a plateau: an upper bound)", qs("02-provable-mha", "hard") / n_hard_q * fh * n_hard,
        "yes (batched Adam)")
    row("02", "moments", 21, f"quick sweep x {f2.moment_samples // q2.moment_samples} (samples)",
        qs("02-provable-mha", "moments") * f2.moment_samples / q2.moment_samples, "no (minutes)")
    row("02", "regimes", 18, f"quick sweep x {f2.regime_samples // q2.regime_samples} (samples)",
        qs("02-provable-mha", "regimes") * f2.regime_samples / q2.regime_samples, "no (minutes)")
    n_lim = len(f2.limit_dims) * len(f2.limit_ks) * f2.limit_instances
    n_lim_q = len(q2.limit_dims) * len(q2.limit_ks) * q2.limit_instances
    fl = 2 ** (max(f2.limit_ks) * (max(f2.limit_dims) - max(q2.limit_dims)))
    row("02", "limit", n_lim, f"quick sweep x {n_lim}/{n_lim_q} points x {fl} (2^(k d) inputs "
        "enumerated at the largest d): an upper bound",
        qs("02-provable-mha", "limit") * n_lim / n_lim_q * fl, "no")

    # chapter 3
    per_theory = bench3["ours_cpu_s_per_point_single"]
    n_grid = 25 * 25 * 2
    row("03", "theory-grid (the 25 x 25 (alpha, omega) grid, both branches)", n_grid,
        f"committed solver benchmark: {per_theory:.2f} CPU s a point (single); points that fail "
        "are solved again from their neighbours: a lower bound", n_grid * per_theory,
        "no (scalar fixed points)", stored="yes")
    for kind, what in (("c", "multi-start, rules up to 14^4"), ("l", "semantic branch, rules up to 12^4")):
        quick_s = qs("03-positional-semantic", f"alpha-{kind}")
        row("03", f"alpha-{kind} (25 omegas; {what})", 25,
            "quick sweep (12 omegas) x 25/12; the full bracketing tolerance is half as wide and "
            "the rules larger: a lower bound", quick_s * 25 / 12, "no", stored="yes")
    if "ch3-gd" in probes and "per_seed_step_s" in probes["ch3-gd"]:
        g = probes["ch3-gd"]
        c25, c1 = g["per_seed_step_s"]["25 omegas"], g["per_seed_step_s"]["one omega"]
        alphas = np.linspace(0.01, 2.0, 25)
        probe_txt = (f"probe: GD at d = 1000, one alpha, a block of {g['seeds']} seeds, both inits: "
                     f"{{:.3f}} CPU s a seed and step at alpha = 1, {{:.3f}} at alpha = 2 (a power of "
                     f"alpha between), x 5000 steps x 24 seeds x the 25 alphas, + the test set "
                     f"({g['test_s_per_seed']:.1f} s a seed and alpha)")
        phase = ch3_gd_cost(g, "25 omegas", alphas, 24)
        row("03", "gd-phase (d = 1000, 25 x 25 grid, 24 seeds)", 25 * 25 * 2 * 24,
            probe_txt.format(c25["1.0"], c25["2.0"]).replace("GD at", "GD, 25 omegas at"),
            phase, "yes (dense d = 1000 products)", stored="yes")
        one = ch3_gd_cost(g, "one omega", alphas, 24)
        row("03", "gd-omega03 (d = 1000, 25 alphas, 24 seeds)", 25 * 2 * 24,
            probe_txt.format(c1["1.0"], c1["2.0"]).replace("GD at", "GD, omega = 0.3 alone, at"),
            one, "yes", stored="yes")
        ds = np.array([10, 15, 23, 36, 56, 87, 135, 209, 323, 500])
        row("03", "gd-scaling (10 d <= 500, 70 seeds)", len(ds) * 70 * 2,
            "gd-omega03 probe per seed and step at alpha = 1.5 x (d/1000)^2 x 5000 steps x 70 seeds",
            c1["1.0"] * 1.5 ** math.log2(c1["2.0"] / c1["1.0"]) * 5000 * 70
            * float(((ds / 1000) ** 2).sum()), "yes", stored="yes")
        # four (sigma, lambda) settings beside the main one (gd-phase's omega = 0.3 column), each
        # like gd-omega03; lambda = 0.001 runs 0.01 / 0.001 = 10x the steps
        row("03", "gd-sigma-lambda (d = 1000, 4 settings of sigma or lambda, 25 alphas, 24 seeds)",
            4 * 25 * 2 * 24, "gd-omega03 x (3 settings + 10 x the steps at lambda = 0.001)",
            one * 13, "yes", stored="yes")
        row("03", "gd-generic (d = 100 runs; alternative-A grid at d = 1000, 25 x 25, 24 seeds)", 4,
            "gd-phase (the alternative-A grid has its sizes) + quick sweep x 140/8 seeds x "
            "2500/1500 steps (the d = 100 runs)",
            phase + qs("03-positional-semantic", "gd-generic") * 140 / 8 * 2500 / 1500, "yes",
            stored="yes")
    row("03", "histogram (trained attention layer)", 2, "quick sweep x 2.5 (sequences) x 2.5 "
        "(epochs), batch 32 instead of 128: a lower bound",
        qs("03-positional-semantic", "histogram") * 2.5 * 2.5, "yes")

    # chapter 4
    mk = bench4["markov"]
    per_markov = mk["ours_cpu_s"] / len(mk["points"])
    row("04", "hmc-theory (Markov task theory, 10 draws x 7 widths)", 70,
        f"committed solver benchmark: {per_markov:.2f} CPU s a point", 70 * per_markov, "no")
    row("04", "two-path", 70, "as hmc-theory", 70 * per_markov, "no")
    hm = bench4["hmc"]
    fh4 = (8 / hm["chains"]) * (1000 / (hm["warmup"] + hm["samples"])) * (30 / hm["leapfrog"])
    row("04", "hmc-sampling (N = 10, 30, 100)", 3, f"committed HMC benchmark at N = 10: "
        f"{hm['cpu_s']:.1f} CPU s, x {fh4:.0f} (chains, iterations, leapfrog steps) x sum(N)/10, "
        "assuming cost ~ N", hm["cpu_s"] * fh4 * (10 + 30 + 100) / 10, "yes")
    im = bench4["images"]
    row("04", "glyphs-theory (10 widths x 10 temperatures, and the GP limit; one network)", im["n_grid"],
        f"committed benchmark: {im['ours_cpu_s_per_point']:.0f} CPU s a point at P = {im['P']}",
        im["ours_cpu_s_grid_estimated"], "yes")
    from attnlib import paths as ap

    icfg = ap.IMAGE_PROFILES["full"]
    seeds, temps, n_prune = 8, 10, 10_000  # the chapter's full profile
    if "ch4-images" in probes:
        pi = probes["ch4-images"]
        n_ep = icfg.n_pool + icfg.n_val + icfg.n_test + n_prune
        per_seed = icfg.gd_steps * pi["step_s"] + temps * pi["solve_N10_s"]
        row("04", "glyphs-pruning (8 seeds: train, theory at N = 10, prune)", seeds,
            f"probe: {pi['step_s']:.2f} CPU s an Adam step of one width-{icfg.width} network (batch "
            f"{icfg.gd_batch}) x {icfg.gd_steps} steps + {temps} solves at N = 10 ({pi['solve_N10_s']:.0f} "
            f"CPU s each), a seed, x {seeds} seeds; + {n_ep} episodes drawn "
            f"({pi['episodes_s_per_1000']:.2f} CPU s per 1000); the pruning itself is not timed. The "
            "probe solves on the features of a network after 105 steps, slower to solve than a trained "
            f"network's{_solves_of_trained_net()}: the solves are overestimated",
            seeds * per_seed + n_ep / 1000 * pi["episodes_s_per_1000"], "yes (network training)")
    return rows


def _solves_of_trained_net() -> str:
    """The stored glyphs-theory run's CPU time of the 10 solves at N = 10, as a phrase ("" if none)."""
    import pandas as pd

    path = ROOT / "results" / "04-attention-paths" / "glyphs-theory.csv"
    if not path.exists():
        return ""
    df = pd.read_csv(path, usecols=["N", "elapsed_s"])
    at10 = df[df.N == 10].elapsed_s
    return f" (the stored glyphs-theory run: {at10.sum():.0f} CPU s for its {len(at10)} solves at N = 10)"


def _fmt_s(s) -> str:
    if s is None:
        return "?"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def stored_record(r: dict) -> dict | None:
    """Provenance record of the stored ``results/<chapter>/<table>.csv`` of row ``r``, if any."""
    from attnbook.store import StoredResultError, load_result

    path = ROOT / "results" / CHAPTERS.get(r["chapter"], "?") / f"{r['table'].split(' ')[0]}.csv"
    if not path.exists():
        return None
    try:
        return load_result(path)[1]
    except StoredResultError:
        return None


def stored_cell(r: dict) -> str:
    """The last column: stored (measured wall time, device, date), not yet, or not stored by design."""
    parts = PARTS.get((r["chapter"], r["table"].split(" ")[0]))
    if parts:
        name = r["table"].split(" ")[0]
        recs = {N: stored_record(dict(r, table=f"{name}-N{N}")) for N in parts}
        done = [N for N, rec in recs.items() if rec is not None]
        if not done:
            return "not yet"
        first = recs[done[0]]
        wall = sum(recs[N]["wall_s"] for N in done)
        rest = [N for N in parts if N not in done]
        return (f"**stored** at N = {', '.join(map(str, done))} (one table per width): runs took "
                f"{_fmt_s(wall)} wall time ({first['device_name']}, {first['date']})"
                + (f"; N = {', '.join(map(str, rest))} not yet" if rest else ""))
    rec = stored_record(r)
    if rec is not None:  # "partial": a table stored with fewer points than the full profile's
        return (f"**stored**: run took {_fmt_s(rec['wall_s'])} wall time ({rec['device_name']}, "
                f"{rec['date']})" + (f"; {rec['partial']}" if rec.get("partial") else "")
                + (f"; in parts: {rec['resumed']}" if rec.get("resumed") else ""))
    if r["stored"].startswith("yes"):
        return "not yet" + r["stored"][3:]
    return r["stored"]


def measured_cells(r: dict, measured: dict) -> str:
    """Measured CPU time of the table (all its parts: a table stored per width sums them)."""
    chapter = CHAPTERS.get(r["chapter"], "?")
    name = r["table"].split(" ")[0]
    parts = {k: v for k, v in measured.get(chapter, {}).items() if k == name or k.startswith(name + "-N")}
    if not parts:  # stored by a run whose CPU time was not recorded, or not run
        return "not recorded" if stored_cell(r).startswith("**stored**") else "not run"
    total = sum(v["cpu_s"] for v in parts.values())
    what = f" ({len(parts)} of its parts)" if len(parts) > 1 else ""
    if any(v.get("partial") for v in parts.values()):  # a run stopped before the table was done
        return f"at least {_fmt_s(total)} (stopped: {'; '.join(v['partial'] for v in parts.values())})"
    untimed = [v["untimed"] for v in parts.values() if v.get("untimed")]  # an earlier run's points
    if untimed:
        return f"at least {_fmt_s(total)} ({'; '.join(untimed)})"
    return f"{_fmt_s(total)}{what}"


def markdown(rows: list[dict], meta: dict) -> str:
    measured = json.loads(MEASURED.read_text()) if MEASURED.exists() else {}
    lines = ["| chapter | table | points | estimated CPU time (1 core) | basis | GPU worthwhile "
             "| measured CPU time | stored in `results/` |",
             "| --- | --- | ---: | ---: | --- | --- | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['chapter']} | {r['table']} | {r['points']} | {_fmt_s(r['cpu_s'])} | "
                     f"{r['basis']} | {r['gpu']} | {measured_cells(r, measured)} | {stored_cell(r)} |")
    by = {}
    for r in rows:
        by[r["chapter"]] = by.get(r["chapter"], 0) + (r["cpu_s"] or 0)
    total = " · ".join(f"chapter {c}: {_fmt_s(s)}" for c, s in by.items())
    dates = meta.get("probe_dates") or {}
    when = (", ".join(f"{', '.join(sorted(n for n, d in dates.items() if d == day))} on {day}"
                      for day in sorted(set(dates.values()))) if dates else meta["date"])
    lines += ["", f"Sum of the estimates per chapter: {total}. Probes measured on "
              f"{meta['machine']} ({meta['cpu_count']} cores, shared with other jobs), one thread: "
              f"{when}; `benchmarks/full_cost.py` (numbers and bases in "
              "`benchmarks/results/full_cost.json`)."]
    return "\n".join(lines) + "\n"


def _record_measured(chapter: str, table: str, cpu_s: float, wall_s: float, how: str,
                     partial: str | None = None, replaces: tuple = (), untimed: str | None = None) -> None:
    """Record the measured cost of ``table`` in ``full_runs.json``; ``replaces``: entries of the
    chapter that this one supersedes (the per-width parts of a table now measured as a whole);
    ``untimed``: what of the table an earlier run computed (the cost is then a lower bound)."""
    measured = json.loads(MEASURED.read_text()) if MEASURED.exists() else {}
    for old in replaces:
        measured.get(chapter, {}).pop(old, None)
    measured.setdefault(chapter, {})[table] = {
        "cpu_s": round(cpu_s, 1), "wall_s": None if wall_s is None else round(wall_s, 1), "how": how,
        **({"partial": partial} if partial else {}), **({"untimed": untimed} if untimed else {}),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared with other jobs"}
    MEASURED.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")


def _cpu_tree() -> float:
    """CPU seconds (user + system) of this process and its live descendants (Dask workers)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def call_of(name: str):
    """The call that stores table ``name`` in a chapter's code (``ab.stored_sweep``,
    ``ab.stored_or_compute``, or chapter 3's ``cached``, which wraps the latter)."""
    return re.compile(r'(stored_(sweep|or_compute)|\bcached)\(\s*(#[^\n]*\n\s*)?(run,\s*)?f?"'
                      + re.escape(name) + '"')


def bound_names(tree) -> set[str] | None:
    """Every name a piece of code binds (assignments, imports, defs, arguments, loop and
    comprehension targets, at any depth); ``None`` when it star-imports (its names are unknown)."""
    import ast

    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    return None
                out.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
    return out


def free_names(tree) -> set[str]:
    """Names a piece of code reads but never binds itself (it needs them from outside)."""
    import ast
    import builtins

    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - (bound_names(tree) or set()) - set(dir(builtins))


def _definer(cells: list[str], name: str) -> str:
    """Where in a chapter ``name`` is bound at top level: for the error message."""
    import ast

    for i, src in enumerate(cells):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for st in tree.body:
            if name in (bound_names(ast.Module(body=[st], type_ignores=[])) or set()):
                first = (ast.get_source_segment(src, st) or "").splitlines()[0][:70]
                return f"code cell {i}: `{first}`"
    return "no cell of the chapter"


def plan_tables(chapter: str, names: list[str], defs: tuple = (), extra: tuple = ()):
    """The code ``store`` runs for tables ``names`` of ``chapter``, checked before any of it runs.

    Returns ``(setup, segments)``: the parameter and set-up cells and the cells defining ``defs``
    (source text, in order), and per table the statements of its cell up to the call that stores
    it. A function defined in a named table's own cell, before the call that stores the table, is
    left to that table's statements (its entry in ``setup`` is empty): run whole as a set-up cell,
    the cell would compute the table before its cost is measured. ``extra``: more set-up
    statements (source text), run after the ``defs`` cells. Raises
    ``SystemExit`` when a table has no unique storing cell, or when its statements use a
    name that neither the set-up cells nor the tables named before it bind (that error would
    otherwise surface only after the earlier tables had been computed).
    """
    import ast

    import jupytext

    path = ROOT / "chapters" / f"{chapter}.md"
    if not path.exists():
        raise SystemExit(f"no chapter {chapter!r} (chapters/{chapter}.md)")
    code_cells = [c for c in jupytext.read(path).cells if c.cell_type == "code"]
    cells = [c.source for c in code_cells]
    first = next(i for i, c in enumerate(code_cells) if "parameters" in c.metadata.get("tags", []))
    targets = {}
    for name in names:
        hits = [i for i, src in enumerate(cells) if call_of(name).search(src)]
        if len(hits) != 1:
            raise SystemExit(f"{chapter}: {len(hits)} cells store a table {name!r} (need exactly one)")
        targets[name] = hits[0]
    def storing_statement(name: str, i: int) -> tuple[ast.Module, int]:
        tree = ast.parse(cells[i])
        return tree, next(k for k, st in enumerate(tree.body)
                          if call_of(name).search(ast.get_source_segment(cells[i], st) or ""))

    setup = [cells[first], cells[first + 1]]
    for fn in defs:
        hits = [i for i, src in enumerate(cells) if re.search(rf"^def {re.escape(fn)}\(", src, re.M)]
        if len(hits) != 1:
            raise SystemExit(f"{chapter}: {len(hits)} cells define {fn!r} (need exactly one)")
        in_segment = False
        for name, i in targets.items():
            if i == hits[0]:
                tree, upto = storing_statement(name, i)
                in_segment |= any(isinstance(st, ast.FunctionDef) and st.name == fn
                                  for st in tree.body[:upto])
        setup.append("" if in_segment else cells[hits[0]])
    setup.extend(extra)
    known: set[str] | None = {"profile", "scheduler"}  # set by store itself
    for src in setup:
        b = bound_names(ast.parse(src))
        known = None if (b is None or known is None) else known | b
    segments = {}
    for name, i in targets.items():
        tree, upto = storing_statement(name, i)
        segments[name] = ast.Module(body=tree.body[: upto + 1], type_ignores=[])
        if known is None:  # a set-up cell star-imports: its names are unknown, nothing to check
            continue
        missing = sorted(free_names(segments[name]) - known)
        if missing:
            where = "; ".join(f"{m} is bound in {_definer(cells, m)}" for m in missing)
            raise SystemExit(
                f"{chapter}/{name}: its cell uses {', '.join(missing)}, which neither the parameter, "
                f"set-up and --defs cells nor the tables named before it define ({where}). Name the "
                "table whose cell binds it first, or the function with --defs.")
        known |= bound_names(segments[name]) or set()
    return setup, segments


def _first_points(ab, k: int, names) -> dict:
    """Make the sweeps of tables ``names``, and their store keys, hold only the first ``k`` points.

    Patches ``ab.sweep`` and ``ab.stored_or_compute`` in this process (``store --points``); the
    returned dict receives the number of points the chapter asked for (``"of"``). Other tables
    that the cells compute on the way (chapter 4's ``glyphs-theory`` before ``glyphs-pruning``)
    keep all their points and their own key.
    """
    sweep, stored = ab.sweep, ab.stored_or_compute
    asked: dict = {}
    inside: list[str] = []  # the named table being computed, if any

    def sweep_k(fn, points, *args, **kw):
        if not inside:
            return sweep(fn, points, *args, **kw)
        points = list(points)
        asked["of"] = len(points)
        return sweep(fn, points[:k], *args, **kw)

    def stored_k(run, name, compute, params, **kw):
        if name not in names:
            return stored(run, name, compute, params, **kw)
        # a table keyed by its points keeps the first k; one keyed by what it is computed from
        # (chapter 3's: alphas, omegas, configuration) says how many of its points it holds
        key = (dict(params, points=list(params["points"])[:k]) if "points" in params
               else dict(params, first_points=k))

        def compute_k():
            inside.append(name)
            try:
                return compute()
            finally:
                inside.pop()

        return stored(run, name, compute_k, key, **kw)

    ab.sweep, ab.stored_or_compute = sweep_k, stored_k
    return asked


def _plain(value):
    """A point's or a stored cell's value as compared by :func:`_seed_checkpoint`: integral
    floats as ints (a CSV column with a missing cell reads its integers back as floats)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _seed_checkpoint(path: Path, points: list[dict], table: Path) -> int:
    """Write the points of the stored partial ``table`` into the sweep checkpoint ``path``.

    A table stored by ``store --points`` is its sweep's output: one row (or several) per point,
    the point's fields followed by what the point returned. Each point of ``points`` that is
    not yet in the checkpoint and whose fields match stored rows gets those rows as its result,
    so the sweep computes only the others. Returns the number of points the sweep will not
    compute: those written and those its checkpoint already held (a stopped run's). A table that
    older code produced is refused: its points would be mixed with the current code's.
    """
    from attnbook.checkpoints import checkpoint_line
    from attnbook.store import code_changes, load_result
    from attnbook.sweeps import _key, _read_done

    df, record = load_result(table)
    changed = code_changes(record)
    if changed:
        raise SystemExit(f"{table}: stored by code that has changed since ({', '.join(changed)}); "
                         "its points cannot be resumed: move it aside and compute the table again")
    done = _read_done(path)
    stored: dict[tuple, dict[str, list[dict]]] = {}  # point fields -> point key -> rows
    lines, already = [], 0
    for point in points:
        if _key(point) in done:
            already += 1
            continue
        fields = tuple(point)
        if not set(fields) <= set(df.columns):
            continue
        if fields not in stored:
            by_point: dict[str, list[dict]] = {}
            for rec in df.to_dict("records"):
                rec = {c: (None if isinstance(v, float) and math.isnan(v) else v) for c, v in rec.items()}
                at = _key(_plain({f: rec[f] for f in fields}))
                by_point.setdefault(at, []).append({c: v for c, v in rec.items() if c not in fields})
            stored[fields] = by_point
        rows = stored[fields].get(_key(_plain(point)))
        if rows:
            lines.append(checkpoint_line(point, rows))
    if lines:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            fh.writelines(lines)
    return len(lines) + already


def _checkpoint_of(fn, args: tuple, kw: dict) -> tuple[str | None, Path | None]:
    """The name and checkpoint file of a call ``ab.sweep(fn, points, *args, **kw)`` (its
    arguments after ``fn`` and ``points``); no file when it names neither a run nor a path."""
    import inspect

    from attnbook.sweeps import _checkpoint_path, sweep

    bound = inspect.signature(sweep).bind_partial(None, None, *args, **kw).arguments
    name, run, path = bound.get("name"), bound.get("run"), bound.get("path")
    return name, (None if path is None and run is None else _checkpoint_path(name, run, path, fn))


def _count_checkpointed(ab) -> dict[str, int]:
    """Patch ``ab.sweep`` in this process to count, per sweep, the points its checkpoint already
    holds when it starts (a stopped run's, or a run's whose table was then moved aside): the sweep
    takes them from there, so their time is not in this run's measurement."""
    from attnbook.sweeps import _key, _read_done

    sweep = ab.sweep
    found: dict[str, int] = {}

    def sweep_counted(fn, points, *args, **kw):
        points = [dict(p) for p in points]
        name, path = _checkpoint_of(fn, args, kw)
        if path is not None:
            done = _read_done(path)
            found[name] = found.get(name, 0) + sum(_key(p) in done for p in points)
        return sweep(fn, points, *args, **kw)

    ab.sweep = sweep_counted
    return found


def _resume_from_stored(ab, tables: dict[str, Path]) -> dict:
    """Make each sweep named like a stored partial table start from that table's points.

    Patches ``ab.sweep`` in this process (``store`` of a table whose stored copy is partial): the
    points it already holds are written into the sweep's checkpoint first (:func:`_seed_checkpoint`),
    so a table computed in parts, on machines that keep nothing but ``results/``, is finished
    without recomputing them. The returned dict receives, per table, the points taken over.
    """
    sweep = ab.sweep
    seeded: dict[str, int] = {}

    def sweep_resumed(fn, points, *args, **kw):
        points = [dict(p) for p in points]
        name, path = _checkpoint_of(fn, args, kw)
        if name in tables and path is not None:
            seeded[name] = _seed_checkpoint(path, points, tables[name])
        return sweep(fn, points, *args, **kw)

    ab.sweep = sweep_resumed
    return seeded


def _reseal(path: Path, **changes) -> None:
    """Rewrite a stored table's record with ``changes`` (``None`` drops a field), sealed again."""
    from attnbook.store import load_result, save_result

    df, record = load_result(path)
    record = {k: v for k, v in dict(record, **changes).items() if v is not None}
    save_result(df, path, {key: v for key, v in record.items() if key not in ("sha256", "json_columns")})


def _mark_partial(path: Path, k: int, of: int, wall_s: float | None) -> str:
    """Reseal a table stored by ``store --points`` with what it holds, and the run's wall time."""
    note = f"the first {k} of the full profile's {of} points"
    _reseal(path, partial=note, **({"wall_s": round(wall_s, 3)} if wall_s else {}))
    return note


def _table_files(chapter: str, name: str) -> list[Path]:
    """The CSV files of stored table ``name``. A name with a ``{field}`` (``hmc-sampling-N{N}``:
    one cell stores a table per width) stands for every stored table it matches."""
    folder = ROOT / "results" / chapter
    if "{" not in name:
        return [folder / f"{name}.csv"]
    pattern = re.compile(re.sub(r"\\\{[^}]*\\\}", "[^-/]+", re.escape(name)) + r"\.csv")
    return sorted(p for p in folder.glob("*.csv") if pattern.fullmatch(p.name))


def _measured_name(name: str) -> str:
    """The cost table's name of table ``name``: ``hmc-sampling`` for ``hmc-sampling-N{N}``."""
    return re.sub(r"-?[A-Za-z_]*\{.*$", "", name)


def store_tables(chapter: str, names: list[str], scheduler: str, defs: tuple = (),
                 points: int | None = None, wall_s: float | None = None) -> None:
    """Compute and store tables ``names`` of ``chapter``'s full profile with the chapter's own code.

    ``defs``: names of functions defined in other cells that the tables' cells use; the whole cell
    that defines each is executed first (unless it is a named table's own cell). A name with a
    ``{field}`` stores every table its cell stores (:func:`_table_files`), measured as one.
    Everything is checked (:func:`plan_tables`) before any of the chapter's code runs.
    ``points``: store only the first ``points`` points of each table (its record says so,
    ``partial``; a ``full`` run, whose key holds every point, recomputes it).
    Points already in the sweep's checkpoint, of a run that was stopped, are taken from it; then
    ``wall_s`` gives the wall time of that run, for the record.
    """
    if points is not None and points < 1:
        raise SystemExit(f"--points {points}: must be at least 1")
    if points is not None and any("{" in name for name in names):
        raise SystemExit(f"--points: not for tables named by a pattern ({', '.join(names)})")
    setup, segments = plan_tables(chapter, names, defs)
    ns: dict = {}
    exec(compile(setup[0], f"{chapter}[parameters]", "exec"), ns)
    ns.update(profile="full", scheduler=scheduler)
    exec(compile(setup[1], f"{chapter}[set-up]", "exec"), ns)
    checkpointed = _count_checkpointed(ns["ab"])
    asked = _first_points(ns["ab"], points, segments) if points else {}
    partial = {}  # stored partial tables: resumed from, then stored again with the points added
    earlier = {}  # their records: the wall time they took already
    for name in segments:
        path = ROOT / "results" / chapter / f"{name}.csv"
        if path.exists():
            record = json.loads(path.with_suffix(".provenance.json").read_text())
            if record.get("partial"):
                partial[name], earlier[name] = path, record
    seeded = _resume_from_stored(ns["ab"], partial) if partial else {}
    for fn, src in zip(defs, setup[2:], strict=True):
        exec(compile(src, f"{chapter}[def {fn}]", "exec"), ns)
    for name, code in segments.items():
        stored = ROOT / "results" / chapter / f"{name}.csv"
        # a stored whole table is loaded (a later table's cell may need its names); a partial one
        # is computed again from its points (its key holds fewer points) and the rest
        was = {p: p.stat().st_mtime_ns for p in _table_files(chapter, name) if p.exists()}
        n0 = sum(checkpointed.values())
        c0, t0 = _cpu_tree(), time.perf_counter()
        exec(compile(code, f"{chapter}[{name}]", "exec"), ns)
        cpu, wall = _cpu_tree() - c0, time.perf_counter() - t0
        written = [p.stem for p in _table_files(chapter, name)
                   if p.exists() and was.get(p) != p.stat().st_mtime_ns]
        before = not written
        print(f"{chapter}/{name}: {cpu:.1f} CPU s, {wall:.1f} s wall; "
              f"{'loaded' if before else 'stored: ' + ', '.join(written)}", flush=True)
        how = f"full_cost.py store, scheduler={scheduler}" + (f", --points {points}" if points else "")
        reused = sum(checkpointed.values()) - n0
        untimed = None
        if reused and name not in partial and not before:
            untimed = f"{reused} points taken from the sweep checkpoint of an earlier run, not timed"
            print(f"{chapter}/{name}: {untimed}", flush=True)
        if name in partial:  # the run's time adds to that of the run that stored the partial table
            taken = seeded.get(name, 0)
            print(f"{chapter}/{name}: {taken} points taken over from the stored partial table "
                  "or the sweep's checkpoint", flush=True)
            before_s = earlier[name].get("wall_s") or 0.0
            wall_s = (wall_s or 0.0) + before_s + wall
            _reseal(stored, wall_s=round(wall_s, 3),
                    resumed=f"{taken} points from earlier runs (the partial table of "
                            f"{earlier[name].get('date')}: {earlier[name]['partial']}, {before_s:.0f} s "
                            "wall; or the sweep's checkpoint), the rest in this run")
            last = json.loads(MEASURED.read_text()).get(chapter, {}).get(name) if MEASURED.exists() else None
            if last:
                cpu, wall = cpu + last["cpu_s"], wall + (last.get("wall_s") or 0.0)
                how = f"{last['how']}; resumed by {how}"
        if not before and points:
            note = _mark_partial(stored, points, asked.get("of", points), wall_s)
            print(f"{chapter}/{name}: {note}", flush=True)
        if not before:
            if "{" in name:
                how += f" (one run for {', '.join(written)})"
            _record_measured(chapter, _measured_name(name), cpu, wall, how,
                             partial=None if not points else f"{points} of {asked.get('of')} points",
                             replaces=tuple(written) if "{" in name else (), untimed=untimed)


def recompute_slice(chapter: str, name: str, pick, defs: tuple = (), shrink: dict | None = None,
                    pre: str | None = None, call: str | None = None, cell: str | None = None,
                    workdir: Path | None = None):
    """Recompute a few points of the stored table ``name`` with the chapter's current code.

    Runs what ``store`` runs for the table (:func:`plan_tables`), in this process, but its sweep
    evaluates only the points ``pick(points)`` returns (their indices in the table's list of
    points), with the fields in ``shrink`` replaced (a shorter list of a nested parameter, such
    as the head counts of one stream of draws, whose rows are a subset of the full point's), into
    a fresh checkpoint under ``workdir``. Nothing is loaded from or written to ``results/``: the
    table's own ``stored_or_compute`` computes, and another table its code needs is read from
    ``results/`` (or left empty).

    A table whose cell does not name it literally is found by ``cell``, the format string that
    names it there (``"hmc-sampling-N{N}"``), or computed by ``call``, a statement run after the
    set-up and ``defs`` cells. ``pre``: statements run before the table's code (the assignments of
    a cell whose other work the table does not need).

    Returns ``(fresh, stored, chosen)``: the table the chapter's code makes of the chosen points,
    the stored table (verified, :func:`attnlib._store.load_result`) and the chosen points.
    """
    import ast
    import tempfile

    import pandas as pd

    from attnbook.store import load_result

    stored, _ = load_result(ROOT / "results" / chapter / f"{name}.csv")
    setup, segments = plan_tables(chapter, [] if call else [cell or name], defs, (pre,) if pre else ())
    code = ast.parse(call) if call else segments[cell or name]
    workdir = Path(workdir or tempfile.mkdtemp(prefix="slice-"))
    ns: dict = {}
    exec(compile(setup[0], f"{chapter}[parameters]", "exec"), ns)
    ns.update(profile="full", scheduler=None)
    exec(compile(setup[1], f"{chapter}[set-up]", "exec"), ns)
    ab = ns["ab"]
    sweep, stored_or_compute = ab.sweep, ab.stored_or_compute
    chosen: list[dict] = []
    fresh: list[pd.DataFrame] = []

    def sweep_slice(fn, points, *args, **kw):
        points = [dict(p) for p in points]
        idx = list(pick(points))
        if not idx:
            raise ValueError(f"{chapter}/{name}: the slice picks none of its {len(points)} points")
        picked = [dict(points[i], **(shrink or {})) for i in idx]
        chosen.extend(picked)
        kw = dict(kw, path=workdir / f"{name}.jsonl", scheduler=None, progress=False)
        return sweep(fn, picked, *args, **kw)

    def compute_only(run, table, compute, params, **kw):
        if table != name:
            other = ROOT / "results" / chapter / f"{table}.csv"
            df = load_result(other)[0] if other.exists() else pd.DataFrame()
        elif fresh:  # computed already (by a set-up cell that the call repeats)
            df = fresh[-1]
        else:
            ab.sweep = sweep_slice
            try:
                df = compute()
            finally:
                ab.sweep = sweep
            fresh.append(df)
        df.attrs.update(provenance={"stored": table != name, "stale": False}, note="")
        return df

    ab.stored_or_compute = compute_only
    try:
        for fn, src in zip((*defs, *(["pre"] if pre else [])), setup[2:], strict=True):
            exec(compile(src, f"{chapter}[{fn}]", "exec"), ns)
        exec(compile(code, f"{chapter}[{name}]", "exec"), ns)
    finally:
        ab.stored_or_compute = stored_or_compute
    if not chosen or not fresh:
        raise ValueError(f"{chapter}/{name}: its code computed no table of the chosen points")
    return fresh[-1], stored, chosen


def _close(a, b, rtol: float, atol: float) -> bool:
    """Stored and recomputed cells equal: numbers (and lists of them) within tolerance, else equal."""
    if isinstance(a, str) or isinstance(b, str):
        return str(a) == str(b)
    if a is None or b is None:
        return (a is None or a != a) and (b is None or b != b)  # None and NaN both mean "none"
    try:
        x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    except (TypeError, ValueError):
        return _plain(a) == _plain(b)
    return x.shape == y.shape and bool(np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True))


def _is_time(column: str) -> bool:
    """A column of wall times, which differ from run to run."""
    return column == "seconds" or column.endswith("_s")


def compare_slice(fresh, stored, chosen: list[dict], on: tuple = (), ignore: tuple = (),
                  rtol: float = 1e-6, atol: float = 1e-9,
                  tol: dict | None = None) -> tuple[int, list[str]]:
    """Compare recomputed rows with the stored rows of the same points.

    Rows are matched on the chosen points' fields that both tables hold, plus ``on``; the rows
    of one key are compared in order, every shared column except ``ignore`` and the wall times
    (``seconds`` and columns ending in ``_s``, such as each point's ``elapsed_s``), within
    ``rtol``, ``atol``, or the ``(rtol, atol)`` that ``tol`` gives a column. Returns
    ``(cells compared, differences)``, each difference naming the key, the column and both values.
    """
    keys = sorted({f for p in chosen for f in p if f in fresh.columns and f in stored.columns
                   and f not in ignore} | set(on))
    if not keys:
        raise ValueError("no column identifies the recomputed rows in the stored table")
    cols = [c for c in fresh.columns if c in stored.columns and c not in keys and c not in ignore
            and not _is_time(c)]

    from attnbook.sweeps import _key

    def groups(df) -> dict[str, tuple[dict, list[dict]]]:
        out: dict = {}
        for rec in df.to_dict("records"):
            at = {k: _plain(rec[k]) for k in keys}
            out.setdefault(_key(at), (at, []))[1].append(rec)
        return out

    have = groups(stored)
    n, diffs = 0, []
    for key, (at, rows) in groups(fresh).items():
        old = have.get(key, (at, []))[1]
        if len(old) != len(rows):
            diffs.append(f"{at}: {len(rows)} rows recomputed, {len(old)} stored")
            continue
        for new_row, old_row in zip(rows, old, strict=True):
            for c in cols:
                n += 1
                if not _close(new_row[c], old_row[c], *(tol or {}).get(c, (rtol, atol))):
                    diffs.append(f"{at} {c}: stored {old_row[c]!r}, now {new_row[c]!r}")
    return n, diffs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe")
    p.add_argument("names", nargs="+", choices=sorted(PROBE))
    sub.add_parser("report")
    sub.add_parser("table")
    st = sub.add_parser("store")
    st.add_argument("chapter")
    st.add_argument("names", nargs="+")
    st.add_argument("--scheduler", default="local:1")
    st.add_argument("--defs", nargs="*", default=[], help="functions from other cells the tables need")
    st.add_argument("--points", type=int, default=None,
                    help="store only the first POINTS points of each table (a partial table)")
    st.add_argument("--wall-s", type=float, default=None,
                    help="with --points: wall time of the stopped run whose checkpoint holds them")
    me = sub.add_parser("measured")
    me.add_argument("chapter")
    me.add_argument("name")
    me.add_argument("cpu_s", type=float)
    me.add_argument("--wall-s", type=float, default=None)
    me.add_argument("--how", default="whole-chapter full run (serial), CPU of its process tree "
                                     "sampled every 10 s")
    me.add_argument("--partial", default=None,
                    help="the run was stopped before the table was done: what it finished")
    args = parser.parse_args(argv)
    if args.cmd == "store":
        store_tables(args.chapter, args.names, args.scheduler, tuple(args.defs), args.points,
                     args.wall_s)
        return 0
    if args.cmd == "measured":
        _record_measured(args.chapter, args.name, args.cpu_s, args.wall_s, args.how, args.partial)
        return 0
    torch.set_num_threads(1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    probes = json.loads(PROBES.read_text()) if PROBES.exists() else {}
    if args.cmd == "probe":
        for name in args.names:
            probes[name] = {**PROBE[name](),
                            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")}
            PROBES.write_text(json.dumps(probes, indent=1) + "\n")
        return 0
    if args.cmd == "table":  # re-render from the committed estimates and what results/ holds now
        saved = json.loads(OUT.read_text())
        for r in saved["rows"]:
            if r["table"].split(" ")[0] in STORES.get(r["chapter"], ()):
                r["stored"] = "yes"
        OUT.write_text(json.dumps(saved, indent=1) + "\n")
        TABLE.write_text(markdown(saved["rows"], saved["provenance"]))
        print(TABLE.read_text())
        return 0
    from attnbook.runs import git_commit
    from attnlib import __version__

    # the quick build's sweep times: from this machine's build, else those the last report used
    quick, quick_from = quick_sweeps(), "the quick build on the same machine"
    if not quick and OUT.exists():
        quick, quick_from = json.loads(OUT.read_text())["quick"], "the quick build the last report read"
    meta = {"script": "benchmarks/full_cost.py", "attnlib_version": __version__, "git_commit": git_commit(),
            "torch_version": torch.__version__, "threads": 1, "machine": platform.machine(),
            "cpu_count": os.cpu_count(), "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
            # each probe's own date (probes before dates were kept: the date of the report they last
            # entered, 2026-12-02)
            "probe_dates": {name: pr.get("date", "2026-12-02") for name, pr in probes.items()},
            "note": "CPU seconds of single-threaded probes on a machine shared with other jobs; quick "
                    f"sweep times are wall seconds of {quick_from}"}
    rows = estimates(probes, quick)
    OUT.write_text(json.dumps({"rows": rows, "probes": probes, "quick": quick, "provenance": meta},
                              indent=1) + "\n")
    TABLE.write_text(markdown(rows, meta))
    print(TABLE.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
