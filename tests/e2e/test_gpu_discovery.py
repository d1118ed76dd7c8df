"""GPU discovery ("gpus": "discover") as thaw runs its command: start-up waits
for it; a reload that starts the process backend runs it on the event loop,
which keeps serving, and completes when it ends; a command past its deadline
is killed with its whole process group; how it ended and what it wrote on
stderr are logged as logfmt fields and quoted lines."""

import os
import signal
import time

import pytest

from conftest import wait_for
from test_gpu_sharing import NVIDIA_SMI_L
from test_process import SLOW, complete, pid_alive, sim_model
from test_reload import get, reloads, static_model, write_config


def script(path, body):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def slow_smi(tmp_path, seconds):
    """nvidia-smi -L that takes `seconds` (it touches `started` first)."""
    return script(tmp_path / "nvidia-smi",
                  f'touch "{tmp_path}/started"\nsleep {seconds}\n'
                  f"cat <<'EOF'\n{NVIDIA_SMI_L}EOF\n")


def hung_smi(tmp_path):
    """A wrapper that never answers; its child's pid goes to `child`."""
    return script(tmp_path / "nvidia-smi",
                  f'sleep 60 &\necho $! > "{tmp_path}/child"\nwait\n')


def discover(smi):
    return {"gpus": "discover", "gpu_discovery_command": [smi, "-L"]}


def assert_logfmt(logs):
    for line in logs.splitlines():
        assert line.startswith("ts="), f"not a logfmt line: {line!r}"


def worst_wait(t, seconds):
    """The longest a static model's answer or the admin port's /healthz
    took, asked again and again for `seconds`."""
    worst = 0.0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        t0 = time.monotonic()
        assert get(t, "/models/s/echo", timeout=30).status == 200
        t1 = time.monotonic()
        assert t.admin("/healthz")[0] == 200
        worst = max(worst, t1 - t0, time.monotonic() - t1)
        time.sleep(0.02)
    return worst


def child_of(tmp_path):
    p = tmp_path / "child"
    text = wait_for(lambda: p.exists() and p.read_text().strip(), what="the command's child")
    return int(text)


def gone(pid, timeout=2.0):
    until = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > until:
            return False
        time.sleep(0.02)
    return True


def kill_quietly(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_reload_that_discovers_gpus_keeps_serving_meanwhile(thaw_factory, upstream, tmp_path):
    """Before, the reload ran the discovery command on the event loop and
    every request (other models, /healthz) waited for it: 3 s here."""
    smi = slow_smi(tmp_path, 3)
    t = thaw_factory({**discover(smi), "models": [static_model(upstream, "s")]})
    assert get(t, "/models/s/echo").status == 200
    write_config(t, {**discover(smi), "models": [
        static_model(upstream, "s"), sim_model("small", load_ms=50, mig_profile="1g.5gb")]})
    before = reloads(t, "success")
    t.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: (tmp_path / "started").exists(), what="discovery started")
    worst = worst_wait(t, 2)
    assert worst < 0.5 * SLOW, f"a request waited {worst:.2f} s while discovery ran"
    assert reloads(t, "success") == before  # it completes when discovery does
    wait_for(lambda: reloads(t, "success") == before + 1, timeout=10 * SLOW,
             what="reload completed")
    assert complete(t, "small").status == 200
    logs = t.logs()
    assert 'msg="reload waits for GPU discovery"' in logs
    assert 'msg="GPU discovered" gpu=0 mig_profile="1g.5gb"' in logs
    assert_logfmt(logs)


def test_a_hung_discovery_fails_the_reload_and_is_killed_with_its_children(
        thaw_factory, upstream, tmp_path):
    """Before, the event loop stood still for the whole 5 s deadline, and
    only the wrapper was killed: its child outlived it (and thaw)."""
    smi = hung_smi(tmp_path)
    t = thaw_factory({**discover(smi), "models": [static_model(upstream, "s")]})
    write_config(t, {**discover(smi), "models": [
        static_model(upstream, "s"), sim_model("small", mig_profile="1g.5gb")]})
    before = reloads(t, "failure")
    t0 = time.monotonic()
    t.proc.send_signal(signal.SIGHUP)
    child = child_of(tmp_path)
    problems = []
    try:
        worst = worst_wait(t, 2)
        if worst >= 0.5 * SLOW:
            problems.append(f"a request waited {worst:.2f} s while discovery hung")
        wait_for(lambda: reloads(t, "failure") == before + 1, timeout=10 * SLOW,
                 what="reload failed")
        assert time.monotonic() - t0 >= 4.5  # at the deadline, not before
        if not gone(child):
            problems.append("the command's child outlived its deadline")
    finally:
        kill_quietly(child)
    assert not problems, problems
    status = t.status()
    assert "the process backend its models need could not start" in status["config"]["last_error"]
    assert [m["name"] for m in status["models"]] == ["s"]
    assert get(t, "/models/s/echo").status == 200
    logs = t.logs()
    failed = [line for line in logs.splitlines() if 'msg="GPU discovery command failed"' in line]
    assert len(failed) == 1, logs
    assert ('how="did not finish within 5 s (its process group was killed)" timed_out=true '
            'timeout_ms=5000') in failed[0]
    assert_logfmt(logs)


@pytest.mark.parametrize("body,fields", [
    ("echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\" >&2\n"
     "echo 'Make sure that the latest \"NVIDIA driver\" is installed.' >&2\nexit 9\n",
     ['how="exited with status 9" exit_code=9']),
    ("echo 'nvidia-smi: lost' >&2\nkill -USR1 $$\n",
     ['how="was killed by signal SIGUSR1 (10)" signal=SIGUSR1 signal_number=10']),
])
def test_a_failed_discovery_says_how_it_ended_and_quotes_its_stderr(thaw_factory, tmp_path,
                                                                    body, fields):
    """Before: `status=2304` (the raw wait status of exit 9), and the
    command's stderr went into thaw's log raw, between its logfmt lines."""
    smi = script(tmp_path / "nvidia-smi", body)
    with pytest.raises(AssertionError) as e:
        thaw_factory({**discover(smi), "models": [sim_model("small", mig_profile="1g.5gb")]})
    logs = str(e.value).split(": ", 1)[1]
    failed = [line for line in logs.splitlines() if 'msg="GPU discovery command failed"' in line]
    assert len(failed) == 1, logs
    for f in fields:
        assert f in failed[0], failed[0]
    assert "status=" not in failed[0]
    assert f'command="{smi}"' in failed[0]
    stderr = [line.split(" line=", 1)[1] for line in logs.splitlines()
              if 'msg="command stderr" task=gpu_discovery' in line]
    first = body.split("\n")[0].split("'" if body.startswith("echo '") else '"')[1]
    assert stderr[0] == f'"{first}"'
    if "exit 9" in body:
        assert stderr[1] == '"Make sure that the latest \\"NVIDIA driver\\" is installed."'
    assert_logfmt(logs)


def test_a_sighup_while_discovery_runs_is_not_lost(thaw_factory, upstream, upstream2, tmp_path):
    """The file as it is after the second SIGHUP is applied once the first
    reload, which waited for discovery, is done."""
    smi = slow_smi(tmp_path, 2)
    t = thaw_factory({**discover(smi), "models": [static_model(upstream, "s")]})
    first = [static_model(upstream, "s"), sim_model("small", load_ms=50, mig_profile="1g.5gb")]
    write_config(t, {**discover(smi), "models": first})
    before = reloads(t, "success")
    t.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: (tmp_path / "started").exists(), what="discovery started")
    write_config(t, {**discover(smi), "models": first + [static_model(upstream2, "s2")]})
    t.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: reloads(t, "success") == before + 2, timeout=15 * SLOW,
             what="both reloads done")
    assert sorted(m["name"] for m in t.status()["models"]) == ["s", "s2", "small"]
    assert get(t, "/models/s2/echo").status == 200
    assert complete(t, "small").status == 200


def test_thaw_exits_at_once_during_discovery_and_kills_the_command(thaw_factory, upstream,
                                                                    tmp_path):
    """A SIGTERM while a reload's discovery runs: thaw drains and exits
    without waiting for the command, whose process group goes with it."""
    smi = hung_smi(tmp_path)
    t = thaw_factory({**discover(smi), "models": [static_model(upstream, "s")]})
    write_config(t, {**discover(smi), "models": [
        static_model(upstream, "s"), sim_model("small", mig_profile="1g.5gb")]})
    t.proc.send_signal(signal.SIGHUP)
    child = child_of(tmp_path)
    problems = []
    try:
        t0 = time.monotonic()
        assert t.stop() == 0
        took = time.monotonic() - t0
        if took >= 3 * SLOW:
            problems.append(f"thaw took {took:.1f} s to exit")
        if not gone(child):
            problems.append("the command's child outlived thaw")
    finally:
        kill_quietly(child)
    assert not problems, problems
