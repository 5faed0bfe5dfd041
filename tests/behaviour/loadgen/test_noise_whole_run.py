"""Host noise end to end: a CPU hog during one phase of a run against the simulators marks that phase noisy with the hog's share; the estimates carry it (never a reading the noise could explain), the verdict concludes and says so; the other phases are unaffected."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import psutil
import pytest
import requests

from servescope.contracts.runfolder import RunFolder
from servescope.report import load, sections, table
from tests.conftest import unavailable
from tests.doubles.synthetic_openai import SyntheticProcess
from tests.harness import spawn_cli
from tests.paths import REPO

HOG = "python -m tests.doubles.cpu_hog"
# Every other program's CPU in a phase is what it measures (a parallel test worker is one), and its hog takes
# two cores: run alone.
pytestmark = [pytest.mark.serial, pytest.mark.slow, pytest.mark.long]
HOG_PHASE = "burst-1#2"  # llama.cpp's burst in repetition 2 (A1 A2 B1 B2 | B2 B1 A2 A1: it follows its repetition 1)


def hog_share(phase) -> float:
    return next((g["cores"] for g in phase.noise["groups"] if g["name"] == HOG), 0.0)


def loudest_program(phase) -> float:
    """The largest share one program (not the sums) took while a phase ran."""
    named = [g["cores"] for g in phase.noise["groups"] if g["kind"] in ("process", "other engine")]
    return max([c for c, g in zip(named, phase.noise["groups"], strict=False) if " more" not in g["name"]] or [0.0])


def test_a_cpu_hog_during_one_phase_is_carried_said_and_leaves_the_others_alone(tmp_path, monkeypatch):
    env = {
        **os.environ,
        "SERVESCOPE_STATE": str(tmp_path / "state"),  # no native stack's pid records from this machine
        "SAMPLE_INTERVAL_MS": "0",
        "WARMUP_TOLERANCE": "0.5",
    }
    with (
        SyntheticProcess("--ttft", "0.1", "--itl", "0.05") as vllm,
        SyntheticProcess("--ttft", "0.1", "--itl", "0.05") as llama,
    ):
        # llama.cpp with one slot: its bursts queue, so its verdict has the clients' evidence to rest on.
        requests.post(f"{llama.url}/control", json={"max_running": 1}, timeout=10).raise_for_status()
        proc = spawn_cli(
            "loadgen",
            "compare",
            "--engine",
            f"vllm={vllm.url}",
            "--engine",
            f"llamacpp={llama.url}",
            "--repetitions",
            "2",
            "--no-sequential-four",
            "--max-tokens",
            "16",
            "--burst-pause",
            "0",
            "--results",
            str(tmp_path),
            "--run-id",
            "hog",
            "--metrics-port",
            "0",
            env=env,
        )
        hog, hog_cpu, out = None, None, []
        try:
            for line in proc.stdout:  # the load generator's own progress lines order the hog: no sleeps
                out.append(line)
                if "phase llamacpp burst#2:" in line:
                    hog = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "tests.doubles.cpu_hog",
                            "--seconds",
                            "60",
                            "--processes",
                            "2",
                            "--nice",
                            "-10",
                        ],
                        cwd=REPO,
                        start_new_session=True,  # its own autogroup, so its nice value counts on a busy machine
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    assert hog.stdout.readline().strip() == "busy"
                elif f"llamacpp {HOG_PHASE} done:" in line:
                    # After the phase's noise was taken: the hog and its forked copy.
                    family = [psutil.Process(hog.pid), *psutil.Process(hog.pid).children()]
                    hog_cpu = sum(sum(p.cpu_times()[:2]) for p in family)
                    hog.terminate()
                    hog.wait(10)
            assert proc.wait(120) == 0, proc.stderr.read()
        finally:
            if hog is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(hog.pid, signal.SIGKILL)  # its forked copies too (its own session)
                hog.wait(10)
            if proc.poll() is None:
                proc.kill()
    assert hog_cpu is not None, "".join(out[-20:])

    phases = {(p.instance, p.phase): p for p in RunFolder(tmp_path / "hog").phases()}
    assert {p.repetition for p in phases.values()} == {1, 2}
    flagged = phases[("llamacpp", HOG_PHASE)]
    # The hog's CPU is measured where it ran, as its own program, and nowhere else.
    seconds = hog_share(flagged) * flagged.noise["window_s"]
    assert 0.5 * hog_cpu <= seconds <= hog_cpu + 0.03, (seconds, hog_cpu)
    others = [p for key, p in phases.items() if key != ("llamacpp", HOG_PHASE)]
    assert all(hog_share(p) == 0.0 for p in others)
    assert all(p.noise["engine_found"] for p in phases.values())

    # The rule's threshold between the hog and the loudest other program seen in any other phase: this machine
    # may be busy, but only the hog may decide which phase is noisy here.
    background = max(loudest_program(p) for p in others)
    if hog_share(flagged) <= background * 1.2:
        unavailable(
            f"host too busy: another program took {background:.2f} cores in a phase, the hog only {hog_share(flagged):.2f}"
        )
    monkeypatch.setenv("NOISE_GROUP_CPU_CORES", f"{(hog_share(flagged) + background) / 2:.4f}")
    monkeypatch.setenv("NOISE_FOREIGN_CPU_CORES", "1000")
    monkeypatch.setenv("NOISE_STEAL_SHARE", "1")

    run = load.load(tmp_path / "hog")
    doc, numbers = sections.build(run, "http://127.0.0.1:9", figures=False)
    trust = {(t["instance"], t["phase"]): t for t in numbers["noise"]["phases"]}
    (flag,) = [f for f in trust[("llamacpp", HOG_PHASE)]["noisy"] if HOG in f]
    share = f"{hog_share(flagged):.0%} of a core" if hog_share(flagged) < 0.995 else f"{hog_share(flagged):.1f} cores"
    assert flag == f"noisy: {share} used by {HOG} while measuring llamacpp"
    assert [key for key, t in trust.items() if t["noisy"]] == [("llamacpp", HOG_PHASE)]
    assert not any(t["flags"] for t in trust.values())  # noise is carried, never a reason to leave a phase out
    assert trust[("llamacpp", HOG_PHASE)]["slowdown"] > 1.0

    # The verdict concludes from every phase, the hog's too, and says that one was measured on a busy host.
    (llama_verdict,) = [v for v in numbers["verdict"]["verdicts"] if v["instance"] == "llamacpp"]
    assert llama_verdict["left_out"] == [] and llama_verdict["busy"].startswith("1 of the phases it rests on")
    assert llama_verdict["computable"] and "LLAMACPP_PARALLEL" in llama_verdict["text"]
    (vllm_verdict,) = [v for v in numbers["verdict"]["verdicts"] if v["instance"] == "vllm"]
    assert vllm_verdict["left_out"] == [] and vllm_verdict["busy"] == ""

    # The table: the hog's repetition is in llama.cpp's burst median; its pair stays in the factor unless its noise
    # could explain the reading, and the reading is never "batching" (the hog slowed the burst: the factor can only
    # have come out lower).
    rows = {(r.instance, r.phase): r for r in table.build(run)}
    burst = rows[("llamacpp", "burst-1")]
    hogged = next(r for r in burst.repetitions if r.phase == HOG_PHASE)
    assert hogged.noisy == [flag] and hogged.slowdown > 1.0
    assert hogged.factor_used or hogged.left_out.startswith("its noise could explain the reading")
    assert burst.reading != table.STRONG
    if hogged.factor_used:  # the busy-host clause counts the pairs in the factor; a pair left out is listed instead
        assert burst.busy.startswith("1 of 4 phases measured on a busy host")
    else:
        assert burst.busy is None and [r.phase for r in burst.left_out] == [HOG_PHASE]
    walls = sorted(p.wall_s for (i, name), p in phases.items() if i == "llamacpp" and name.split("#")[0] == "burst-1")
    assert burst.wall_s == walls[0] + (walls[1] - walls[0]) / 2
    for key in (("llamacpp", "sequential"), ("vllm", "sequential"), ("vllm", "burst-1")):
        walls = [p.wall_s for (i, name), p in phases.items() if i == key[0] and name.split("#")[0] == key[1]]
        assert rows[key].wall_s == sorted(walls)[0] + (sorted(walls)[1] - sorted(walls)[0]) / 2
        assert rows[key].left_out == []
    assert rows[("vllm", "burst-1")].scaling_ci[0] is not None  # two repetitions: a CI over them
    assert rows[("vllm", "burst-1")].busy is None
    text = table.render_text(list(rows.values()), run.run_id)
    assert HOG in next(line for line in text.splitlines() if f"llama.cpp server {HOG_PHASE}:" in line)

    # The setup section shows every phase's noise figures, the hog beside its phase, used and how much slower.
    setup = next(sec for sec in doc.sections if sec.title == "Setup")
    noise_table = next(b for b in setup.blocks if getattr(b, "caption", "").startswith("Host noise per phase"))
    hog_row = next(r for r in noise_table.rows if r[0] == "llama.cpp server" and r[1] == HOG_PHASE)
    assert HOG in hog_row[4] and hog_row[-1].startswith("used, up to x") and hog_row[-1].endswith(flag)
    assert len(noise_table.rows) == len(phases)
