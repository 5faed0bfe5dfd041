"""loadgen/phase_driver.py: the phases in turn, their users started and let go, records, retries, the knee's next load, a stop."""

from __future__ import annotations

import gevent
from gevent.event import Event

from loadgen.phase_driver import PhaseDriver, Users
from loadgen.scenarios import LoadRun, SequentialPhase, Settings
from loadgen.targets import Target
from servescope.contracts.runfolder import RequestRecord
from servescope.workloads.prompts import load as load_prompts


def settings(instance: str = "vllm") -> Settings:
    target = Target("vllm", instance, "http://127.0.0.1:9", "openai", "/v1/chat/completions")
    return Settings(target, load_prompts("seed3"), max_tokens=4, temperature=0.0, timeout_s=10.0)


def phase(name: str, count: int = 2, instance: str = "vllm") -> SequentialPhase:
    return SequentialPhase(settings(instance), name=name, count=count)


class Journal:
    """Where every part the driver calls writes what it was asked, in one list: the order is the test."""

    def __init__(self) -> None:
        self.steps: list[tuple] = []

    def __call__(self, *step) -> None:
        self.steps.append(step)

    def of(self, kind: str) -> list[tuple]:
        return [s for s in self.steps if s[0] == kind]


class Recorder:
    """The run's recorder (loadgen/recorder.py) without a folder: the phase records and lines, in the journal."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def line(self, text: str) -> None:
        self.journal("line", text)

    def users(self, engine: str, scenario: str, users: int) -> None:
        pass

    def phase(self, record) -> None:
        self.journal("record", record.phase, record.requests)


class FakeUsers(Users):
    """Users that send a phase's requests in a greenlet of their own, each one answered at once; `hold` names the
    phases whose users send nothing (the phase never ends by itself) and `on_start` runs as a phase starts."""

    def __init__(self, journal: Journal, run: LoadRun, hold: tuple[str, ...] = (), on_start=None) -> None:
        self.journal, self.run, self.hold, self.on_start = journal, run, hold, on_start
        self.greenlets: list[gevent.Greenlet] = []

    def admit(self, phase, previous) -> None:
        self.journal("admit", phase.title, previous.title if previous is not None else None)

    def start(self, phase) -> None:
        # The driver makes the phase current before its users start: they read it from the run.
        self.journal("start", phase.title, self.run.phase is phase)
        if self.on_start is not None:
            self.on_start(phase)
        if phase.name not in self.hold:
            self.greenlets.append(gevent.spawn(self.send_all, phase))

    def send_all(self, phase) -> None:
        while (work := phase.next_work()) is not None:
            gevent.sleep(0)
            record = RequestRecord(
                engine="vllm",
                instance=phase.settings.target.instance,
                scenario=phase.scenario,
                phase=work.phase_name,
                api="openai",
                model="m",
                prompt_set="s",
                prompt_set_sha256="x",
                prompt_id=work.prompt.id,
                max_tokens=4,
                started_at=100.0,
                ok=True,
                status=200,
                e2e_s=0.5,
            )
            phase.finished(work, record, 0.5)

    def release(self, phase) -> None:
        self.journal("release", phase.title, phase.title in phase.emitted)  # its records written before

    def halt(self) -> None:
        self.journal("halt")
        gevent.killall(self.greenlets)

    def end(self, complete: bool) -> None:
        self.journal("end", complete)


class Sampler:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def start(self, title: str) -> None:
        self.journal("sampler start", title)

    def stop(self) -> None:
        self.journal("sampler stop")


def driven(phases, journal: Journal, **parts) -> tuple[PhaseDriver, LoadRun, FakeUsers]:
    run = LoadRun(phases, Recorder(journal), folder=parts.pop("folder", None))
    users = FakeUsers(journal, run, hold=parts.pop("hold", ()), on_start=parts.pop("on_start", None))
    return PhaseDriver(run, users, sampler=Sampler(journal), say=lambda text: journal("say", text), **parts), run, users


def test_each_phase_is_made_current_run_recorded_and_let_go_in_turn():
    journal = Journal()
    driver, run, _users = driven([phase("a"), phase("b", count=3)], journal)
    assert driver.drive() == "complete"
    assert journal.steps == [
        ("admit", "a", None),
        ("line", "phase vllm a: 1 user"),  # LoadRun.advance: the phase is current
        ("sampler start", "a"),
        ("start", "a", True),
        ("sampler stop",),
        ("record", "a", 2),
        ("release", "a", True),
        ("admit", "b", "a"),
        ("line", "phase vllm b: 1 user"),
        ("sampler start", "b"),
        ("start", "b", True),
        ("sampler stop",),
        ("record", "b", 3),
        ("release", "b", True),
        ("end", True),
    ]
    assert run.finished and run.failure is None


def test_a_stop_mid_phase_halts_the_users_keeps_what_finished_and_starts_nothing_after():
    journal = Journal()
    interrupted, failed = Event(), Event()
    stops = {"failed": failed, "interrupted": interrupted}
    # Phase b's users never finish: Ctrl-C comes while they are out.
    driver, run, _users = driven(
        [phase("a"), phase("b"), phase("c")],
        journal,
        stops=stops,
        hold=("b",),
        on_start=lambda p: p.name == "b" and gevent.spawn_later(0.01, interrupted.set),
    )
    assert driver.drive() == "interrupted"
    steps = [s for s in journal.steps if s[0] != "line"]
    assert steps[steps.index(("start", "b", True)) :] == [
        ("start", "b", True),
        ("halt",),  # users first, mid-stream, then the sampler's last read
        ("sampler stop",),
        ("halt",),  # the run's end stops every user again (a stop before any phase started has users too)
        ("end", False),
    ]
    assert ("admit", "c", "b") not in journal.steps and not any(s[:2] == ("start", "c") for s in journal.steps)
    assert run.finished  # the last phase closed: c never started


def test_the_first_stop_set_names_the_status_and_a_stop_before_the_first_phase_starts_none():
    journal = Journal()
    interrupted, failed = Event(), Event()
    interrupted.set()
    failed.set()
    driver, _run, _users = driven([phase("a")], journal, stops={"failed": failed, "interrupted": interrupted})
    assert driver.drive() == "failed"
    assert journal.steps == [("halt",), ("end", False)]


def test_ready_is_asked_before_each_phase_with_the_one_before_and_false_ends_the_run_there():
    journal = Journal()
    asked: list[tuple] = []

    def ready(p, previous):
        asked.append((p.name, previous.name if previous else None))
        return p.name != "c"  # c's engine never got ready (the run was stopped during its warm-up)

    driver, _run, _users = driven([phase("a"), phase("b", instance="other"), phase("c")], journal, ready=ready)
    driver.drive()
    assert asked == [("a", None), ("b", "a"), ("c", "b")]
    assert [s[1] for s in journal.of("start")] == ["a", "b"]


class NoiseKeeper:
    """The host-noise keeper (loadgen/trials.py): each phase's watch begun; `noisy` names the phases it flags."""

    def __init__(self, journal: Journal, noisy: set[str]) -> None:
        self.journal, self.noisy, self.current = journal, noisy, None

    def begin(self, target) -> None:
        self.journal("noise begin", target.instance)

    def flags(self) -> list[str]:
        last = [s for s in self.journal.steps if s[0] == "record"][-1][1]
        return ["noisy: 1.9 cores used by hog"] if last in self.noisy else []


def test_a_noisy_phase_runs_again_right_after_itself_up_to_the_retries():
    journal = Journal()
    # a is noisy on its first and second attempt: with one retry it runs twice; b is quiet.
    keeper = NoiseKeeper(journal, noisy={"a", "a.retry1"})
    driver, run, _users = driven([phase("a"), phase("b")], journal, noise=keeper, retries=1)
    assert driver.drive() == "complete"
    assert [p.title for p in run.phases] == ["a", "a.retry1", "b"]
    assert [s[1] for s in journal.of("start")] == ["a", "a.retry1", "b"]
    assert [s[1] for s in journal.of("record")] == ["a", "a.retry1", "b"]
    assert journal.of("say") == [
        ("say", "vllm a: noisy: 1.9 cores used by hog: running it again as a.retry1 (LOADGEN_NOISE_RETRIES=1)")
    ]
    # The watch begins before the phase is current (its window holds all of it).
    assert journal.steps.index(("noise begin", "vllm")) < journal.steps.index(("line", "phase vllm a: 1 user"))


def test_no_retry_without_retries_and_none_for_a_phase_that_is_not_repeated():
    journal = Journal()
    keeper = NoiseKeeper(journal, noisy={"a"})
    driver, run, _users = driven([phase("a")], journal, noise=keeper, retries=0)
    driver.drive()
    assert [p.title for p in run.phases] == ["a"] and not journal.of("say")


class Planner:
    """The knee's search (loadgen/knee.py): judges each finished phase from the folder, hands out the next load."""

    def __init__(self, journal: Journal, loads: list[str]) -> None:
        self.journal, self.loads = journal, loads

    def after(self, finished, folder):
        self.journal("judged", finished.name, finished.title in finished.emitted)
        if not self.loads:
            return None
        nxt = phase(self.loads.pop(0))
        nxt.planner = self
        return nxt


def test_the_knees_next_load_is_appended_after_the_phase_is_judged_from_its_written_records(tmp_path):
    journal = Journal()
    first = phase("knee-1")
    first.planner = Planner(journal, ["knee-2", "knee-3"])
    driver, run, _users = driven([first], journal, folder=tmp_path)
    driver.drive()
    assert [p.name for p in run.phases] == ["knee-1", "knee-2", "knee-3"]
    assert journal.of("judged") == [("judged", "knee-1", True), ("judged", "knee-2", True), ("judged", "knee-3", True)]
    # Judged after its users were let go, before the next phase is admitted.
    steps = journal.steps
    assert steps.index(("release", "knee-1", True)) < steps.index(("judged", "knee-1", True))
    assert steps.index(("judged", "knee-1", True)) < steps.index(("admit", "knee-2", "knee-1"))


def test_without_a_folder_a_planner_is_not_asked():
    journal = Journal()
    first = phase("knee-1")
    first.planner = Planner(journal, ["knee-2"])
    driver, run, _users = driven([first], journal)
    driver.drive()
    assert [p.name for p in run.phases] == ["knee-1"] and not journal.of("judged")


class Annotator:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def phase_done(self, finished) -> None:
        self.journal("annotate", finished.title)


def test_a_finished_phase_is_annotated_and_its_refused_connections_said_after_its_users_go():
    journal = Journal()
    refused = phase("a")
    driver, _run, _users = driven(
        [refused],
        journal,
        annotator=Annotator(journal),
        on_start=lambda p: setattr(p, "backoff_count", 3) or setattr(p, "backoff_s", 0.75),
    )
    driver.drive()
    steps = journal.steps
    release = steps.index(("release", "a", True))
    assert steps[release + 1 : release + 3] == [
        ("annotate", "a"),
        (
            "say",
            "vllm a: the engine refused connections: users waited 3 times, 0.8 s in all, before sending again",
        ),
    ]
