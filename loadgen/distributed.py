"""Load from several processes as one load generator: `python -m loadgen ... --workers N` and Compose's Locust workers.

Locust's MasterRunner dispatches the users to its WorkerRunners; these messages (Locust's custom messages,
delivered in order per worker) make the workers one load generator with one run folder:

  master -> worker  PHASE {index, name}        the phase now current (sent once its users are dispatched)
  worker -> master  READY {index, round 0, users, clock}    its users of the phase exist
  master -> worker  GO {index, round 0, share} every worker is ready: its part of the phase (Share), start
  worker -> master  READY {index, round R, ended}           a burst: all its users are at round R's barrier
  master -> worker  GO {index, round R}        every worker's users are: release round R (one barrier)
  master -> worker  STOP {index}               a timed closed-loop phase is over (the master's clock)
  worker -> master  BEGIN {key, ...}           a closed- or open-loop request is about to go out
  worker -> master  RECORD {key, record}       a request finished: its raw record
  worker -> master  DONE {index, sent}         its part of the phase is over, `sent` records forwarded
  worker -> master  CLOCK_PROBE {t1};  master -> worker  CLOCK_REPLY {t1, t2}

The split: a burst's users are spread by Locust; a worker's users take the prompts after those of the
workers before it (the matched set, each prompt once per round). Closed-loop users send their requests
per user (`--requests`) or until the master's clock ends the step. Open loop: every worker draws the whole
schedule (same seed, started by the master's GO) and sends every W-th arrival from its place.

No request is lost with a worker. The master knows every request in flight: a burst's from the release
(each worker's users and prompts), others from their BEGIN. When Locust stops hearing a worker's heartbeat
(about 4 s) or it quits mid-phase, each of its requests still in flight is written as failed with
error_kind "worker_lost", and the phase goes on with the other workers.

Clocks. TTFT, ITL and E2E are differences of one worker's monotonic clock (kernel receive stamps): exact
whatever the hosts. A record's started_at (epoch seconds) is the worker's time.time() at send, put on the
master's clock: before each phase a worker asks the master's time CLOCK_PROBES times (NTP's way: offset =
master time - the probe's midpoint, from the probe with the shortest round trip; its error is at most half
that round trip). On one host every process reads the same clock: an estimate within that bound is taken as
0 and nothing is shifted. Across hosts (Compose on several machines) the offset is applied, and its bound is
stated per worker in the manifest (`workers`). A burst round is released by the master's GO, on receipt by
each worker: the skew between workers is the message's delivery, not the clocks' difference.

Clock steps. The offset holds while the worker's epoch clock less its monotonic clock stays what it was at the
probe (NTP slews both alike; only a step, settimeofday or an NTP step, changes it). A worker reads that difference
with every stamp: past CLOCK_STEP_S it takes the step out (its stamps put on the master's clock from its monotonic
clock), probes the master's clock again and tells the master (CLOCK_STEP: a line, and `clock_steps_s` in the
manifest). The master checks every record against its phase's window on its own clock (started after the phase
began there, ended before it arrived): one outside it is put on the master's clock as it arrived (its end: then),
counted (`records_put_on_master_clock`), and its worker is asked to probe again (CLOCK_CHECK). A burst round's end
later than the master's now is taken as now: a moved clock never stretches a pause.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import gevent
from gevent.event import AsyncResult, Event
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner

from loadgen import master_port
from loadgen.client import ErrorKind
from loadgen.clock_sync import clock_offset
from loadgen.master_port import checked, integer, key, mapping, number, optional, text
from loadgen.phase_driver import Users
from loadgen.recorder import Recorder
from loadgen.runplan import RunPlan
from loadgen.scenarios import (
    MAX_USERS,
    BurstPhase,
    LoadRun,
    Phase,
    Share,
    Work,
)
from servescope.contracts.runfolder import MAX_EPOCH_S, REQUEST_FIELDS, RequestRecord, check_fields, open_append
from servescope.host import children
from servescope.text import words

PLAN = "servescope_plan"  # master -> worker (`--workers N` only): the run's plan and the probed engines
LISTENING = "servescope_listening"  # worker -> master (`--workers N`): its handlers are in, the plan may come
PHASE = "servescope_phase"
READY = "servescope_ready"
GO = "servescope_go"
STOP = "servescope_stop"
BEGIN = "servescope_begin"
RECORD = "servescope_record"
DONE = "servescope_done"
CLOCK_PROBE = "servescope_clock_probe"
CLOCK_REPLY = "servescope_clock_reply"
CLOCK_STEP = "servescope_clock_step"  # worker -> master: its clock stepped (or was asked to probe again), probed anew
CLOCK_CHECK = "servescope_clock_check"  # master -> worker: a record of yours left its phase's window: probe again

CLOCK_PROBES = 5
CLOCK_PROBE_TIMEOUT_S = 2.0
# The epoch clock less the monotonic one changes only when the epoch clock is stepped (NTP slews both alike on Linux):
# a change past this is a step, and a worker's stamps are then put on the master's clock from its monotonic clock.
CLOCK_STEP_S = 0.05
# A record the master receives must have started after its phase began on the master and ended before it arrived,
# within this (plus the worker's clock bound): else its worker's clock moved, and it is put on the master's clock.
WINDOW_SLACK_S = 0.5
WATCH_S = 0.25  # how often the master looks for workers Locust no longer hears
WORKER_START_TIMEOUT_S = 120.0  # `--workers N`: for all N processes to start and connect (Locust's import is slow)
DRAIN_S = 10.0  # after a stop, for the workers' interrupted records to arrive
QUIT_S = 10.0  # for the workers to quit when told, before they are stopped (servescope/host/children.py's schedule)
WORKERS_LOG = "workers.log"  # `--workers N`: in the run folder, what the worker processes printed

Key = tuple[int, int, int]  # (phase index, burst round or 0, arrival index in a burst or the worker's own count)

# What each worker -> master message may hold (master_port.checked: field -> (check, required)); anything else in it
# is not read, and a message that breaks these costs itself.
CLOCK_FIELDS = {
    "host": (text, False),
    "pid": (integer(), False),
    "offset": (number(), True),
    "estimate": (number(), False),
    "bound": (number(0), False),
}
READY_FIELDS = {
    "index": (integer(), True),
    "round": (integer(), True),
    "users": (integer(0, MAX_USERS), False),
    "clock": (mapping(CLOCK_FIELDS), False),
    "ended": (number(0, MAX_EPOCH_S), False),
    "error": (text, False),
}
BEGIN_FIELDS = {
    "key": (key, True),
    "phase": (text, True),
    "prompt_id": (text, True),
    "arrival": (optional(integer()), False),
    "at": (number(0, MAX_EPOCH_S), True),
}
RECORD_FIELDS = {"key": (key, True), "record": (lambda record: record, True)}  # the record: the run folder's contract
DONE_FIELDS = {"index": (integer(), True), "sent": (integer(), True), "scheduled": (integer(), False)}
PROBE_FIELDS = {"t1": (number(), True)}
STEP_FIELDS = {"index": (integer(), True), "step": (number(), False), "clock": (mapping(CLOCK_FIELDS), True)}


def locust_options(**values: Any) -> argparse.Namespace:
    """Locust's own option defaults (its runners read some: enable_rebalancing, web_base_path), with `values`."""
    from locust import argument_parser

    parser = argument_parser.get_empty_argument_parser(add_help=False, default_config_files=[])
    argument_parser.setup_parser_arguments(parser)
    options = parser.parse_args(args=[])
    vars(options).update(values)
    return options


# ---------------------------------------------------------------- the master's side


@dataclass
class _Worker:
    """What the master knows of one worker process."""

    id: str  # Locust's client id
    index: int  # Locust's worker index: the `worker` of its records
    host: str = ""
    pid: int | None = None
    offset_s: float = 0.0  # added to its epoch stamps (0: the master's clock, within the bound)
    estimate_s: float | None = None
    bound_s: float | None = None
    lost: str | None = None  # why it was given up on
    in_flight: dict[Key, dict] = field(default_factory=dict)  # what to write for each request if it is lost
    received: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # records per phase index
    records: int = 0
    clock_steps: list[float] = field(default_factory=list)  # the steps its clock made, as it measured them
    outside: int = 0  # its records that arrived stamped outside their phase: put on the master's clock on arrival
    checked: set[int] = field(default_factory=set)  # phases it was asked to probe its clock again in

    def describe(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "host": self.host,
            "pid": self.pid,
            "clock_offset_s": self.offset_s,
            "clock_estimate_s": self.estimate_s,
            "clock_bound_s": self.bound_s,
            "records": self.records,
            "lost": self.lost,
            "clock_steps_s": self.clock_steps,
            "records_put_on_master_clock": self.outside,
        }


class _Step:
    """One phase as the master runs it across its workers."""

    def __init__(self, index: int, phase: Phase, participants: set[str]):
        self.index, self.phase = index, phase
        self.participants = participants  # the workers connected when it started
        self.users: dict[str, int] = {}  # worker id -> its users of the phase
        self.shares: dict[str, dict] = {}
        self.ready: dict[int, dict[str, dict]] = defaultdict(dict)  # round -> worker id -> READY
        self.released: set[int] = set()
        self.done: dict[str, int] = {}  # worker id -> records it says it sent
        self.started_at: float | None = None  # the master's clock when it told every worker to start
        self.scheduled = 0  # an open-loop phase: the arrivals of the whole schedule, as the workers walked it
        self.lost: list[int] = []  # the workers lost while it ran (their indexes)
        self.stop_timer: gevent.Greenlet | None = None


class Coordinator:
    """The master's side: each phase started and ended on every worker, one barrier per burst round, the workers'
    records into the run (the master's recorder), and a lost worker's requests in flight written as failed."""

    def __init__(
        self,
        runner: MasterRunner,
        say: Callable[[str], None] | None = None,
        warn: Callable[[str], None] | None = None,
        admitted: set[str] | None = None,
    ):
        """admitted: the identities of the workers this master started (None: any that connects, as Locust does)."""
        self.runner = runner
        self.say = say or (lambda text: None)  # progress (each worker's clock)
        self.warn = warn or self.say  # a worker lost, a message dropped
        self.guard = master_port.PortGuard(runner, self.warn, admitted)
        self.run: LoadRun | None = None
        self.workers: dict[str, _Worker] = {}
        self.step: _Step | None = None
        self.unsent: dict[str, int] = {}  # phase -> requests never sent because a worker was lost in it
        self.step_starts: dict[int, float] = {}  # phase index -> the master's clock when it started on the workers
        for name, handler in (
            (READY, self._on_ready),
            (BEGIN, self._on_begin),
            (RECORD, self._on_record),
            (DONE, self._on_done),
            (CLOCK_PROBE, self._on_clock_probe),
            (CLOCK_STEP, self._on_clock_step),
        ):
            runner.register_message(name, handler)
        self._watcher = gevent.spawn(self._watch)

    def attach(self, run: LoadRun) -> None:
        """A new run (the web UI's START): its records go to `run`; what was known of the last one is forgotten."""
        self.run, self.step, self.workers, self.unsent, self.step_starts = run, None, {}, {}, {}
        self.guard.dropped.clear()

    def close(self) -> None:
        self._watcher.kill(block=False)

    def live(self) -> list[str]:
        """Connected workers Locust still hears and this run has not given up on, in Locust's worker order."""
        ids = [
            c.id
            for c in self.runner.clients.values()
            if c.state != STATE_MISSING and not (c.id in self.workers and self.workers[c.id].lost)
        ]
        return sorted(ids, key=self.runner.get_worker_index)

    def describe(self) -> list[dict[str, Any]]:
        """The workers of the run, for the manifest."""
        return [w.describe() for w in sorted(self.workers.values(), key=lambda w: w.index)]

    def summary(self) -> dict[str, Any]:
        """For the manifest's `distributed`: the messages the port dropped, by reason, and each phase's requests
        never sent because a worker was lost in it."""
        return {"dropped_messages": self.guard.describe(), "unsent": dict(self.unsent)}

    def dropped_line(self) -> str | None:
        """One line for the end of the run when the port dropped anything."""
        dropped = self.guard.describe()
        if not dropped:
            return None
        return f"load generator workers' port: {words.count(sum(dropped.values()), 'message')} dropped (by reason in the manifest)"

    # -- phases --
    def prepare(self, phase: Phase) -> None:
        """Before the phase's users are dispatched: an open-loop phase runs one schedule user per worker."""
        if phase.open_loop:
            phase.users = max(1, len(self.live()))

    def start(self, phase: Phase) -> None:
        """The phase's users are dispatched: tell the workers, which report their users when they are in."""
        participants = self.live()
        self.step = _Step(self.run.index, phase, set(participants))
        for wid in participants:
            self._worker(wid)
            self.runner.send_message(PHASE, {"index": self.step.index, "name": phase.title}, client_id=wid)
        if not participants:
            self.run.abort("no load generator worker is connected")

    def finish(self) -> None:
        """The run is over: workers end theirs."""
        if self.run is not None:
            self.runner.send_message(PHASE, {"index": len(self.run.phases), "name": None})

    def drain(self, timeout: float = DRAIN_S) -> None:
        """After a stop: wait for the workers' last (interrupted) records; what never came is written as failed."""
        deadline = time.monotonic() + timeout
        while any(w.in_flight for w in self.workers.values() if not w.lost) and time.monotonic() < deadline:
            gevent.sleep(0.05)
        for w in self.workers.values():
            self._write_unreported(w, ErrorKind.INTERRUPTED, "the run stopped before its worker reported it")

    # -- messages --
    def _worker(self, wid: str) -> _Worker:
        if wid not in self.workers:
            self.workers[wid] = _Worker(wid, self.runner.get_worker_index(wid))
        return self.workers[wid]

    def _fields(self, msg, spec: dict, what: str) -> dict[str, Any] | None:
        """The message's data as `spec` says, or None: dropped, counted, said once per reason."""
        try:
            return checked(msg.data, spec)
        except ValueError as exc:
            self.guard.drop(f"a {what} message with a bad field ({exc})")
            return None

    def _sender(self, msg, what: str) -> _Worker | None:
        """The worker of this run a message is from; None (dropped) for any other sender, None (quietly) for a
        worker given up on, whose requests were written as lost already."""
        worker = self.workers.get(msg.node_id)
        if worker is None or self.run is None:
            self.guard.drop(f"a {what} message from no worker of this run")
            return None
        return None if worker.lost else worker

    def _current(self, msg, what: str, spec: dict) -> tuple[_Step, _Worker, dict] | tuple[None, None, None]:
        """The step and worker a phase message is about, and its fields; none when stale, bad or from a worker
        given up on."""
        worker = self._sender(msg, what)
        data = self._fields(msg, spec, what) if worker is not None else None
        step = self.step
        if data is None or step is None or data["index"] != step.index or worker.id not in step.participants:
            return None, None, None
        return step, worker, data

    def _on_ready(self, environment, msg, **_kw) -> None:
        step, worker, data = self._current(msg, "ready", READY_FIELDS)
        if step is None:
            return
        if data["error"]:
            self.run.abort(f"load generator worker {worker.index}: {data['error']}")
            return
        if data["round"] == 0 and data["users"] is None:
            self.guard.drop("a ready message with a bad field (users: missing)")
            return
        if data["clock"]:
            self._clock(worker, data["clock"])
        if data["round"] == 0:
            step.users[worker.id] = data["users"]
        step.ready[data["round"]][worker.id] = data
        self._try_release(data["round"])

    def _on_begin(self, environment, msg, **_kw) -> None:
        step, worker, data = None, self._sender(msg, "begin"), None
        if worker is not None:
            data = self._fields(msg, BEGIN_FIELDS, "begin")
        if data is None:
            return
        step = self.step
        index, round_no, _ = data["key"]
        if step is None or index != step.index or round_no != 0 or worker.id not in step.participants:
            self.guard.drop("a begin message for no phase its worker runs")
            return
        worker.in_flight[data["key"]] = {**data, "key": list(data["key"])}

    def _on_record(self, environment, msg, **_kw) -> None:
        worker = self._sender(msg, "record")
        data = self._fields(msg, RECORD_FIELDS, "record") if worker is not None else None
        if data is None:
            return
        entry = worker.in_flight.get(data["key"])
        if entry is None:  # never begun, or already written (lost, the run stopped): not a second record of it
            self.guard.drop("a record of no request in flight on its worker")
            return
        index = data["key"][0]
        try:
            record = RequestRecord(**check_fields(data["record"], REQUEST_FIELDS))
            if record.phase != entry["phase"]:
                raise ValueError(f"phase {record.phase!r}, sent as {entry['phase']!r}")
        except (ValueError, TypeError) as exc:
            # Its own worker's: the request went out. Its measurement is not kept, the request is (as failed).
            self.guard.drop(f"a record that breaks the run folder's contract ({exc})")
            del worker.in_flight[data["key"]]
            worker.received[index] += 1
            self._write_failed(
                worker,
                entry,
                ErrorKind.OTHER,
                f"load generator worker {worker.index} sent a record that breaks the run folder's contract ({exc}); "
                f"its measurement is not kept",
            )
            self._check_done()
            return
        record.worker = worker.index
        self._within_phase(worker, record, index)
        del worker.in_flight[data["key"]]
        worker.received[index] += 1
        worker.records += 1
        self._write(record, index)
        self._check_done()

    def _on_done(self, environment, msg, **_kw) -> None:
        step, worker, data = self._current(msg, "done", DONE_FIELDS)
        if step is not None:
            step.done[worker.id] = data["sent"]
            step.scheduled = max(step.scheduled, data["scheduled"] or 0)
            self._check_done()

    def _within_phase(self, worker: _Worker, record: RequestRecord, index: int) -> None:
        """A record must have started after its phase began here and ended before it arrived. One outside that window
        (its worker's clock stepped, and the worker did not see it) is put on the master's clock as it arrives (its
        end: now), and the worker is asked to probe the master's clock again, once per phase."""
        now, began = time.time(), self.step_starts.get(index)
        slack = WINDOW_SLACK_S + (worker.bound_s or 0.0)
        took = record.e2e_s or 0.0
        if began is None or began - slack <= record.started_at and record.started_at + took <= now + slack:
            return
        shift = (now - took) - record.started_at
        record.started_at += shift
        if record.scheduled_at is not None:
            record.scheduled_at += shift
        worker.outside += 1
        if index not in worker.checked:
            worker.checked.add(index)
            self.warn(
                f"load generator worker {worker.index}: a record stamped {-shift:+.3f} s off its phase's window on "
                f"the master's clock: put on the master's clock as it arrived; its clock is probed again"
            )
            self.runner.send_message(CLOCK_CHECK, {"index": index}, client_id=worker.id)

    def _on_clock_step(self, environment, msg, **_kw) -> None:
        worker = self._sender(msg, "clock step")
        data = self._fields(msg, STEP_FIELDS, "clock step") if worker is not None else None
        if data is None:
            return
        if data["step"] is not None and abs(data["step"]) > CLOCK_STEP_S:
            worker.clock_steps.append(data["step"])
            self.warn(
                f"load generator worker {worker.index}: its clock stepped {data['step']:+.3f} s; its stamps are put "
                f"on the master's clock from its monotonic clock, and it probed the master's clock again"
            )
        self._clock(worker, data["clock"])

    def _on_clock_probe(self, environment, msg, **_kw) -> None:
        worker = self._sender(msg, "clock probe")
        data = self._fields(msg, PROBE_FIELDS, "clock probe") if worker is not None else None
        if data is not None:
            self.runner.send_message(CLOCK_REPLY, {"t1": data["t1"], "t2": time.time()}, client_id=worker.id)

    def _clock(self, worker: _Worker, clock: dict) -> None:
        first = worker.bound_s is None
        worker.host, worker.pid = clock.get("host") or "", clock.get("pid")
        worker.offset_s, worker.estimate_s, worker.bound_s = clock["offset"], clock["estimate"], clock["bound"]
        if first and worker.bound_s is not None:
            same = "one clock with the master's" if worker.offset_s == 0 else f"shifted {worker.offset_s:+.4f} s"
            self.say(
                f"worker {worker.index}: pid {worker.pid} on {worker.host}, {same} (offset estimate "
                f"{worker.estimate_s * 1000:+.3f} ms, bound ±{worker.bound_s * 1000:.3f} ms)"
            )

    # -- barriers --
    def _members(self, step: _Step, round_no: int) -> list[str]:
        """Who a round waits for: every participant to start the phase; a burst's workers with users after that."""
        live = self.live()
        if round_no == 0:
            return [w for w in live if w in step.participants]
        return [w for w in live if step.users.get(w, 0) > 0]

    def _try_release(self, round_no: int) -> None:
        step = self.step
        if step is None or round_no in step.released or step.phase.done.is_set():
            return
        members = self._members(step, round_no)
        if any(w not in step.ready[round_no] for w in members):
            return
        step.released.add(round_no)
        if round_no == 0:
            self._start_phase(step, members)
        else:
            gevent.spawn(self._release_round, step, round_no, members)

    def _start_phase(self, step: _Step, members: list[str]) -> None:
        phase = step.phase
        with_users = [w for w in members if step.users.get(w, 0) > 0]
        first = 0
        for place, wid in enumerate(with_users):
            users = step.users[wid]
            step.shares[wid] = _share_message(phase.worker_share(users, first, place, len(with_users)))
            first += users
        step.started_at = self.step_starts[step.index] = time.time()
        for wid in members:
            share = step.shares.get(wid, {"users": 0})
            self.runner.send_message(GO, {"index": step.index, "round": 0, "share": share}, client_id=wid)
        phase.start_clock()  # the step's clock: from the moment every worker was told to start
        if phase.master_clock_s is not None:
            step.stop_timer = gevent.spawn_later(phase.master_clock_s, self._stop, step)
        self._check_done()  # no users anywhere: nothing to wait for

    def _release_round(self, step: _Step, round_no: int, members: list[str]) -> None:
        phase: BurstPhase = step.phase
        if round_no > 1 and phase.pause_s > 0:
            # The pause runs from the end of the previous round on every worker (their clocks are the master's). An
            # end later than now is a worker clock that moved: the round cannot have ended after its last READY.
            now = time.time()
            ended = [min(d["ended"], now) for d in step.ready[round_no].values() if d.get("ended") is not None]
            gevent.sleep(max(0.0, (max(ended) if ended else now) + phase.pause_s - time.time()))
        if self.step is not step:
            return
        released_at = time.time()
        name = phase.round_name(round_no)
        released = sum(step.shares[wid]["users"] for wid in members if not self.workers[wid].lost)
        # The round's record says how many went at once: fewer than the burst's size once a worker was lost.
        phase.span(name).concurrency = released
        for wid in members:
            worker, share = self.workers[wid], step.shares[wid]
            if worker.lost:
                continue
            for index in range(share["first"], share["first"] + share["users"]):
                worker.in_flight[(step.index, round_no, index)] = {
                    "key": [step.index, round_no, index],
                    "phase": name,
                    "prompt_id": phase.prompt(index).id,
                    "arrival": index,
                    "at": released_at,
                }
            self.runner.send_message(GO, {"index": step.index, "round": round_no}, client_id=wid)

    def _stop(self, step: _Step) -> None:
        if self.step is step:
            for wid in self._members(step, 0):
                self.runner.send_message(STOP, {"index": step.index}, client_id=wid)

    def _check_done(self) -> None:
        step = self.step
        if step is None or step.phase.done.is_set() or 0 not in step.released:
            return
        for wid in self._members(step, 0):
            sent = step.done.get(wid)
            if sent is None or self.workers[wid].received[step.index] < sent:
                return
        if step.stop_timer is not None:
            step.stop_timer.kill(block=False)
        if step.lost:
            self._count_unsent(step)
        step.phase.done.set()

    def _count_unsent(self, step: _Step) -> None:
        """A phase a worker was lost in: how many of its requests were never sent (the lost worker's share after it
        went), from what the phase should have sent and what was written (sent, or in flight and lost)."""
        phase = step.phase
        expected = phase.expected_requests(step.scheduled)
        lost = ", ".join(str(i) for i in step.lost)
        if expected is None:
            self.warn(f"{phase.title}: load generator worker {lost} lost; its users sent nothing more in it")
            return
        written = sum(span.requests for span in phase.spans.values())
        if expected > written:
            self.unsent[phase.title] = expected - written
            self.warn(
                f"{phase.title}: {expected - written} of {expected} requests never sent (load generator worker "
                f"{lost} lost)"
            )

    # -- lost workers --
    def _watch(self) -> None:
        while True:
            gevent.sleep(WATCH_S)
            try:
                for worker in list(self.workers.values()):
                    client = self.runner.clients.get(worker.id)
                    if worker.lost is None and (client is None or client.state == STATE_MISSING):
                        self._lose(worker, "it quit" if client is None else "no heartbeat for 3 s")
            except Exception as exc:  # noqa: BLE001 - a run that can no longer see its workers stops, saying why
                if self.run is not None:
                    self.run.abort(f"watching the load generator workers failed: {type(exc).__name__}: {exc}")
                return

    def _lose(self, worker: _Worker, why: str) -> None:
        worker.lost = why
        if self.runner.clients.pop(worker.id, None) is not None:
            # Given up on: Locust would hand its users to the others a minute later, in the middle of a phase.
            self.runner.send_message("quit", client_id=worker.id)  # should it come back
        if self.run is None or self.run.finished:
            return
        lost = self._write_unreported(
            worker, ErrorKind.WORKER_LOST, f"load generator worker {worker.index} was lost mid-run ({why})"
        )
        if self.step is not None and worker.id in self.step.participants and not self.step.phase.done.is_set():
            self.step.lost.append(worker.index)
        live = self.live()
        self.warn(
            f"load generator worker {worker.index} lost ({why}): {words.count(lost, 'request')} in flight recorded as failed "
            f"(worker_lost); the run goes on with {words.count(len(live), 'worker')}"
        )
        if not live:
            self.run.abort("every load generator worker was lost")
            return
        step = self.step
        if step is not None:
            for round_no in sorted(set(step.ready) - step.released):
                self._try_release(round_no)
            self._check_done()

    def _write_unreported(self, worker: _Worker, kind: ErrorKind, why: str) -> int:
        entries, worker.in_flight = list(worker.in_flight.values()), {}
        for entry in entries:
            self._write_failed(
                worker, entry, kind, f"{why}: this request was in flight; its stamps went with the worker"
            )
        return len(entries)

    def _write_failed(self, worker: _Worker, entry: dict, kind: ErrorKind, error: str) -> None:
        """A request the master knew was in flight, written as failed with what the master knows of it."""
        index = entry["key"][0]
        phase = self.run.phases[index]
        s = phase.settings
        record = RequestRecord(
            engine=s.target.kind,
            instance=s.target.instance,
            scenario=phase.scenario,
            phase=entry["phase"],
            api=s.target.api,
            model=s.target.model,
            prompt_set=s.prompt_set.name,
            prompt_set_sha256=s.prompt_set.sha256,
            prompt_id=entry["prompt_id"],
            max_tokens=s.max_tokens,
            started_at=entry["at"],
            ok=False,
            status=0,
            error=error,
            error_kind=kind.value,
            arrival_index=entry.get("arrival"),
            worker=worker.index,
        )
        self._write(record, index)

    def _write(self, record: RequestRecord, index: int) -> None:
        self.run.recorder.request(record)
        if 0 <= index < len(self.run.phases):
            self.run.phases[index].add_worker_record(record)


class WorkerUsers(Users):
    """A phase's users on the workers: `dispatch` has Locust's master send them (the headless run's runner, the web
    UI's load shape), the coordinator starts each worker's part once they are in; after a stop, it waits for the
    workers' last records; at the end, it tells the workers the run is over."""

    def __init__(self, coordinator: Coordinator, dispatch: Users):
        self.coordinator, self.dispatch = coordinator, dispatch

    def admit(self, phase: Phase, previous: Phase | None) -> None:
        self.dispatch.admit(phase, previous)

    def start(self, phase: Phase) -> None:
        self.coordinator.prepare(phase)
        self.dispatch.start(phase)
        self.coordinator.start(phase)  # each worker's part of it, once every worker's users are in

    def release(self, phase: Phase) -> None:
        self.dispatch.release(phase)

    def halt(self) -> None:
        self.dispatch.halt()

    def end(self, complete: bool) -> None:
        if not complete:
            self.coordinator.drain()  # the workers' interrupted records
        self.coordinator.finish()


# ---------------------------------------------------------------- a worker's side


class WorkerAgent:
    """A worker's side: its part of each phase when the master starts it, its burst barrier held until every
    worker's users are in, and its records forwarded with their keys on the master's clock."""

    def __init__(self, runner: WorkerRunner):
        self.runner = runner
        self.run: LoadRun | None = None
        self.offset_s = 0.0
        self.sent: dict[int, int] = defaultdict(int)  # records forwarded per phase index
        self.releases: dict[tuple[int, int], Event] = {}
        self.replies: dict[float, AsyncResult] = {}
        self.seq = itertools.count(1)
        # The epoch clock less the monotonic one when the master's clock was last probed (None: not yet): while it
        # holds, offset_s puts an epoch stamp on the master's clock; a change is a step of the epoch clock.
        self.epoch_less_monotonic: float | None = None
        self.reprobing = False
        self.schedule_shift: dict[int, float] = {}  # phase index -> what puts its schedule's epoch stamps right
        for name, handler in (
            (PHASE, self._on_phase),
            (GO, self._on_go),
            (STOP, self._on_stop),
            (CLOCK_CHECK, self._on_clock_check),
        ):
            runner.register_message(name, handler)
        runner.register_message(CLOCK_REPLY, self._on_clock_reply)

    def recorder(self, out: TextIO | None = sys.stdout) -> ForwardingRecorder:
        return ForwardingRecorder(self, out)

    def attach(self, run: LoadRun) -> None:
        self.run = run
        self.sent.clear()
        self.releases.clear()
        self.schedule_shift.clear()

    def send(self, name: str, data: dict) -> None:
        self.runner.send_message(name, data)

    # -- a phase's start --
    def _on_phase(self, environment, msg, **_kw) -> None:
        gevent.spawn(self._prepare, msg.data["index"], msg.data.get("name"))  # never block Locust's message loop

    def _prepare(self, index: int, name: str | None) -> None:
        run = self.run
        if run is not None and index >= len(run.phases):
            run.finish()
            return
        ready = {"index": index, "round": 0}
        if run is None:
            self.send(READY, {**ready, "error": "its run could not be set up (see its log)"})
            return
        phase = run.phases[index]
        if phase.title != name:
            self.send(READY, {**ready, "error": f"phase {index} is {phase.title!r} here, {name!r} on the master"})
            return
        spawning = self.runner.spawning_greenlet  # the master's spawn for this phase came before its PHASE
        if spawning is not None:
            spawning.join()
        users = self.runner.user_classes_count.get(phase.user_class, 0)
        self.send(READY, {**ready, "users": users, "clock": self._probe_clock()})

    def _on_go(self, environment, msg, **_kw) -> None:
        index, round_no = msg.data["index"], msg.data["round"]
        if round_no:
            release = self.releases.pop((index, round_no), None)
            if release is not None:
                release.set()
            return
        run, share = self.run, msg.data["share"]
        phase = run.phases[index]
        phase.share = Share(
            users=share["users"],
            first=share.get("first", 0),
            stride=share.get("stride", 1),
            requests=share.get("requests"),
            hold=functools.partial(self._hold, index) if phase.in_rounds else None,
        )
        if phase.share.users > 0:
            # Its users, waiting for a change, see the phase now. A worker without users of it stays on the last
            # phase it had users of, which gives no more work: users spawned for the next phase wait there.
            while run.index < index and not run.finished:
                run.advance()
        gevent.spawn(self._report_done, index, phase)

    def _report_done(self, index: int, phase: Phase) -> None:
        if phase.share.users > 0:
            phase.done.wait()
        # An open-loop worker walks the whole schedule: how long it was, for the master's count of what went unsent.
        scheduled = phase.issued if phase.open_loop and phase.share.users > 0 else None
        self.send(DONE, {"index": index, "sent": self.sent[index], "scheduled": scheduled})

    def _on_stop(self, environment, msg, **_kw) -> None:
        phase = self.run.phases[msg.data["index"]] if self.run is not None else None
        if phase is not None:
            phase.stop()

    def _hold(self, index: int, round_no: int) -> None:
        """The last of this worker's users at a burst round's barrier: tell the master, wait for its release."""
        phase: BurstPhase = self.run.phases[index]
        ended = None
        if phase.last_round_end is not None:  # monotonic: the same instant on the master's clock
            ended = self.master_time(phase.last_round_end)
        release = self.releases[(index, round_no)] = Event()
        self.send(READY, {"index": index, "round": round_no, "users": phase.share.users, "ended": ended})
        release.wait()

    # -- the clock --
    def to_master(self) -> float:
        """What to add to an epoch stamp read now to put it on the master's clock: offset_s, unless the epoch clock
        stepped since the last probe, which is then taken out (and the master's clock probed again)."""
        if self.epoch_less_monotonic is None:
            return self.offset_s
        step = (time.time() - time.monotonic()) - self.epoch_less_monotonic
        if abs(step) <= CLOCK_STEP_S:
            return self.offset_s
        if not self.reprobing:
            self.reprobing = True
            gevent.spawn(self._reprobe, step)
        return self.offset_s - step

    def master_time(self, monotonic: float) -> float:
        """A monotonic instant on the master's clock (a step of the epoch clock does not move it)."""
        if self.epoch_less_monotonic is None:
            return time.time() - (time.monotonic() - monotonic) + self.offset_s
        return monotonic + self.epoch_less_monotonic + self.offset_s

    def _reprobe(self, step: float | None) -> None:
        """The epoch clock stepped (or the master saw a stamp of ours off its phase): probe the master's clock again,
        tell it what moved and the new offset."""
        try:
            clock = self._probe_clock()
            if self.run is not None:
                self.send(CLOCK_STEP, {"index": max(0, self.run.index), "step": step, "clock": clock})
        finally:
            self.reprobing = False

    def _on_clock_check(self, environment, msg, **_kw) -> None:
        if not self.reprobing:
            self.reprobing = True
            gevent.spawn(self._reprobe, None)

    def _probe_clock(self) -> dict[str, Any]:
        """Ask the master's time; the offset to apply to this worker's epoch stamps and its error bound."""
        probes: list[tuple[float, float, float]] = []
        for _ in range(CLOCK_PROBES):
            t1, m1 = time.time(), time.monotonic()
            reply = self.replies[t1] = AsyncResult()
            self.send(CLOCK_PROBE, {"t1": t1})
            try:
                t2 = reply.get(timeout=CLOCK_PROBE_TIMEOUT_S)
            except gevent.Timeout:
                continue
            finally:
                self.replies.pop(t1, None)
            probes.append((t1, time.monotonic() - m1, t2, t1 - m1))
        clock: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "offset": self.offset_s}
        found = clock_offset([probe[:3] for probe in probes])
        if found is None:
            return {**clock, "estimate": None, "bound": None}  # the master did not answer: keep the last offset
        self.offset_s, estimate, bound = found
        # The clocks' relation at the probe the offset came from (the shortest round trip).
        self.epoch_less_monotonic = min(probes, key=lambda p: p[1])[3]
        return {**clock, "offset": self.offset_s, "estimate": estimate, "bound": bound}

    def _on_clock_reply(self, environment, msg, **_kw) -> None:
        reply = self.replies.get(msg.data["t1"])
        if reply is not None:
            reply.set(msg.data["t2"])


class ForwardingRecorder(Recorder):
    """On a worker: each request announced before it is sent (a burst's by the release) and its record forwarded
    to the master, which owns the run folder and the metrics; epoch stamps on the master's clock."""

    def __init__(self, agent: WorkerAgent, out: TextIO | None = sys.stdout):
        super().__init__(folder=None, metrics=None, out=out)
        self.agent = agent
        self.shifts: dict[Key, float] = {}  # each request in flight: what puts its send on the master's clock

    def begin(self, phase: Phase, work: Work) -> Key:
        agent = self.agent
        index = agent.run.index
        # What puts this request's epoch stamps on the master's clock, read now, just before its send; a schedule's
        # stamps (scheduled_at) were read when it started, just before its first request here.
        shift = agent.to_master()
        agent.schedule_shift.setdefault(index, shift)
        if phase.in_rounds:
            key = (index, phase.round, work.arrival_index)  # the master counted it in flight at the release
        else:
            key = (index, 0, next(agent.seq))
            agent.send(
                BEGIN,
                {
                    "key": list(key),
                    "phase": work.phase_name,
                    "prompt_id": work.prompt.id,
                    "arrival": work.arrival_index,
                    "at": time.time() + shift,
                },
            )
        self.shifts[key] = shift
        return key

    def request(self, record: RequestRecord, key: Key | None = None) -> None:
        agent = self.agent
        shift = self.shifts.pop(key, None) if key else None
        record.started_at += agent.to_master() if shift is None else shift
        if record.scheduled_at is not None:
            index = key[0] if key else agent.run.index
            record.scheduled_at += agent.schedule_shift.get(index, agent.offset_s)
        data = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
        agent.send(RECORD, {"key": list(key) if key else None, "record": data})
        agent.sent[key[0] if key else agent.run.index] += 1
        super().request(record)

    def phase(self, record) -> None:
        pass  # the master writes the phases from every worker's records


# ---------------------------------------------------------------- `python -m loadgen ... --workers N`


class FleetError(RuntimeError):
    """The workers could not be started: one line for the terminal."""


class Fleet:
    """A Locust master in this process and N worker processes (`python -m loadgen.worker`) on this machine."""

    def __init__(
        self,
        environment,
        count: int,
        log_path: Path,
        say: Callable[[str], None],
        warn: Callable[[str], None],
        engines: list[str] | None = None,
    ):
        """engines: the command's --engine values, credentials included: each worker gets them in its environment,
        never in a message (the plan carries them redacted)."""
        # Locust's runner warns on stderr of what its web UI's users choose (a burst's spawn rate "is very high");
        # here this module says what matters, in its own lines. Its errors still show.
        logging.getLogger("locust.runners").setLevel(logging.ERROR)
        self.runner: MasterRunner = environment.create_master_runner("127.0.0.1", 0)
        # Each worker gets an identity only it and this master know: the port admits no one else.
        identities = [master_port.new_identity(k) for k in range(count)]
        self.coordinator = Coordinator(self.runner, say, warn, admitted=set(identities))
        self.log_path = log_path
        self.log = open_append(log_path, binary=True)  # in the run folder: never through a link at the name
        port = str(self.runner.server.port)
        secrets_env = {master_port.ENGINES_ENV: json.dumps(list(engines or []))}
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "loadgen.worker", "--master-port", port],
                stdin=subprocess.DEVNULL,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the master, which stops them in order
                env={**os.environ, **secrets_env, master_port.IDENTITY_ENV: identity},
            )
            for identity in identities
        ]
        # Connected is not ready: a worker registers its handlers once Locust's runner is made, which waits for the
        # master's acknowledgement, and a plan sent before that found no handler ("Unknown message type").
        self.listening: set[str] = set()
        self.runner.register_message(LISTENING, lambda environment, msg, **_kw: self.listening.add(msg.node_id))
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while self.runner.worker_count < count or len(self.listening & set(self.runner.clients)) < count:
            exited = [p for p in self.procs if p.poll() is not None]
            if exited:
                self.close()
                raise FleetError(f"a load generator worker exited ({exited[0].returncode}) at start: see {log_path}")
            if time.monotonic() > deadline:
                self.close()
                ready = len(self.listening & set(self.runner.clients))
                raise FleetError(
                    f"{count - ready} of {count} load generator workers did not connect within "
                    f"{WORKER_START_TIMEOUT_S:g} s: see {log_path}"
                )
            gevent.sleep(0.05)
        # Its workers are in: nothing else connects to the port from now on (the port admits no other process anyway,
        # and a process holding connections by the thousand would take the master's file descriptors).
        closed = self.coordinator.guard.close_door()
        say(
            f"{count} load generator workers connected (pids {', '.join(str(p.pid) for p in self.procs)})"
            + ("; their port closed to new connections" if closed else "")
        )

    def send_plan(self, plan: RunPlan, targets) -> None:
        """What each worker needs to build the master's phases: the run's plan, the engines as probed."""
        self.runner.send_message(PLAN, master_port.plan_message(plan, targets))

    def close(self) -> None:
        self.coordinator.close()
        self.runner.quit()  # each worker is told to quit
        deadline = time.monotonic() + QUIT_S
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        children.stop(*self.procs)  # one that did not quit: the schedule every child gets (only reaped if gone)
        self.log.close()


def _share_message(share: Share) -> dict[str, Any]:
    """A worker's part of a phase as GO carries it (the worker makes its Share of it again)."""
    message: dict[str, Any] = {"users": share.users, "first": share.first, "stride": share.stride}
    if share.requests is not None:
        message["requests"] = share.requests
    return message


def adopt_targets(targets, described: list[dict]) -> None:
    """On a worker: the engines as the master probed them (model, version), not probed again."""
    by_instance = {d["instance"]: d for d in described}
    for target in targets:
        if target.instance in by_instance:
            target.model = by_instance[target.instance]["model"]
            target.info = by_instance[target.instance]["info"]
