"""The run's options read once into typed values (loadgen/runplan.py): the names are the options table's."""

from __future__ import annotations

import dataclasses
from argparse import Namespace

from loadgen import options
from loadgen.knee import KneeOptions
from loadgen.runplan import LoadShape


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
