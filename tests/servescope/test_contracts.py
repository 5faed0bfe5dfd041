"""The shared contracts: knob precedence, the engine registry, the run folder round trip."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from servescope import engines
from servescope.contracts import knob_defaults, knobs, series
from servescope.contracts.runfolder import PhaseRecord, RequestRecord, RunFolder, latest
from servescope.contracts.settings import KnobTable


def test_knob_precedence_environment_over_env_over_defaults(tmp_path):
    (tmp_path / ".env.example").write_text("VLLM_PORT=1\nLLAMACPP_PORT=2\nEXPORTER_PORT=3\n")  # not a source any more
    (tmp_path / ".env").write_text("export LLAMACPP_PORT='9000'\nVLLM_PORT=9001\n# comment\n\nNOT_IN_TABLE=x\n")
    values = knobs.load(tmp_path, environ={"VLLM_PORT": "8010", "ALSO_NOT_IN_TABLE": "y"})
    assert (values["VLLM_PORT"], values["LLAMACPP_PORT"], values["EXPORTER_PORT"]) == ("8010", "9000", "9464")
    assert values["NOT_IN_TABLE"] == "x"  # .env may carry knobs of its own, as before
    assert "ALSO_NOT_IN_TABLE" not in values  # the environment overrides knobs, it does not add them
    assert set(values) - {"NOT_IN_TABLE"} == set(knob_defaults.DEFAULTS)


def test_malformed_env_line_names_file_and_line(tmp_path):
    (tmp_path / ".env").write_text("VLLM_PORT=8009\nthis is not a knob\n")
    with pytest.raises(ValueError, match=r"\.env:2"):
        knobs.load(tmp_path, environ={})


def test_an_env_file_named_in_the_environment_replaces_the_checkouts(tmp_path):
    (tmp_path / ".env").write_text("VLLM_PORT=9001\nLLAMACPP_PORT=9002\n")
    elsewhere = tmp_path / "elsewhere.env"
    elsewhere.write_text("VLLM_PORT=7001\n")
    values = knobs.load(tmp_path, environ={"SERVESCOPE_ENV_FILE": str(elsewhere)})
    assert (values["VLLM_PORT"], values["LLAMACPP_PORT"]) == ("7001", "8081")
    with pytest.raises(ValueError, match="missing.env: SERVESCOPE_ENV_FILE names no file"):
        knobs.load(tmp_path, environ={"SERVESCOPE_ENV_FILE": str(tmp_path / "missing.env")})


def test_a_relative_path_knob_is_under_the_checkout_or_else_the_working_directory(tmp_path, monkeypatch):
    assert knobs.under_root(Path("results")) == knobs.REPO_ROOT / "results"  # this checkout, whatever the cwd
    assert knobs.under_root(tmp_path / "r") == tmp_path / "r"
    site = tmp_path / "site-packages"  # an installed servescope: no pyproject.toml beside its packages
    site.mkdir()
    monkeypatch.setattr(knobs, "REPO_ROOT", site)
    monkeypatch.chdir(tmp_path)
    assert knobs.under_root(Path("results")) == tmp_path / "results"


def test_every_engine_port_knob_is_documented_in_env_example():
    documented = knob_defaults.DEFAULTS
    for kind in engines.ENGINES.values():
        assert kind.port_env in documented, kind.name
        assert kind.port_in(KnobTable.from_env()) > 0
    assert documented["VLLM_PORT"] == "8009"  # the reference page's port
    assert documented["SERVESCOPE_BIND"] == "127.0.0.1"


def test_unknown_engine_kind_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown engine kind 'triton'"):
        engines.kind("triton")


def test_series_names_are_distinct_valid_and_do_not_collide_on_the_wire():
    """Two constants naming one series, a name Prometheus refuses, or a name that is another one's sample on the page
    (x and x_count, x_total, x_created) would merge or break series on the exposition page."""
    names = [v for k, v in vars(series).items() if k.isupper() and isinstance(v, str) and k != "PREFIX"]
    assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)
    for name in names:
        assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name), name
    clashes = []
    for name in names:
        base = name.removesuffix("_total")  # a counter's family name; its samples are _total and _created
        samples = {base, *(base + suffix for suffix in ("_bucket", "_sum", "_count", "_created", "_total"))}
        clashes += [(name, other) for other in names if other != name and other in samples]
    assert not clashes, clashes


def test_run_folder_round_trip_and_torn_last_line(tmp_path):
    run = RunFolder.create(tmp_path, "20261130-000000-1")
    record = RequestRecord(
        engine="vllm",
        instance="vllm",
        scenario="burst",
        phase="burst-1",
        api="openai",
        model="m",
        prompt_set="seed3",
        prompt_set_sha256="abc",
        prompt_id="p1",
        max_tokens=48,
        started_at=1.0,
        ok=True,
        status=200,
        ttft_s=0.1,
        e2e_s=0.5,
        itl_s=[0.01, 0.02],
        output_tokens=3,
    )
    run.append_request(record)
    run.append_phase(PhaseRecord("vllm", "vllm", "burst", "burst-1", 1.0, 3.5, 1, 3, "seed3", "abc", 48))
    run.write_manifest({"run_id": "x"})
    with open(run.path / "requests.jsonl", "a") as fh:
        fh.write('{"engine": "vll')  # killed mid-write
    with pytest.warns(UserWarning, match="torn last record"):
        records = list(run.requests())
    assert records == [record]
    (phase,) = run.phases()
    assert phase.wall_s == pytest.approx(2.5)
    assert json.loads((run.path / "phases.jsonl").read_text())["wall_s"] == pytest.approx(2.5)
    assert latest(tmp_path).path == run.path
    assert run.manifest()["schema_version"] == 1


def test_the_knob_files_are_generated_from_the_table_and_fresh():
    """.env.example and docs/knobs.md are servescope/contracts/knob_defaults.py's table: every knob, its default, its comment."""
    from servescope.contracts import knob_table

    assert knob_table.main(["--check"]) == 0, "stale: python -m servescope.contracts.knob_table --write"
    page = knob_table.PAGE.read_text()
    assert all(f"| `{k}` |" in page for k in knob_defaults.DEFAULTS)
    assert "| `LOADGEN_CAPACITY_PROMPTS` | `synthetic:256` |" in page
    assert knobs.parse_env_file(knob_table.ENV_EXAMPLE) == knob_defaults.DEFAULTS  # the file reads back as the table


def test_a_stale_knob_file_is_named(tmp_path, monkeypatch, capsys):
    from servescope.contracts import knob_table

    monkeypatch.setattr(knob_table, "ENV_EXAMPLE", tmp_path / ".env.example")
    monkeypatch.setattr(knob_table, "PAGE", tmp_path / "docs" / "knobs.md")
    assert knob_table.main(["--write"]) == 0 and knob_table.main(["--check"]) == 0
    text = knob_table.ENV_EXAMPLE.read_text()
    knob_table.ENV_EXAMPLE.write_text(text.replace("VLLM_PORT=8009", "VLLM_PORT=8010"))
    assert knob_table.main(["--check"]) == 1
    assert (
        capsys.readouterr().err.strip()
        == f"{tmp_path / '.env.example'} is stale: run python -m servescope.contracts.knob_table --write"
    )


def test_the_knob_table_has_each_name_once_and_the_help_as_comments():
    names = [knob.name for knob in knob_defaults.KNOBS]
    assert len(names) == len(set(names)) and all(name.isidentifier() and name.isupper() for name in names)
    from servescope.contracts import knob_table

    text = knob_table.env_example()
    assert (
        "# Prompt set: sequential4, burst3, mixed" in text
        and "\n# empty model: what the engine lists.\nLOADGEN_PROMPTS=" in text
    )
    assert "\n\n# `servescope replicas" in text  # a paragraph of its group keeps its blank line


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_a_run_folder_is_its_owners_alone_whatever_the_umask(tmp_path, umask):
    """A manifest holds engine URLs and prompts, the records what was asked: no other user may list or read them."""
    previous = os.umask(umask)
    try:
        folder = RunFolder.create(tmp_path / "results", "run")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(folder.path.stat().st_mode) == 0o700
    folder.append_request(
        RequestRecord("vllm", "vllm", "burst", "burst-1", "openai", "m", "s", "h", "p", 8, 1e9, True, 200)
    )
    assert (folder.path / "requests.jsonl").exists()
