"""GPU sharing in the process backend: MIG instances, MPS shares with a
memory limit, memory-bound packing, and discovery from nvidia-smi -L.

Model processes are thaw-model-sim; what a replica was given is read back
from its environment (/proc/PID/environ)."""

import json
import os
import stat
import time

import pytest

import httpc
from conftest import Busy, wait_for
from test_process import complete, environ_of, model_status, pid_alive, sim_model

GB = 1000000000
MIG_A = "MIG-4c5f0a12-aaaa-5b6c-8d9e-222222222222"
MIG_B = "MIG-8a7b6c5d-bbbb-5e4f-9a8b-333333333333"
MIG_BIG = "MIG-1f2e3d4c-cccc-5b6a-8978-444444444444"

# As nvidia-smi -L prints it: GPU 0 in MIG mode (two 1g.5gb and one 3g.20gb
# instance), GPU 1 a whole L4.
NVIDIA_SMI_L = f"""GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5f0d2f6a-7c0e-1a2b-9d3e-111111111111)
  MIG 3g.20gb     Device  0: (UUID: {MIG_BIG})
  MIG 1g.5gb      Device  1: (UUID: {MIG_A})
  MIG 1g.5gb      Device  2: (UUID: {MIG_B})
GPU 1: NVIDIA L4 (UUID: GPU-9e8d7c6b-dddd-4a3b-2c1d-555555555555)
"""


def processes(t, name):
    return [p for p in model_status(t, name)["processes"]]


def devices_of(t, name):
    return sorted(environ_of(p["pid"])["CUDA_VISIBLE_DEVICES"] for p in processes(t, name))


def test_mig_instances_are_capacity_units_of_their_profile(thaw_factory):
    """Each MIG instance takes one replica, of a model asking for its
    profile; the replica sees only its instance (CUDA_VISIBLE_DEVICES=MIG-...).
    A third 1g replica waits although a 3g instance is free."""
    t = thaw_factory({
        "gpus": [{"id": 0, "mig": MIG_A, "profile": "1g.5gb"},
                 {"id": 0, "mig": MIG_B, "profile": "1g.5gb"},
                 {"id": 0, "mig": MIG_BIG, "profile": "3g.20gb"}],
        "models": [sim_model("small", load_ms=50, mig_profile="1g.5gb", min_replicas=3,
                             max_replicas=3),
                   sim_model("big", load_ms=50, mig_profile="3g.20gb")]})
    wait_for(lambda: len(processes(t, "small")) == 2, what="two 1g replicas")
    time.sleep(0.5)
    assert devices_of(t, "small") == sorted([MIG_A, MIG_B])
    assert len(processes(t, "small")) == 2
    assert complete(t, "big").status == 200
    assert devices_of(t, "big") == [MIG_BIG]
    gpus = {g["mig"]: g for g in t.status()["gpus"]}
    assert gpus[MIG_A]["profile"] == "1g.5gb" and gpus[MIG_A]["used"] == 1
    assert gpus[MIG_BIG]["used"] == 1


def test_mps_share_and_memory_limit_reach_the_replica(thaw_factory):
    t = thaw_factory({
        "gpus": [{"id": 1, "slices": 4, "sharing": "mps", "memory_bytes": 24 * GB}],
        "models": [sim_model(load_ms=50, gpu_slices=1, gpu_memory_bytes=10 * GB)]})
    assert complete(t).status == 200
    env = environ_of(processes(t, "llama")[0]["pid"])
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=9537M"


def test_memory_bound_gpu_refuses_a_third_replica(thaw_factory):
    """A time-sliced 24 GB GPU with four slices: two 10 GB replicas share it,
    a third would overcommit its memory and waits instead."""
    t = thaw_factory({
        "gpus": [{"id": 0, "slices": 4, "memory_bytes": 24 * GB}],
        "models": [sim_model(load_ms=50, gpu_slices=1, gpu_memory_bytes=10 * GB,
                             min_replicas=3, max_replicas=3)]})
    wait_for(lambda: len(processes(t, "llama")) == 2, what="two replicas")
    wait_for(lambda: model_status(t)["state"] in ("waiting_for_capacity", "ready"),
             what="settled")
    time.sleep(0.5)
    assert len(processes(t, "llama")) == 2
    g = t.status()["gpus"][0]
    assert g["used"] == 2 and g["memory_used"] == 20 * GB


def test_memory_bound_gpu_evicts_an_idle_warm_replica_for_a_critical_model(thaw_factory):
    """Four slices but 80 GB: two idle batch replicas of 30 GB kept warm by the
    warm pool leave no memory for a third model's 30 GB. A critical request
    evicts one of them (the slices alone would have fit all three) instead of
    waiting behind warm replicas that nobody uses."""
    t = thaw_factory({
        "gpus": [{"id": 0, "slices": 4, "memory_bytes": 80 * GB}],
        "warm_pool": {"budget_slices": 4},
        "autoscaler": {"tick_ms": 200},
        "models": [sim_model(name, load_ms=50, gpu_slices=1, gpu_memory_bytes=30 * GB,
                             priority=tier, idle_timeout_ms=300, queue_timeout_ms=8000)
                   for name, tier in (("batch-a", "batch"), ("batch-b", "batch"),
                                      ("crit", "critical"))]})
    assert complete(t, "batch-a").status == 200 and complete(t, "batch-b").status == 200
    wait_for(lambda: all(model_status(t, m)["pool"].get("last_decision") == "keep_warm"
                         for m in ("batch-a", "batch-b")), timeout=10, what="kept warm")
    start = time.monotonic()
    r = complete(t, "crit")
    assert r.status == 200, r.body
    assert time.monotonic() - start < 5
    evicted = [m for m in ("batch-a", "batch-b")
               if model_status(t, m)["pool"].get("last_decision") == "evict"]
    assert len(evicted) == 1
    g = t.status()["gpus"][0]
    assert g["memory_used"] <= 80 * GB


def test_an_idle_warm_replica_gives_way_to_live_demand_of_its_own_tier(thaw_factory):
    """One GPU of 2 slices, both models standard and 2 slices each: "a",
    idle and kept warm (it served more, so it is worth more), gives way to a
    request for "b" once it has waited the standard tier's patience (10 s),
    rather than hold the GPU while "b" times out."""
    t = thaw_factory({
        "gpus": [{"id": 0, "slices": 2}],
        "warm_pool": {"budget_slices": 2},
        "autoscaler": {"tick_ms": 200},
        "models": [sim_model(name, load_ms=50, gpu_slices=2, priority="standard",
                             idle_timeout_ms=300, queue_timeout_ms=20000)
                   for name in ("a", "b")]})
    for _ in range(3):
        assert complete(t, "a").status == 200
    wait_for(lambda: model_status(t, "a")["pool"].get("last_decision") == "keep_warm",
             timeout=10, what="a kept warm")
    time.sleep(1)  # five planning steps that decide the same again
    logged = sum(1 for line in t.logs().splitlines()
                 if "capacity decision" in line and "model=a " in line and "keep_warm" in line)
    assert logged == t.metric("thaw_pool_decisions_total", model="a", action="keep_warm") == 1
    start = time.monotonic()
    r = complete(t, "b")
    waited = time.monotonic() - start
    assert r.status == 200, r.body
    assert 9.5 < waited < 15, waited
    assert model_status(t, "a")["pool"].get("last_decision") == "evict"


def complete_within(t, name, timeout):
    """A completion that gives up after timeout seconds (socket.timeout)."""
    return httpc.request(t.host, t.port, "POST", "/v1/completions",
                         {"Content-Type": "application/json"},
                         json.dumps({"model": name, "prompt": "hi"}).encode(), timeout=timeout)


def test_a_critical_sleep_mode_model_preempts_an_idle_batch_replica(thaw_factory):
    """Critical work never waits behind batch work for a GPU, sleep mode or
    not: critical c (sleep mode) needs the memory idle batch b (no sleep
    mode, within its 60 s idle timeout) holds, and b is preempted at once.
    Before, a sleep-mode model's memory was left out of the warm pool's plan:
    nothing was freed for c, which waited for b's idle timeout."""
    b = sim_model("b", load_ms=50, gpu_slices=1, gpu_memory_bytes=6 * GB, priority="batch")
    c = sim_model("c", load_ms=50, gpu_slices=1, gpu_memory_bytes=6 * GB, priority="critical")
    c["sleep"] = {"enabled": True}
    t = thaw_factory({"gpus": [{"id": 0, "slices": 2, "memory_bytes": 10 * GB}],
                      "autoscaler": {"tick_ms": 200}, "models": [b, c]})
    assert complete(t, "b").status == 200
    b_pid = processes(t, "b")[0]["pid"]
    start = time.monotonic()
    r = complete_within(t, "c", 10)
    assert r.status == 200, r.body
    assert time.monotonic() - start < 5
    assert t.metric("thaw_pool_decisions_total", model="b", action="preempt") == 1
    wait_for(lambda: not pid_alive(b_pid), timeout=5, what="b stopped")
    assert t.status()["gpus"][0]["memory_used"] == 6 * GB
    t.assert_reconciled()


def test_a_busy_batch_sleep_mode_replica_is_preempted_for_critical(thaw_factory):
    """Batch b (sleep mode) is kept busy by two streams of 1 s batch
    requests and holds the memory critical c needs. c is served in seconds:
    b's replica is preempted (out of routing, its requests in flight
    finish, then it stops), as any lower tier's is; b's later requests wait
    and are served once c has gone idle (1 s). Before, only an idle
    sleep-mode replica gave up its memory (put to sleep): c waited as long
    as the batch stream lasted."""
    b = sim_model("b", load_ms=50, tokens=10, token_ms=100, gpu_slices=1,
                  gpu_memory_bytes=6 * GB, priority="batch")
    b["sleep"] = {"enabled": True}
    c = sim_model("c", load_ms=50, gpu_slices=1, gpu_memory_bytes=6 * GB, priority="critical",
                  idle_timeout_ms=1000)
    t = thaw_factory({"gpus": [{"id": 0, "slices": 2, "memory_bytes": 10 * GB}],
                      "autoscaler": {"tick_ms": 200}, "models": [b, c]})
    with Busy(lambda: complete(t, "b")) as batch:
        wait_for(lambda: t.metric("thaw_upstream_inflight", model="b") == 2, timeout=10,
                 what="b busy")
        start = time.monotonic()
        r = complete_within(t, "c", 12)
        took = time.monotonic() - start
    assert r.status == 200, r.body
    assert took < 6, took
    assert t.metric("thaw_pool_decisions_total", model="b", action="preempt") == 1
    # b's requests were drained or waited, none lost
    assert batch.statuses and set(batch.statuses) == {200}
    t.assert_reconciled()


@pytest.mark.parametrize("gpus,model,error", [
    ('[{"id": 0, "mig": "GPU-1234", "profile": "1g.5gb"}]', '"gpu_slices": 1',
     'gpus[0]: "mig" must be a MIG device UUID'),
    ('[{"id": 0, "mig": "MIG-1234"}]', '"gpu_slices": 1',
     'gpus[0]: a MIG instance needs its "profile"'),
    ('[{"id": 0, "mig": "MIG-1234", "profile": "1g.5gb", "sharing": "mps"}]',
     '"mig_profile": "1g.5gb"', "MPS does not apply to MIG devices"),
    ('[{"id": 0, "mig": "MIG-1234", "profile": "1g.5gb"}]', '"mig_profile": "3g.20gb"',
     'models[0].mig_profile: no declared MIG instance has profile "3g.20gb"'),
    ('[{"id": 0, "slices": 2, "memory_bytes": 16000000000}]',
     '"gpu_slices": 1, "gpu_memory_bytes": 20000000000',
     "models[0].gpu_memory_bytes: 20000000000 bytes fit on no declared GPU with room for"),
    ('[{"id": 0, "slices": 2}]', '"gpu_memory_bytes": 1000',
     'models[0].gpu_memory_bytes: needs "gpu_slices"'),
])
def test_config_refuses_gpu_needs_it_cannot_meet(gpus, model, error):
    from test_cli import run, write
    path = write('{"gpus": %s,\n "models": [{"name": "m", "command": ["x", "{port}"], %s}]}'
                 % (gpus, model))
    r = run("--check-config", path)
    assert r.returncode == 1 and error in r.stderr, r.stderr


@pytest.fixture
def fake_nvidia_smi(tmp_path):
    def make(output, status=0):
        path = tmp_path / "nvidia-smi"
        path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\nexit {status}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
        return str(path)
    return make


def test_discovered_mig_instances_and_gpus(thaw_factory, fake_nvidia_smi):
    smi = fake_nvidia_smi(NVIDIA_SMI_L)
    t = thaw_factory({
        "gpus": "discover", "gpu_discovery_command": [smi, "-L"], "gpu_discovery_slices": 2,
        "models": [sim_model("small", load_ms=50, mig_profile="1g.5gb"),
                   sim_model("whole", load_ms=50, gpu_slices=2)]})
    assert complete(t, "small").status == 200
    assert devices_of(t, "small")[0] in (MIG_A, MIG_B)
    assert complete(t, "whole").status == 200
    assert devices_of(t, "whole") == ["1"]  # the L4: GPU 0 is split into MIG instances
    kinds = sorted((g.get("profile") or "whole", g["slices"]) for g in t.status()["gpus"])
    assert kinds == [("1g.5gb", 1), ("1g.5gb", 1), ("3g.20gb", 1), ("whole", 2)]


def test_failed_discovery_is_a_clear_start_up_error(thaw_factory, fake_nvidia_smi):
    smi = fake_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the "
                          "NVIDIA driver.\n", status=9)
    with pytest.raises(AssertionError) as e:
        thaw_factory({"gpus": "discover", "gpu_discovery_command": [smi, "-L"],
                      "models": [sim_model("small", mig_profile="1g.5gb")]})
    assert "GPU discovery command failed" in str(e.value)


def test_discovered_gpus_without_the_profile_asked_for(thaw_factory, fake_nvidia_smi):
    smi = fake_nvidia_smi(NVIDIA_SMI_L)
    with pytest.raises(AssertionError) as e:
        thaw_factory({"gpus": "discover", "gpu_discovery_command": [smi, "-L"],
                      "models": [sim_model("huge", mig_profile="7g.40gb")]})
    assert "fit on no GPU found" in str(e.value) and "7g.40gb" in str(e.value)


def test_a_reload_is_checked_against_the_gpus_thaw_runs_with(thaw_factory, fake_nvidia_smi):
    """A change to "gpus" needs a restart: a reload whose new model fits
    only the file's new GPUs, or none of the discovered ones, is refused
    (before, it was taken and the model waited for capacity forever)."""
    from test_reload import hup, write_config
    t = thaw_factory({"gpus": [{"id": 0, "slices": 4}],
                      "models": [sim_model("a", load_ms=50, gpu_slices=1)]})
    write_config(t, {"gpus": [{"id": 0, "slices": 8}],
                     "models": [sim_model("a", load_ms=50, gpu_slices=1),
                                sim_model("big", load_ms=50, gpu_slices=6)]})
    hup(t, "failure")
    err = t.status()["config"]["last_error"]
    assert "models[1].gpu_slices: 6 slices fit on none of the 1 GPU units thaw runs with" in err
    assert [m["name"] for m in t.status()["models"]] == ["a"]
    assert complete(t, "a").status == 200
    # Discovered GPUs are not in the file: a reload is checked against them.
    smi = fake_nvidia_smi(NVIDIA_SMI_L)
    t2 = thaw_factory({"gpus": "discover", "gpu_discovery_command": [smi, "-L"],
                       "models": [sim_model("small", load_ms=50, mig_profile="1g.5gb")]})
    write_config(t2, {"gpus": "discover", "gpu_discovery_command": [smi, "-L"],
                      "models": [sim_model("small", load_ms=50, mig_profile="1g.5gb"),
                                 sim_model("huge", load_ms=50, mig_profile="7g.40gb")]})
    hup(t2, "failure")
    assert 'no MIG instance of profile "7g.40gb"' in t2.status()["config"]["last_error"]


def test_a_reload_refused_for_gpu_memory_names_that_key(thaw_factory):
    """The running GPU has the slices but not the memory a reload asks for
    (the file's new GPU would have it, but "gpus" needs a restart): the
    refusal names gpu_memory_bytes, not gpu_slices."""
    from test_reload import hup, write_config
    t = thaw_factory({"gpus": [{"id": 0, "slices": 4, "memory_bytes": 16 * GB}],
                      "models": [sim_model("a", load_ms=50, gpu_slices=1,
                                           gpu_memory_bytes=8 * GB)]})
    write_config(t, {"gpus": [{"id": 0, "slices": 4, "memory_bytes": 32 * GB}],
                     "models": [sim_model("a", load_ms=50, gpu_slices=1,
                                          gpu_memory_bytes=20 * GB)]})
    hup(t, "failure")
    err = t.status()["config"]["last_error"]
    assert "models[0].gpu_memory_bytes: 20000000000 bytes with 1 slices fit on none" in err, err


def test_a_reload_adding_the_first_process_model_is_checked_too(thaw_factory, upstream):
    """Started with static models only, there is no process backend yet: the
    reload that adds the first process model starts it on the GPUs thaw runs
    with, and checks the file against them. Before, the reload was taken and
    the model could never start (504 after its queue timeout)."""
    from test_reload import hup, write_config
    t = thaw_factory({"gpus": [{"id": 0, "slices": 4}],
                      "models": [{"name": "s", "endpoints": [upstream.address]}]})
    write_config(t, {"gpus": [{"id": 0, "slices": 8}],
                     "models": [{"name": "s", "endpoints": [upstream.address]},
                                sim_model("big", load_ms=50, gpu_slices=6)]})
    hup(t, "failure")
    assert "6 slices fit on none of the 1 GPU units" in t.status()["config"]["last_error"]
    # One that fits: taken, and served.
    write_config(t, {"gpus": [{"id": 0, "slices": 4}],
                     "models": [{"name": "s", "endpoints": [upstream.address]},
                                sim_model("small", load_ms=50, gpu_slices=2)]})
    hup(t)
    assert complete(t, "small").status == 200
