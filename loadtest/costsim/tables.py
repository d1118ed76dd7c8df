#!/usr/bin/env python3
"""Runs thaw-costsim over traces and seeds and prints the Markdown tables of
docs/performance.md ("Cost simulation"), and how thaw fares against its target on each.

    loadtest/costsim/tables.py [--bin build/thaw-costsim] [--trace NAME:SEEDS ...]
                               [--summary NAME:SEEDS ...]

SEEDS is a comma list or a range (1-11). Defaults: full tables for fleet24:1,
bursty-batch:1 and large:1; summaries for fleet24:1-11, bursty-batch:1-5, large:1-3."""

import argparse
import json
import subprocess

TIERS = ["critical", "standard", "batch"]


def run(binary, trace, seed):
    out = subprocess.run([binary, "--trace", trace, "--seed", str(seed), "--json"],
                         capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def seeds_of(spec):
    if "-" in spec:
        a, b = spec.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in spec.split(",")]


def verdict(rows):
    """thaw against static and knative: fewer slice-hours than both, and per tier its SLO
    attainment minus the better of the two."""
    by = {r["policy"]: r for r in rows}
    t, base = by["thaw"], [by["static"], by["knative"]]
    hours = t["gpu_slice_hours"] < min(b["gpu_slice_hours"] for b in base)
    tiers = {k: t["tiers"][k]["slo_attainment"] - max(b["tiers"][k]["slo_attainment"]
                                                      for b in base) for k in TIERS}
    return hours, tiers


def table(rows):
    r0 = rows[0]
    print(f"Trace `{r0['trace']}`, seed {r0['seed']}: {r0['models']} models, "
          f"{r0['requests']:,} requests, {r0['gpus']} GPUs × {r0['slices_per_gpu']} slices, "
          f"$4 per GPU-hour.\n")
    print("| policy | tier | slice-hours | cost | cold starts | p50 wait | p99 wait | served "
          "| rejected | SLO met |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for k in TIERS:
            t = r["tiers"][k]
            print(f"| {r['policy']} | {k} | {t['gpu_slice_hours']:.0f} | ${t['cost_usd']:.0f} "
                  f"| {t['cold_starts']} | {t['p50_wait_ms'] / 1000:.0f} s "
                  f"| {t['p99_wait_ms'] / 1000:.0f} s | {t['served']:,} | {t['rejected']:,} "
                  f"| {100 * t['slo_attainment']:.2f}% |")
        print(f"| **{r['policy']}** | **all** | **{r['gpu_slice_hours']:.0f}** "
              f"| **${r['cost_usd']:.0f}** | | | | | | |")
    print()


def summary(binary, trace, seeds):
    print(f"Trace `{trace}`, seeds {seeds[0]}–{seeds[-1]}: slice-hours, and thaw's SLO "
          "attainment minus the better of static and knative, per tier (percentage points; "
          "negative: worse).\n")
    print("| seed | static | knative | thaw | thaw fewer | critical | standard | batch |")
    print("|---|---|---|---|---|---|---|---|")
    for s in seeds:
        rows = run(binary, trace, s)
        by = {r["policy"]: r for r in rows}
        hours, tiers = verdict(rows)
        print(f"| {s} | {by['static']['gpu_slice_hours']:.0f} "
              f"| {by['knative']['gpu_slice_hours']:.0f} | {by['thaw']['gpu_slice_hours']:.0f} "
              f"| {'yes' if hours else 'no'} | "
              + " | ".join(f"{100 * tiers[k]:+.2f}" for k in TIERS) + " |", flush=True)
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/thaw-costsim")
    ap.add_argument("--trace", action="append")
    ap.add_argument("--summary", action="append")
    a = ap.parse_args()
    for spec in a.trace or ["fleet24:1", "bursty-batch:1", "large:1"]:
        name, seeds = spec.split(":")
        for s in seeds_of(seeds):
            table(run(a.bin, name, s))
    for spec in a.summary or ["fleet24:1-11", "bursty-batch:1-5", "large:1-3"]:
        name, seeds = spec.split(":")
        summary(a.bin, name, seeds_of(seeds))


if __name__ == "__main__":
    main()
