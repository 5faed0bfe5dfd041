"""Fuzzed `python -m loadgen` arguments: each is refused in one line (exit 2) or planned within bounds a run can keep.

In-process (loadgen.commands imports no Locust), fixed seed, bounded: the parser and prepare() see
arguments built from the option table with values that are fine, out of range, not numbers, NaN,
infinite, bad URLs, paths for run ids, huge synthetic prompt specs. What they accept must be a run
that cannot loop on a traceback, hang or grow without bound: usable URLs, finite positive times,
bounded users and queues.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen import client as llm
from loadgen import options
from loadgen.commands import USAGE_ERRORS, build_parser, prepare
from loadgen.options import MAX_RUN_S
from loadgen.runplan import RunPlan
from loadgen.scenarios import MAX_USERS, BurstPhase, ClosedLoopPhase, RatePhase, SequentialPhase
from loadgen.verbs import COMMANDS
from servescope.contracts.runfolder import RUN_ID
from servescope.contracts.urls import parse_http_url
from servescope.judgements import arrivals
from servescope.workloads.prompts import MAX_SYNTHETIC_WORDS


def good_or_bad(good: list[str], bad: list[str]) -> st.SearchStrategy[str]:
    """Half the draws from values a user means, half from the ones that must be refused."""
    return st.one_of(st.sampled_from(good), st.sampled_from(bad))


NUMBERS = good_or_bad(
    ["1", "3", "16", "0.5", "2.5e3", " 7 ", "65535", "0"],
    ["-1", "-3", "1e-300", "nan", "inf", "-inf", "1e309", "70000", "99999", "10001", "100001", "abc", ""]
    + ["1_000", "0x10", "٣"],
)
BAD_URLS = st.builds(
    lambda scheme, userinfo, host, port, path: f"{scheme}{userinfo}{host}{port}{path}",
    st.sampled_from(["http://", "https://", "ftp://", ""]),
    st.sampled_from(["", "u:p@", "u:p@ss@", "@"]),
    st.sampled_from(["127.0.0.1", "localhost", "::1", "[::1]", "", "h h"]),
    st.sampled_from(["", ":1", ":8009", ":0", ":65536", ":99999", ":abc", ":-1", ":"]),
    st.sampled_from(["", "/", "/v1", "/x", "/v1/"]),
)
URLS = st.one_of(
    st.sampled_from(["http://127.0.0.1:8009", "http://u:p@127.0.0.1:1/v1", "https://[::1]:8443", "http://h"]), BAD_URLS
)
ENGINES = st.one_of(
    st.sampled_from(["vllm", "llamacpp", "ollama", "vllm:a"]).flatmap(
        lambda kind: st.one_of(st.just(kind), URLS.map(lambda url: f"{kind}={url}"))
    ),
    st.builds(lambda kind, url: f"{kind}={url}", st.sampled_from(["triton", "", "vllm:"]), URLS),
)
TEXT = {
    "--prompts": good_or_bad(
        ["seed3", "seed4", "mixed", "synthetic:16x3", "synthetic:1", "trace"],
        ["synthetic:0x1", "synthetic:131073", "synthetic:1x100001", "synthetic:100000x100", "synthetic:abc"]
        + ["synthetic:" + "9" * 40, "/no/such/file", ""],
    ),
    "--run-id": good_or_bad(
        ["x", "ok-1.2_3", "R" * 128], ["../x", "../../x", "/abs", "a/b", ".", "..", "-a", "x" * 129, ""]
    ),
    "--steps": good_or_bad(["1,2", "1", "4, 8"], ["0", "1,,2", "a", "10001", "", "-1,2"]),
    "--concurrencies": good_or_bad(["1,2", "1", "4, 8"], ["0", "1,,2", "a", "10001", "", "-1,2"]),
    "--http-client": good_or_bad(["geventhttpclient"], ["requests", "curl", ""]),
    "--model": st.sampled_from(["m", "vllm=m", "=", ""]),
    "--grafana-url": URLS,
}


def option_values(option: options.Option) -> st.SearchStrategy[list[str]]:
    if option.switch:
        return st.just([option.flag])
    if option.flag == "--engine":
        values = ENGINES
    elif option.flag in TEXT:
        values = TEXT[option.flag]
    elif option.choices:
        values = good_or_bad(list(option.choices), ["nope", ""])
    else:
        values = NUMBERS
    return values.map(lambda value: [f"{option.flag}={value}"])


@st.composite
def command_lines(draw) -> list[str]:
    command = draw(st.sampled_from(list(COMMANDS)))
    table = options.for_command(command)
    chosen = draw(st.lists(st.sampled_from(table), max_size=4, unique_by=lambda o: o.flag))
    argv = [command]
    if draw(st.integers(0, 9)):  # most runs name an engine; some must be refused for naming none
        argv += draw(option_values(next(o for o in table if o.flag == "--engine")))
    for option in chosen:
        argv += draw(option_values(option))
    return argv


PARSER = build_parser()


@settings(
    max_examples=600,
    deadline=None,
    derandomize=True,  # a fixed seed: the same arguments every run
    suppress_health_check=[HealthCheck.too_slow],
)
@given(argv=command_lines())
def test_fuzzed_arguments_are_refused_in_one_line_or_planned_within_bounds(argv):
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = PARSER.parse_args(argv)
    except SystemExit as exit_:
        err = stderr.getvalue()
        assert exit_.code == 2, (argv, err)
        assert len(err.strip().splitlines()) == 1 and err.startswith("python -m loadgen"), (argv, err)
        return
    try:
        plan = prepare(RunPlan.from_args(args))
    except USAGE_ERRORS as exc:
        assert str(exc) and "\n" not in str(exc), (argv, str(exc))
        return
    check_accepted(args, plan)


def check_accepted(args, plan) -> None:
    assert args.run_id is None or RUN_ID.fullmatch(args.run_id)
    assert 0 <= args.metrics_port <= 65535 and 0 <= args.metrics_linger <= 600 and args.warmup >= 0
    assert 1 <= len(plan.prompt_set) and sum(len(p.text.split()) for p in plan.prompt_set.prompts) <= (
        MAX_SYNTHETIC_WORDS + len(plan.prompt_set)  # + the instruction word in front of each synthetic prompt
    )
    for target in plan.targets:
        parts = parse_http_url(target.url)
        assert parts.port is None or 1 <= parts.port <= 65535
        # What every user builds first: it must not raise (once the cause of an endless traceback loop).
        llm.make_transport(args.http_client, target.url, timeout=args.request_timeout).close()
    assert plan.phases
    for phase in plan.phases:
        s = phase.settings
        assert math.isfinite(s.timeout_s) and 0 < s.timeout_s <= MAX_RUN_S and s.max_tokens >= 1
        assert 0 <= s.think_s <= MAX_RUN_S
        assert math.isfinite(s.temperature) and s.temperature >= 0
        assert 1 <= phase.users <= MAX_USERS
        if isinstance(phase, SequentialPhase):
            assert phase.count >= 1 and phase.issued == 0  # handed out one by one, nothing queued
        elif isinstance(phase, BurstPhase):
            assert phase.rounds >= 1 and math.isfinite(phase.pause_s) and phase.pause_s >= 0
        elif isinstance(phase, ClosedLoopPhase):
            assert phase.duration_s is not None or phase.max_requests is not None
            assert phase.duration_s is None or (math.isfinite(phase.duration_s) and phase.duration_s > 0)
            assert phase.max_requests is None or phase.max_requests >= 1
        elif isinstance(phase, RatePhase) and isinstance(phase.schedule, arrivals.Trace):
            # a replay ends within what a run can take
            last = phase.schedule.offsets_s[-1] / phase.schedule.speed
            assert min(last, phase.duration_s if phase.duration_s is not None else math.inf) <= MAX_RUN_S
        elif isinstance(phase, RatePhase):
            assert math.isfinite(phase.schedule.rate) and phase.schedule.rate > 0
        else:
            pytest.fail(f"unexpected phase {phase!r}")


@functools.cache
def _whole_parser():
    return build_parser()  # built under the test's knobs, as the one built for the command is (PARSER: at import)


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(argv=command_lines())
def test_the_parser_built_for_the_named_command_reads_it_as_the_whole_parser_does(argv):
    """A run builds only its own command's options (build_parser(argv=...)): the same values, the same refusals."""
    outcomes = []
    for parser in (_whole_parser(), build_parser(argv=argv)):
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                outcomes.append(vars(parser.parse_args(argv)))
        except SystemExit as exit_:
            outcomes.append((exit_.code, stderr.getvalue()))
    assert outcomes[0] == outcomes[1], argv
