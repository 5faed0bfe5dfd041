"""The exposition reader: its plain-line reading agrees with prometheus_client's on every page, malformed ones too."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servescope.prometheus.exposition import _plain_sample, parse_exposition, prometheus_samples

WANTED = frozenset(("servescope_engine_up", "servescope_requests_running", "vllm:kv_cache_usage_perc"))
EXAMPLES = 300  # a fixed seed and a modest count: the fast suite's (4,000 found nothing more when this was written)


def reference(text: str, wanted: frozenset[str]) -> dict[str, list[tuple[dict[str, str], float]]]:
    """prometheus_client's reading of the page's wanted sample lines (the reader before the plain-line one)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    lines = [ln for ln in text.splitlines() if ln.split("{", 1)[0].split(" ", 1)[0] in wanted]
    if not lines:
        raise ValueError("none on the page")
    for name, labels, value in prometheus_samples("\n".join(lines)):
        out.setdefault(name, []).append((labels, value))
    return out


def outcome(read, text: str):
    """What a reader makes of the page, values by their repr (NaN is no value equal to itself)."""
    try:
        page = read(text, WANTED)
    except (ValueError, OverflowError) as exc:
        return "refused", type(exc).__name__
    return "ok", {name: [(labels, repr(value)) for labels, value in samples] for name, samples in page.items()}


# Pieces of sample lines: the plain form's and every neighbour of it the text format (or a broken page) may hold.
NAMES = st.sampled_from(sorted(WANTED))
LABEL_NAMES = st.sampled_from(["engine", "instance", "model", "le", "__name__", "__x", "a1", "_", "1bad", "é"])
LABEL_VALUES = st.one_of(
    st.sampled_from(["vllm", "", "a b", "x{y}", 'q"uote', "back\\slash", "new\\nline", "ü", ",", "="]),
    st.text(max_size=6),
)
VALUES = st.one_of(
    st.sampled_from(["1", "0", "-1", "1.5", "+Inf", "-Inf", "NaN", "nan", "1e3", "1_0", "0x10", "", "1 2", "abc"]),
    st.sampled_from(["9" * 400, "9" * 5000, "1.0e400", "00012", "+7", ".5", "5."]),
    st.floats(allow_nan=True).map(repr),
    st.integers().map(str),
)
SEPARATORS = st.sampled_from([" ", " ", " ", "  ", "\t", ""])


@st.composite
def sample_line(draw) -> str:
    name = draw(NAMES)
    pairs = draw(st.lists(st.tuples(LABEL_NAMES, LABEL_VALUES), max_size=3))
    inner_separator = draw(st.sampled_from([",", ",", ", ", ",,"]))
    labels = inner_separator.join(f'{k}="{v}"' for k, v in pairs) + draw(st.sampled_from(["", "", ","]))
    braces = draw(st.sampled_from(["{%s}", "{%s}", "%s", "{%s"])) % labels if pairs or draw(st.booleans()) else ""
    tail = draw(st.sampled_from(["", "", "", " 1700000000000", ' # {a="b"} 1', "   "]))
    return f"{name}{braces}{draw(SEPARATORS)}{draw(VALUES)}{tail}"


PAGES = st.lists(
    st.one_of(
        sample_line(),
        st.sampled_from(["# HELP servescope_engine_up up", "# TYPE servescope_engine_up gauge", "", "other_metric 1"]),
    ),
    max_size=6,
).map("\n".join)


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PAGES)
def test_every_page_is_read_as_prometheus_client_reads_it(text):
    assert outcome(parse_exposition, text) == outcome(reference, text)


@pytest.mark.parametrize(
    ("line", "plain"),
    [
        ('servescope_engine_up{engine="vllm",instance="vllm"} 1', ({"engine": "vllm", "instance": "vllm"}, 1.0)),
        ("servescope_requests_running 3.5", ({}, 3.5)),
        (
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} +Inf',
            ({"engine": "0", "model_name": "m"}, float("inf")),
        ),
        ('servescope_engine_up{engine="a b",} 0', ({"engine": "a b"}, 0.0)),
    ],
)
def test_the_lines_the_exporter_and_the_engines_write_take_the_plain_reading(line, plain):
    # Not a detour through prometheus_client: these are the lines every sampler read is made of.
    assert _plain_sample(line) == plain


@pytest.mark.parametrize(
    "line",
    [
        'servescope_engine_up{engine="v\\"llm"} 1',  # an escape
        'servescope_engine_up{engine="vllm", instance="x"} 1',  # a space between labels
        "servescope_engine_up 1 1700000000000",  # a timestamp
        'servescope_engine_up{engine="a",engine="b"} 1',  # a label twice
        'servescope_engine_up{__name__="x"} 1',  # a reserved label
        "servescope_engine_up\t1",
        "servescope_engine_up 1_0",
    ],
)
def test_any_other_line_is_left_to_prometheus_client(line):
    assert _plain_sample(line) is None


@pytest.mark.parametrize(
    "value",
    [
        "1",
        "-0",
        "00012",
        "+7",
        ".5",
        "5.",
        "1e3",
        "NaN",
        "+Inf",
        "-inf",
        "9" * 400,
        "9" * 5000,
        "1.0e400",
        "0x10",
        "1_0",
    ],
)
def test_every_value_is_read_as_prometheus_client_reads_it(value):
    # An integer past a float's range is refused (OverflowError) by both, not read as infinity by one.
    text = f'servescope_engine_up{{engine="vllm"}} {value}'
    assert outcome(parse_exposition, text) == outcome(reference, text)
