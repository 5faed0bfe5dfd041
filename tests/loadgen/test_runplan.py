"""The run's options read once into typed values (loadgen/runplan.py): the names are the options table's."""

from __future__ import annotations

import ast
import dataclasses
from argparse import Namespace
from pathlib import Path

import loadgen
from loadgen import options
from loadgen.knee import KneeOptions
from loadgen.runplan import LoadShape, RunPlan


def test_every_typed_option_is_a_row_of_the_options_table():
    dests = {o.dest for o in options.OPTIONS}
    shape = {f.name for f in dataclasses.fields(LoadShape)} - {"knee"}
    knee = {f.name for f in dataclasses.fields(KneeOptions)}
    assert shape <= dests and knee <= dests, (shape - dests, knee - dests)


def test_a_field_the_web_ui_left_empty_reads_as_not_given_and_the_rest_as_typed():
    form = Namespace(duration="", requests="12", rate="2.5", burst_size="4", arrivals="poisson")
    shape = LoadShape.from_options(form)
    assert (shape.duration, shape.requests, shape.rate, shape.burst_size) == (None, 12, 2.5, 4)
    assert shape.arrivals == "poisson" and shape.knee is None  # a namespace without the knee's options


def test_the_command_lines_options_read_as_the_parser_typed_them():
    from loadgen.commands import build_parser

    args = build_parser().parse_args(
        ["knee", "--engine", "vllm=http://127.0.0.1:9", "--over", "rate", "--max-load", "8"]
    )
    shape = LoadShape.from_options(args)
    assert shape.knee is not None and (shape.knee.over, shape.knee.max_load) == ("rate", args.max_load)
    assert shape.burst_size is None  # knee takes no --burst-size


# Where a namespace of options may be a parameter: the parsers and what turns their namespace into a RunPlan.
BOUNDARY = {"cli.py", "options.py", "locustfile.py"}


def _takes_a_namespace(function) -> bool:
    params = [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
    return any(
        p.arg in ("args", "namespace") or (p.annotation is not None and "Namespace" in ast.unparse(p.annotation))
        for p in params
    )


def test_no_function_past_the_boundary_takes_the_namespace():
    root = Path(loadgen.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() in BOUNDARY:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _takes_a_namespace(node):
                found.append(f"{path.relative_to(root)} {node.name}")
    # RunPlan.from_args: where the namespace becomes the plan; quick.py's Settings.of: its own command line's
    assert found == ["quick.py of", "runplan.py from_args"], found


def _knee_plan(*extra: str) -> RunPlan:
    from loadgen.commands import build_parser

    argv = ["knee", "--engine", "vllm=http://127.0.0.1:9", "--model", "m1", "--prompts", "synthetic:64", *extra]
    return RunPlan.from_args(build_parser().parse_args(argv))


def test_a_plan_read_back_from_its_json_is_the_same_plan():
    plan = _knee_plan("--over", "rate", "--max-load", "8", "--slo", "ttft_p95<=2")
    again = RunPlan.from_json(plan.to_json())
    assert again == plan
    assert again.shape.knee.over == "rate" and again.models == ("m1",) and again.slo == "ttft_p95<=2"
    # The fresh set's seed was written in once: the workers draw the master's prompts.
    assert plan.prompts.startswith("synthetic:64,seed=") and again.prompts == plan.prompts


def test_a_worker_reads_the_plan_with_its_own_engines():
    plan = _knee_plan()
    mine = RunPlan.from_json(plan.to_json(), engines=["vllm=http://u:p@127.0.0.1:9"])
    assert mine.engines == ("vllm=http://u:p@127.0.0.1:9",) and mine.shape == plan.shape


def test_the_web_ui_form_reads_into_the_same_plan_with_its_host_as_the_engine():
    form = Namespace(scenario="burst", engine="llamacpp", engine_url="", model="", prompts="seed3", burst_size="4")
    plan = RunPlan.from_args(form, host="http://127.0.0.1:8011", fresh_prompts=False)
    assert plan.command == "burst" and plan.engines == ("llamacpp=http://127.0.0.1:8011",)
    assert plan.models == () and plan.shape.burst_size == 4 and plan.prompts == "seed3"
