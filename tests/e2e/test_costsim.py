"""thaw-costsim: reproducible, complete output (its figures are benchmarks, not tests)."""

import json
import os
import subprocess
import xml.dom.minidom

from conftest import ROOT

COSTSIM = os.path.join(os.path.dirname(os.environ.get("THAW_BIN", os.path.join(
    ROOT, "build", "thaw"))), "thaw-costsim")


def run(*args):
    r = subprocess.run([COSTSIM, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_json_per_policy_and_the_same_seed_gives_the_same_day(tmp_path):
    a = run("--seed", "7", "--hours", "3", "--json")
    assert a == run("--seed", "7", "--hours", "3", "--json")
    assert a != run("--seed", "8", "--hours", "3", "--json")
    rows = [json.loads(line) for line in a.splitlines()]
    assert [r["policy"] for r in rows] == ["dedicated", "knative-like", "thaw"]
    for r in rows:
        assert r["gpu_slice_hours"] > 0
        assert set(r["tiers"]) == {"critical", "standard", "batch"}
        for t in r["tiers"].values():
            assert {"cold_starts", "p50_wait_ms", "p99_wait_ms", "rejected"} <= set(t)
    # Always-on dedicated GPUs never cold start.
    assert all(t["cold_starts"] == 0 for t in rows[0]["tiers"].values())
    # Every request is accounted for the same way under every policy.
    totals = {r["policy"]: sum(t["served"] + t["rejected"] for t in r["tiers"].values())
              for r in rows}
    assert max(totals.values()) - min(totals.values()) <= max(totals.values()) * 0.01


def test_svg_plot(tmp_path):
    svg = tmp_path / "slices.svg"
    out = run("--seed", "1", "--hours", "2", "--svg", str(svg))
    assert "thaw" in out and "knative-like" in out
    doc = xml.dom.minidom.parse(str(svg))
    assert len(doc.getElementsByTagName("polygon")) == 3  # one area per tier
