"""thaw-costsim: reproducible, complete output per policy and tier, traces to and from CSV
(its figures are benchmarks, not tests: see docs/performance.md)."""

import json
import os
import subprocess
import xml.dom.minidom

import yaml

from conftest import ROOT

COSTSIM = os.path.join(os.path.dirname(os.environ.get("THAW_BIN", os.path.join(
    ROOT, "build", "thaw"))), "thaw-costsim")
POLICIES = ["dedicated", "static", "knative", "thaw", "thaw-prewarm"]
TIERS = {"critical", "standard", "batch"}


def run(*args, code=0):
    r = subprocess.run([COSTSIM, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == code, r.stderr
    return r.stdout if code == 0 else r.stderr


def rows(out):
    return [json.loads(line) for line in out.splitlines()]


def test_json_per_policy_and_tier_and_the_same_seed_gives_the_same_day():
    a = run("--seed", "7", "--hours", "2", "--json")
    assert a == run("--seed", "7", "--hours", "2", "--json")
    assert a != run("--seed", "8", "--hours", "2", "--json")
    rs = rows(a)
    assert [r["policy"] for r in rs] == POLICIES
    for r in rs:
        assert r["trace"] == "fleet24" and r["seed"] == 7 and r["gpu_slice_hours"] > 0
        assert r["cost_usd"] > 0 and set(r["tiers"]) == TIERS
        for t in r["tiers"].values():
            assert {"gpu_slice_hours", "cost_usd", "cold_starts", "ahead_starts", "cold_requests",
                    "p50_wait_ms", "p99_wait_ms",
                    "served", "rejected", "slo_attainment", "slo_target_ms"} <= set(t)
            assert 0 <= t["slo_attainment"] <= 1
        # Every request is accounted for once, under every policy.
        assert sum(t["served"] + t["rejected"] for t in r["tiers"].values()) == r["requests"]
    # Always-on policies never cold start.
    for r in rs[:2]:
        assert all(t["cold_starts"] == 0 for t in r["tiers"].values())


def test_one_policy_and_the_other_traces():
    r = rows(run("--trace", "large", "--hours", "1", "--policy", "knative", "--json"))
    assert [x["policy"] for x in r] == ["knative"]
    assert r[0]["models"] == 200 and r[0]["gpus"] == 32 and r[0]["slices_per_gpu"] == 4
    r = rows(run("--trace", "bursty-batch", "--hours", "1", "--policy", "thaw,static", "--json"))
    assert [x["policy"] for x in r] == ["thaw", "static"]
    assert "unknown policy \"fifo\"" in run("--policy", "fifo", code=2)


def test_a_trace_written_to_csv_reads_back_to_the_same_figures(tmp_path):
    csv = tmp_path / "day.csv"
    generated = run("--seed", "3", "--hours", "1", "--json", "--write-trace", str(csv))
    lines = csv.read_text().splitlines()
    assert "time,model,tier,tokens" in lines
    assert any(ln.startswith("# model,critical-00,critical,") for ln in lines)
    read = run("--trace", str(csv), "--seed", "3", "--json")
    strip = [{k: v for k, v in r.items() if k != "trace"} for r in rows(generated)]
    assert strip == [{k: v for k, v in r.items() if k != "trace"} for r in rows(read)]


def test_a_log_without_model_lines_and_a_bad_one(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("time,model,tier,tokens\n0,llama,critical,200\n65,llama,critical,200\n"
                   "70,qwen,batch,400\n")
    r = rows(run("--trace", str(log), "--policy", "thaw", "--json"))[0]
    assert r["models"] == 2 and r["requests"] == 3 and r["hours"] == 1
    assert r["tiers"]["critical"]["served"] == 2 and r["tiers"]["batch"]["served"] == 1
    log.write_text("time,model,tier,tokens\n0,llama,urgent,200\n")
    err = run("--trace", str(log), code=2)
    assert f"{log}:2: tier: expected critical, standard or batch" in err
    assert "no-such.csv" in run("--trace", str(tmp_path / "no-such.csv"), code=2)


def test_the_simulated_warm_budget_is_the_charts():
    """thaw is simulated with the defaults it ships: the chart's warm budget."""
    with open(os.path.join(ROOT, "charts", "thaw", "values.yaml")) as f:
        values = yaml.safe_load(f)
    r = rows(run("--hours", "1", "--policy", "thaw", "--json"))[0]
    assert r["warm_budget_slices"] == values["config"]["warm_pool"]["budget_slices"]
    assert r["warm_budget_slices"] > 0


def test_svg_plot(tmp_path):
    svg = tmp_path / "slices.svg"
    out = run("--seed", "1", "--hours", "2", "--svg", str(svg))
    assert "thaw" in out and "knative" in out and "SLO" in out
    doc = xml.dom.minidom.parse(str(svg))
    assert len(doc.getElementsByTagName("polygon")) == 3  # one area per tier
