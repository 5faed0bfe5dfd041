"""The one way tests run servescope's command lines as subprocesses: run_cli for a run that ends, start_cli for one that serves."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import stop_process
from tests.paths import REPO

# A run that hangs ends the test instead of the suite; the tests that know their run is shorter say so.
DEFAULT_TIMEOUT_S = 300.0
# How long a started CLI gets to exit on SIGTERM (its run folder finishes its manifest) before it is killed.
STOP_GRACE_S = 10.0


class CliTimeout(subprocess.TimeoutExpired):
    """A CLI run that did not finish in time: it was killed, and the message says which command and what it wrote."""

    def __str__(self) -> str:
        said = _text(self.stderr).strip() or _text(self.stdout).strip()
        tail = f"; its output ended:\n{said[-2000:]}" if said else "; it wrote nothing"
        return f"{_shown(self.cmd)} did not finish within {self.timeout:g} s and was killed{tail}"


def cli_argv(module: str, *args: object) -> list[str]:
    """`python -m MODULE ARGS` with this interpreter (so the venv's packages), each argument a string."""
    return python_argv("-m", module, *args)


def python_argv(*args: object) -> list[str]:
    """This interpreter with ARGS (`-c CODE ...` for a script that drives a CLI in-process with something patched)."""
    return [sys.executable, *map(str, args)]


def cli_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: `env` (default: this process's, so the knobs a test set reach it) with the repo first
    on PYTHONPATH, so the worktree's packages are imported whatever the child's working directory."""
    merged = dict(os.environ if env is None else env)
    merged.setdefault("CPU_PRIORITY", "off")  # conftest's no_cpu_priority, for an environment a test made itself
    paths = [p for p in merged.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
    merged["PYTHONPATH"] = os.pathsep.join([str(REPO), *paths])
    return merged


def run_cli(
    module: str,
    *args: object,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `python -m MODULE ARGS` to its end: returncode, stdout and stderr (text) come back; a run past `timeout`
    is killed and raised as CliTimeout naming the command and what it wrote."""
    return run_python("-m", module, *args, env=env, cwd=cwd, timeout=timeout, input=input)


def run_python(
    *args: object,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """run_cli for `python ARGS` (a `-c` script that runs a CLI's main with a part replaced)."""
    argv = python_argv(*args)
    try:
        return subprocess.run(
            argv,
            cwd=REPO if cwd is None else cwd,
            env=cli_env(env),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:  # subprocess.run has killed and reaped it
        raise CliTimeout(argv, timeout, _text(exc.stdout), _text(exc.stderr)) from None


def in_a_fresh_interpreter(probe: str, env: Mapping[str, str] | None = None) -> str:
    """What a `python -c` probe prints, run where nothing is imported yet (pytest's process has numpy, Locust and
    gevent's patching in it); a probe that fails fails the test with its stderr."""
    out = run_python("-c", probe, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def spawn_cli(
    module: str,
    *args: object,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    **popen: object,
) -> subprocess.Popen[str]:
    """`python -m MODULE ARGS` started and left running (text pipes by default): for a helper or fixture that stops
    it itself (with stop_cli or tests.conftest.stop_process); a test body uses start_cli."""
    return spawn_python("-m", module, *args, env=env, cwd=cwd, stdout=stdout, stderr=stderr, **popen)


def spawn_python(
    *args: object,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    **popen: object,
) -> subprocess.Popen[str]:
    """spawn_cli for `python ARGS`, for a helper that starts CLIs and `-c` stand-ins alike."""
    return subprocess.Popen(
        python_argv(*args),
        cwd=REPO if cwd is None else cwd,
        env=cli_env(env),
        stdout=stdout,
        stderr=stderr,
        text=True,
        **popen,
    )


@contextmanager
def start_cli(
    module: str,
    *args: object,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    grace: float = STOP_GRACE_S,
    **popen: object,
) -> Iterator[subprocess.Popen[str]]:
    """spawn_cli as a `with` block: whatever the block does, at its end the process is stopped if it still runs
    (stop_cli), so no test leaves a load generator or an exporter behind."""
    proc = spawn_cli(module, *args, env=env, cwd=cwd, stdout=stdout, stderr=stderr, **popen)
    try:
        yield proc
    finally:
        stop_cli(proc, grace)


def stop_cli(proc: subprocess.Popen, grace: float = STOP_GRACE_S) -> None:
    """Stop a started CLI still running: SIGTERM, SIGKILL after `grace` seconds, reaped, and what it wrote that the
    test had not read kept as `.unread` (stdout, stderr). One that ended by itself is the test's: its pipes are left
    to the test (a reader thread may still be taking its last lines) and `.unread` is None."""
    proc.unread = None
    if proc.poll() is not None:
        return
    stop_process(proc, grace)
    proc.unread = (_drain(proc.stdout), _drain(proc.stderr))


def _drain(stream, quiet_s: float = 1.0) -> str | None:
    """What is left in a pipe of an exited process, then closed; None for no pipe. Read from the descriptor with a
    wait, not to EOF: a child the CLI started may still hold the pipe open, and the harness must not hang on it."""
    if stream is None or stream.closed:
        return None
    chunks: list[bytes] = []
    try:
        fd = stream.fileno()
        while select.select([fd], [], [], quiet_s)[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        stream.close()
    except (OSError, ValueError):  # closed meanwhile (the test's own reader thread)
        pass
    return b"".join(chunks).decode(errors="replace")


def _text(output: str | bytes | None) -> str:
    if output is None:
        return ""
    return output.decode(errors="replace") if isinstance(output, bytes) else output


def _shown(argv) -> str:
    words = list(argv)
    if words and words[0] == sys.executable:
        words[0] = "python"
    return " ".join(str(w) for w in words)
