"""Ollama when a real one is here (on PATH or answering at OLLAMA_HOST): the same GGUF via a Modelfile; else absent."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import requests

from servescope.engines.ollama import OLLAMA
from servescope.engines.ollama import models_of as ollama_models
from servescope.host import bounded_http, probe
from servescope.stack import paths, ports
from servescope.stack.errors import StackError
from servescope.stack.progress import Step, say
from servescope.stack.supervisor import Record, Service


def host_url(ollama_host: str | None, default_port: int) -> str:
    """OLLAMA_HOST as Ollama reads it ("host", "host:port", ":port", "http://host:port") → a client URL."""
    value = (ollama_host or "").strip().rstrip("/")
    if not value:
        return f"http://127.0.0.1:{default_port}"
    scheme = "http"
    if "://" in value:
        scheme, value = value.split("://", 1)
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = value, str(default_port)
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    return f"{scheme}://{host}:{port}"


def answers(url: str, timeout: float = 2.0) -> bool:
    return probe.is_up(f"{url}/api/version", timeout)


def binary() -> str | None:
    return shutil.which("ollama")


def modelfile_text(gguf: Path) -> str:
    # Absolute path: `ollama create` resolves FROM relative to the Modelfile, which lives in the state dir.
    return f"FROM {gguf.resolve()}\n"


def write_modelfile(gguf: Path, directory: Path | None = None) -> Path:
    directory = directory or paths.state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    modelfile = directory / "Modelfile"
    modelfile.write_text(modelfile_text(gguf))
    return modelfile


def create_command(ollama_bin: str, model: str, modelfile: Path) -> list[str]:
    return [ollama_bin, "create", model, "-f", str(modelfile)]


def serve_command(ollama_bin: str) -> list[str]:
    return [ollama_bin, "serve"]


def serve_environment(host: str, port: int, num_parallel: str) -> dict[str, str]:
    return {"OLLAMA_HOST": f"{host}:{port}", "OLLAMA_NUM_PARALLEL": num_parallel}


def has_model(url: str, model: str) -> bool:
    try:  # bounded, and its shape checked: an answer that is not Ollama's is "no"
        tags = ollama_models(bounded_http.get(f"{url}/api/tags", 5).json())
    except (bounded_http.ServiceError, ValueError):
        return False
    names = {m.get("name", "") for m in tags} | {m.get("model", "") for m in tags}
    return model in names or f"{model}:latest" in names


def create_model(url: str, model: str, gguf: Path) -> None:
    """`ollama create MODEL -f Modelfile` with the CLI; through the HTTP API when only the server is reachable."""
    if has_model(url, model):
        return
    log = paths.service_logs() / "ollama-create.log"
    ollama_bin = binary()
    with Step(f"creating Ollama model {model} from {gguf.name}"):
        if ollama_bin:
            env = {**os.environ, "OLLAMA_HOST": url}
            with open(log, "a") as out:
                code = subprocess.call(
                    create_command(ollama_bin, model, write_modelfile(gguf)),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            if code != 0:
                raise StackError(f"`ollama create {model}` failed (exit {code}); log: {log}")
            return
        create_via_api(url, model, gguf)


def create_via_api(url: str, model: str, gguf: Path) -> None:
    """The API form of a `FROM <gguf>` Modelfile: upload the blob, then create from it."""
    digest = "sha256:" + file_sha256(gguf)
    try:
        if requests.head(f"{url}/api/blobs/{digest}", timeout=10).status_code != 200:
            with open(gguf, "rb") as fh:
                requests.post(f"{url}/api/blobs/{digest}", data=fh, timeout=600).raise_for_status()
        resp = requests.post(
            f"{url}/api/create", json={"model": model, "files": {gguf.name: digest}, "stream": False}, timeout=600
        )
        resp.raise_for_status()
    except requests.RequestException as exc:
        raise StackError(f"creating Ollama model {model} at {url} failed: {exc}") from None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------- the native stack's hooks (servescope/stack/native.py)


def join(launch, knob: dict[str, str], gguf: Path, bind: str, host: str) -> str | None:
    """A real Ollama serves the same GGUF; none here means "absent", which is not a failure. Its URL, or None."""

    url = host_url(knob.get("OLLAMA_HOST"), int(knob["OLLAMA_PORT"]))
    if binary() or answers(url):
        ports.require_free(bind, int(knob["OLLAMA_PROXY_PORT"]), "exporter's Ollama proxy", "OLLAMA_PROXY_PORT")
    if not answers(url):
        ollama_bin = binary()
        if ollama_bin is None:
            Record(
                name=OLLAMA.name,
                title="Ollama",
                url=url,
                ready_url=url + "/api/version",
                absent="no `ollama` on PATH and nothing answers at " + url,
            ).save()
            say(f"Ollama: absent (no `ollama` on PATH, nothing at {url}): not compared")
            return None
        port = int(knob["OLLAMA_PORT"])
        launch.start(
            Service(
                OLLAMA.name,
                OLLAMA.title,
                serve_command(ollama_bin),
                bind,
                port,
                "OLLAMA_PORT",
                "/api/version",
                ready_timeout=60,
                env=serve_environment(bind, port, knob["OLLAMA_NUM_PARALLEL"]),
            )
        )
        url = f"http://{host}:{port}"
    else:
        Record(name=OLLAMA.name, title=OLLAMA.title, url=url, ready_url=url + OLLAMA.health_path).save()
        say(f"Ollama: using the one already answering at {url}")
    create_model(url, knob["OLLAMA_MODEL"], gguf)
    return url


def exporter_args(knob: dict[str, str], url: str) -> list[str]:
    """The exporter reads this Ollama and runs its proxy in front of it, the only place its queue is seen: the proxy's
    port and the slots it relays to (Ollama reports neither)."""
    return [
        "--ollama-url",
        url,
        "--proxy-port",
        knob["OLLAMA_PROXY_PORT"],
        "--ollama-num-parallel",
        knob["OLLAMA_NUM_PARALLEL"],
    ]
