"""`python -m exporter check`: recorded engine pages served over real HTTP, judged against the adapters' readings."""

from __future__ import annotations

import re
import socket

import pytest

from exporter import check
from exporter.cli import main as exporter_main
from exporter.upstream import Upstream
from exporter.vllm import VllmCollector
from servescope import engines
from servescope.contracts import series
from servescope.contracts.settings import KnobTable
from tests.doubles.recorded_engine import RecordedEngine, fixture, vllm_engine
from tests.paths import REPO

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = exporter_main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def vllm_page(name: str, version: str) -> RecordedEngine:
    engine = vllm_engine(name)
    engine.set_json("/version", {"version": version})
    return engine


def llamacpp_engine() -> RecordedEngine:
    engine = RecordedEngine()
    engine.set_text("/metrics", fixture("llamacpp-11434.0.0-metrics-busy.txt"))
    engine.pages["/slots"] = (200, fixture("llamacpp-11434.0.0-slots-busy.json"), "application/json")
    engine.pages["/props"] = (200, fixture("llamacpp-11434.0.0-props.json"), "application/json")
    engine.pages["/v1/models"] = (200, fixture("llamacpp-11434.0.0-v1-models.json"), "application/json")
    return engine


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_vllm_0_9_1_names_the_renamed_kv_gauge_and_passes(capsys):
    with vllm_page("vllm-0.9.1-cpu-metrics.txt", "0.9.1") as engine:
        code, out, err = run(capsys, engine.url)
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0] == f"vLLM-CPU 0.9.1 at {engine.url}"
    assert "reads vllm:gpu_cache_usage_perc (old name of vllm:kv_cache_usage_perc)" in out
    assert "gone" not in out.replace(" 0 gone", "")
    assert lines[-1].strip().startswith("summary:") and "1 under an old name" in lines[-1]
    assert "vllm:num_requests_waiting" not in out  # current: not noteworthy without --verbose


def test_the_exporter_really_reads_the_old_kv_name_the_check_calls_renamed():
    """What the check reports as "reads (old name)" must be what the collector does: a value, not an empty series."""
    with vllm_page("vllm-0.9.1-cpu-metrics.txt", "0.9.1") as engine:
        page = engine.pages["/metrics"][1].replace("vllm:gpu_cache_usage_perc{", 'vllm:gpu_cache_usage_perc{x="1",')
        page = re.sub(r"(vllm:gpu_cache_usage_perc\{[^}]*\}) 0\.0", r"\1 0.25", page)
        engine.set_text("/metrics", page)
        collector = VllmCollector("vllm", Upstream(engine.url))
        values = {
            s.name: s.value for family in collector.collect() for s in family.samples if s.labels.get("model") == MODEL
        }
    assert values[series.KV_CACHE_USAGE] == 0.25


def test_a_page_without_num_requests_waiting_fails_naming_it(capsys):
    with vllm_page("vllm-0.32.0-cpu-metrics-idle.txt", "0.32.0") as engine:
        page = "\n".join(
            line
            for line in fixture("vllm-0.32.0-cpu-metrics-idle.txt").splitlines()
            if not line.startswith("vllm:num_requests_waiting{")
        )
        engine.set_text("/metrics", page + "\n")
        code, out, _ = run(capsys, engine.url)
    assert code == 1
    gone = [line for line in out.splitlines() if line.rstrip().endswith("gone")]
    assert len(gone) == 1 and "vllm:num_requests_waiting" in gone[0] and series.REQUESTS_WAITING in gone[0]


@pytest.mark.parametrize("page", ["vllm-0.32.0-cpu-metrics-idle.txt", "vllm-0.32.0-cpu-metrics-burst.txt"])
def test_vllm_0_32_pages_pass_with_nothing_to_say(capsys, page):
    with vllm_page(page, "0.32.0") as engine:
        code, out, err = run(capsys, engine.url)
    assert code == 0 and not err
    assert out.splitlines() == [out.strip()] and out.startswith(f"ok: vLLM-CPU 0.32.0 at {engine.url}")


def test_verbose_lists_every_reading_of_the_adapter(capsys):
    with vllm_page("vllm-0.32.0-cpu-metrics-idle.txt", "0.32.0") as engine:
        code, out, _ = run(capsys, "--verbose", f"vllm={engine.url}")
    assert code == 0
    for reading in engines.VLLM.readings():
        assert f"{reading.current}: current" in out


def test_llamacpp_fixture_passes_and_its_slots_are_read(capsys):
    with llamacpp_engine() as engine:
        code, out, err = run(capsys, "--verbose", engine.url)
    assert code == 0, out + err
    assert out.startswith("llama.cpp server")
    assert "GET /slots: current, 2 slots" in out
    assert "llamacpp:kv_cache_usage_ratio: removed upstream" in out
    assert "gone" not in out.replace(" 0 gone", "").replace("gone from the engine", "")


def test_llamacpp_without_metrics_is_identified_and_fails_with_the_hint(capsys):
    with llamacpp_engine() as engine:
        del engine.pages["/metrics"]
        code, out, _ = run(capsys, engine.url)
    assert code == 1
    assert "start it with --metrics" in out and out.startswith("llama.cpp server")


def test_sglang_fixture_passes(capsys):
    engine = RecordedEngine()
    engine.set_text("/metrics", fixture("sglang-0.5-metrics-from-docs.txt"))
    with engine:
        code, out, err = run(capsys, engine.url)
    assert code == 0, out + err
    assert out.startswith("SGLang")
    # the docs' page predates the ITL rename: read under its old name
    assert "reads sglang:time_per_output_token_seconds (old name of sglang:inter_token_latency_seconds)" in out


def test_unreachable_url_is_one_line_and_exit_2(capsys):
    url = closed_port_url()
    code, out, err = run(capsys, url)
    assert code == 2 and not out
    assert len(err.splitlines()) == 1 and url in err and "Traceback" not in err


@pytest.mark.parametrize(
    "spec, said",
    [("nosuch=http://127.0.0.1:1", "unknown engine kind"), ("ftp://x", "expected http://HOST:PORT")],
)
def test_bad_specs_are_one_line_and_exit_2(capsys, spec, said):
    code, out, err = run(capsys, spec)
    assert code == 2 and not out and len(err.splitlines()) == 1 and said in err


def test_a_page_that_is_not_metrics_is_bad_input(capsys):
    engine = RecordedEngine()
    engine.pages["/metrics"] = (200, "<html><body>Welcome to nginx</body></html>", "text/html")
    with engine:
        code, out, err = run(capsys, f"vllm={engine.url}")
        unnamed, _, err_unnamed = run(capsys, engine.url)
    assert code == 2 and "not a vLLM-CPU metrics page" in err and len(err.splitlines()) == 1
    assert unnamed == 2 and "give kind=URL" in err_unnamed


def test_one_line_says_each_engine_and_never_raises():
    with (
        vllm_page("vllm-0.32.0-cpu-metrics-idle.txt", "0.32.0") as new,
        vllm_page("vllm-0.9.1-cpu-metrics.txt", "0.9.1") as old,
    ):
        line = check.one_line([new.url, old.url, closed_port_url()], KnobTable.from_env())
    assert "\n" not in line
    assert "vLLM-CPU 0.32.0 ok" in line and "vLLM-CPU 0.9.1: " in line and "1 renamed" in line
    assert "not checked:" in line and line.startswith("metrics check:")


def test_every_engine_sample_the_rules_and_dashboards_use_is_in_an_adapter():
    """The check's one source stays whole: a name charted or recorded but declared in no adapter would go unchecked."""
    declared = {name for kind in engines.ENGINES.values() for r in kind.readings() for name in r.names}
    prefixes = "|".join(re.escape(k.metrics.prefix) for k in engines.ENGINES.values() if k.metrics)
    used = set()
    for path in [*REPO.glob("prometheus/rules/*.yml"), *REPO.glob("dashboards/json/*.json")]:
        used |= {n.rstrip(":") for n in re.findall(rf"(?:{prefixes})[A-Za-z0-9_:]+", path.read_text())}
    histogram_parts = re.compile(r"_(bucket|sum|count)$")
    missing = {n for n in used if n not in declared and histogram_parts.sub("", n) not in declared}
    assert used and not missing


def test_a_sample_the_exporter_cannot_accept_is_not_called_read(capsys):
    """The check runs the exporter's own collector: a waiting count of -1 is on the page but exported as nothing."""
    with vllm_page("vllm-0.32.0-cpu-metrics-idle.txt", "0.32.0") as engine:
        page = re.sub(
            r"^(vllm:num_requests_waiting\{[^}]*\}) \S+$", r"\1 -1.0", engine.pages["/metrics"][1], flags=re.M
        )
        engine.set_text("/metrics", page)
        code, out, _ = run(capsys, engine.url)
    assert code == 1
    assert f"carries vllm:num_requests_waiting but the exporter gives no {series.REQUESTS_WAITING}" in out


def ollama_engine() -> RecordedEngine:
    engine = RecordedEngine()
    for path, name in (("/api/version", "version"), ("/api/ps", "ps"), ("/api/tags", "tags")):
        engine.pages[path] = (200, fixture(f"ollama-0.12-{name}.json"), "application/json")
    return engine


def test_ollama_is_told_by_its_api_and_read_as_the_exporter_reads_it(capsys):
    with ollama_engine() as engine:
        code, out, err = run(capsys, engine.url)
        del engine.pages["/api/ps"]
        broken, out_broken, _ = run(capsys, f"ollama={engine.url}")
    assert code == 0 and out.startswith("ok: Ollama 0.12"), out + err
    assert broken == 1 and "needed by the exporter" in out_broken and "/api/ps" in out_broken
