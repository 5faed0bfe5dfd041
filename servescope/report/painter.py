"""The report's figures drawn in a process of their own, so matplotlib's import and drawing run beside the report's work.

Drawing is pure Python that holds the interpreter: on a thread it took turns with the report's own
work (and its import with the reading's), so on a long run the report waited on its figures
(docs/pieces.md has the figure). A child interpreter (`python -m servescope.report.painter`) has an interpreter lock of
its own: it starts when the report starts, imports matplotlib while the run is read, and draws each figure
from the plain data servescope/report/figures.py makes as soon as the report hands it over (pickled over a
pipe: the child is ours and reads only its parent). A plain child process rather than
multiprocessing's spawn, which re-runs the caller's main script in the child. One painter serves
every report of a process (tests, `make tune`); one that died is replaced by the next report.
Where no process can be started the figures are drawn on a thread, after one line saying so.
"""

from __future__ import annotations

import atexit
import os
import pickle
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

CLOSE_S = 5.0  # at exit, how long the painter may take to finish what is queued before it is killed


def figure_timeout_s() -> float:
    """PAINTER_FIGURE_TIMEOUT_S (.env.example): how long one figure may take; a bad value is the report's one line."""
    from servescope.contracts import knobs

    return knobs.get_positive("PAINTER_FIGURE_TIMEOUT_S", "seconds")


ROOT = Path(__file__).resolve().parents[2]  # where the servescope package is imported from, for the child too


class PainterStopped(Exception):
    """The painter process ended (killed, out of memory) before it drew a figure."""


class FigureFailed(Exception):
    """A figure's drawing code raised in the painter process and its exception could not travel back whole (the
    message holds its traceback); one that can (an OSError: disk full, a folder gone) is raised as itself."""


def draw(name: str, data: Any, path: Path) -> Path:
    """servescope.report.plots.<name>(data, path): what the painter runs for each figure."""
    from servescope.report import plots

    return getattr(plots, name)(data, path)


class Painter:
    """One child process (else one thread) drawing figures in the order they are asked for."""

    _shared: Painter | None = None

    def __init__(self, command: list[str] | None = None) -> None:
        self.broken = False
        self._lock = threading.Lock()
        self._pending: dict[int, Future] = {}
        self._next = 0
        self._thread: ThreadPoolExecutor | None = None
        self._proc: subprocess.Popen | None = None
        # Jobs go to the child from a thread of their own: a figure's data (a box plot's fliers) can fill the
        # pipe while the child still draws the one before, and the report must not wait for that.
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        try:
            self._proc = subprocess.Popen(
                command or [sys.executable, "-m", "servescope.report.painter"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
        except (OSError, TypeError) as exc:  # TypeError: no sys.executable to start
            print(f"report: figures drawn in this process, no painter process ({exc})", file=sys.stderr)
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="plots")
            return
        threading.Thread(target=self._read, name="painter-results", daemon=True).start()
        self._writer = threading.Thread(target=self._write, name="painter-jobs", daemon=True)
        self._writer.start()
        atexit.register(self.close)

    @classmethod
    def shared(cls) -> Painter:
        """This process's painter, started on first use (and again after one stopped)."""
        if cls._shared is None or cls._shared.broken:
            cls._shared = cls()
        return cls._shared

    def draw(self, name: str, data: Any, path: Path) -> Future:
        """Have servescope.report.plots.<name>(data, path) drawn; the future holds the figure's path."""
        if self._thread is not None:
            return self._thread.submit(draw, name, data, path)
        future: Future = Future()
        with self._lock:
            if self.broken:
                future.set_exception(PainterStopped())
                return future
            job, self._next = self._next, self._next + 1
            self._pending[job] = future
        # Absolute: the painter keeps the directory it started in, this process may not.
        self._jobs.put((job, name, data, Path(path).absolute()))
        return future

    def collect(self, drawn: dict[str, Future]) -> dict[str, Path | None]:
        """Each figure's file; None for those the painter stopped before drawing, with one line naming them. A figure
        whose drawing code failed raises here, as it would have in this process.

        Figures are drawn in order, each given PAINTER_FIGURE_TIMEOUT_S from the moment the one before it was in: a
        painter that draws nothing for that long (stopped, stuck) is ended, and what it had left is left out."""
        deadline_s = figure_timeout_s()
        out: dict[str, Path | None] = {}
        stuck = False
        for key, future in drawn.items():
            try:
                out[key] = future.result(timeout=deadline_s)
            except PainterStopped:
                out[key] = None
            except FutureTimeout:
                stuck = True
                self.stop()  # its other figures fail at once: none is waited on again
                out[key] = None
        lost = [key for key, path in out.items() if path is None]
        if lost:
            why = (
                f"drew nothing for {deadline_s:g} s (PAINTER_FIGURE_TIMEOUT_S) and was stopped"
                if stuck
                else "process stopped"
            )
            print(f"report: the figure painter {why}; figures left out: {', '.join(lost)}", file=sys.stderr)
        return out

    def close(self) -> None:
        """End the child: it exits at once when its input ends (no teardown), and is waited for, so its CPU time
        counts in this process's children's, like the threads' it replaced. One stuck is stopped after CLOSE_S."""
        if self._writer is not None and self._writer.is_alive():
            self._jobs.put(None)  # the writer sends what is queued, then ends the child's input
            self._writer.join(timeout=CLOSE_S)
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._proc.wait(timeout=CLOSE_S)
            except subprocess.TimeoutExpired:
                from servescope.host import children

                children.stop(self._proc, timeout=CLOSE_S)  # the schedule every child gets: SIGINT, SIGTERM, SIGKILL

    def _write(self) -> None:
        """Jobs to the child in the order they were asked for; None ends its input. A job that does not pickle fails
        alone; anything else that goes wrong here stops the painter (its figures fail, none waits forever)."""
        stdin = self._proc.stdin
        try:
            while (job := self._jobs.get()) is not None:
                try:
                    blob = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as exc:  # noqa: BLE001 (a figure's data that is not plain data: a bug, told there)
                    self._settle(job[0], FigureFailed(f"{job[1]}: its data does not pickle: {exc!r}"))
                    continue
                stdin.write(blob)
                stdin.flush()
            stdin.close()
        except BaseException:  # noqa: BLE001 (the pipe is gone, or worse: either way nothing more is drawn)
            self._stop()

    def _read(self) -> None:
        """Answers as the child sends them: (job, True, path) or (job, False, exception). Anything else (the pipe
        closed, bytes that are not an answer) stops the painter: its figures fail, none waits forever."""
        try:
            while True:
                job, ok, value = pickle.load(self._proc.stdout)
                if not ok and not isinstance(value, BaseException):
                    value = FigureFailed(value)  # a traceback's text: the exception itself would not travel
                self._settle(job, value)
        except BaseException:  # noqa: BLE001
            self._stop()

    def _settle(self, job: int, outcome: Any) -> None:
        with self._lock:
            future = self._pending.pop(job, None)
        if future is None or future.done():
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def stop(self) -> None:
        """No more figures from this painter (it is stuck, or the report was interrupted): the child is killed, even
        a stopped one, and every figure asked for and not drawn fails. The next report starts another."""
        if self._thread is not None:
            self.broken = True
            self._thread.shutdown(wait=False, cancel_futures=True)
            return
        self._stop()

    def _stop(self) -> None:
        """No more figures from this painter: every one asked for and not drawn fails, and the child goes."""
        with self._lock:
            self.broken = True
            stopped, self._pending = list(self._pending.values()), {}
        for future in stopped:
            if not future.done():
                future.set_exception(PainterStopped())
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()


def serve() -> None:
    """The child: import matplotlib now, then draw each job read from stdin and answer on the original stdout."""
    import signal
    import traceback

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the report's to handle; we end with our input
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed while drawing goes to stderr, never into the answers
    jobs = sys.stdin.buffer
    from servescope.report import plots  # noqa: F401  (the import the report no longer waits for)

    while True:
        try:
            job, name, data, path = pickle.load(jobs)
        except EOFError:
            answers.flush()
            os._exit(0)  # the report is done with us: no interpreter teardown for anyone to wait on
        try:
            answer = (job, True, draw(name, data, path))
        except Exception as exc:  # noqa: BLE001 (sent back: the report raises it)
            exc.add_note(f"in the figure painter:\n{traceback.format_exc()}")
            try:
                pickle.loads(pickle.dumps(exc))  # an OSError travels whole (the report tells it in one line)
                answer = (job, False, exc)
            except Exception:  # noqa: BLE001
                answer = (job, False, traceback.format_exc())
        pickle.dump(answer, answers)
        answers.flush()


if __name__ == "__main__":
    serve()
