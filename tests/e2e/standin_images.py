"""Local stand-ins for registry images this machine cannot pull (Docker Hub is unreachable here), built once per engine.

- `python:3.11-slim-bookworm` -> a debootstrap'd Debian bookworm with Python 3.11 (and its headers, as upstream has:
  torch's inductor compiles against Python.h when vLLM starts) in a venv on PATH, and this host's CA bundle (the one PyPI is served with here) so `pip install` works in image builds. Only the stand-in carries it:
  users' builds use the upstream image untouched (the PYTHON_BASE_IMAGE knob picks).
- `prom/prometheus` -> Debian's prometheus package on that base, entrypoint /usr/bin/prometheus, with curl for the
  healthcheck (the upstream image has busybox wget).
Grafana and Ollama have no package to build one from: the Compose suite runs without them (profiles).
Each tag carries a hash of its recipe: a changed recipe builds a new stand-in, never reuses a stale one.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import docker
from servescope.stack.progress import Step

DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBOOTSTRAP_INCLUDE = "python3,python3-venv,python3-dev,ca-certificates,passwd"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Where the stand-in keeps the host's bundle: a path no Debian package rewrites (update-ca-certificates
# regenerates /etc/ssl/certs/ca-certificates.crt when a build installs ca-certificates).
IMAGE_CA_BUNDLE = "/etc/ssl/host-ca-bundle.crt"
PYTHON_BASE_CHANGES = [
    "ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    f"ENV PIP_CERT={IMAGE_CA_BUNDLE}",
    f"ENV SSL_CERT_FILE={IMAGE_CA_BUNDLE}",
    f"ENV REQUESTS_CA_BUNDLE={IMAGE_CA_BUNDLE}",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
]


def recipe_tag(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:10]


PYTHON_BASE = f"servescope-standin/python:3.11-bookworm-{recipe_tag(DEBOOTSTRAP_INCLUDE, *PYTHON_BASE_CHANGES)}"
PROMETHEUS_DOCKERFILE = f"""FROM {PYTHON_BASE}
RUN apt-get update && apt-get install -y --no-install-recommends prometheus curl && rm -rf /var/lib/apt/lists/*
ENTRYPOINT ["/usr/bin/prometheus"]
"""
PROMETHEUS = f"servescope-standin/prometheus:debian-bookworm-{recipe_tag(PROMETHEUS_DOCKERFILE)}"


def exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_python_base(client: docker.DockerClient, workdir: Path) -> None:
    """debootstrap (about 2 min), the venv, the CA bundle, then `docker import` with the image's ENV."""
    rootfs = Path(tempfile.mkdtemp(prefix="standin-rootfs-", dir=workdir))
    try:
        with Step(f"building the stand-in {PYTHON_BASE} (debootstrap bookworm)"):
            subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={DEBOOTSTRAP_INCLUDE}",
                    "bookworm",
                    str(rootfs),
                    DEBIAN_MIRROR,
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            shutil.copyfile(HOST_CA_BUNDLE, rootfs / IMAGE_CA_BUNDLE.lstrip("/"))
            shutil.copyfile(HOST_CA_BUNDLE, rootfs / "etc/ssl/certs/ca-certificates.crt")
            subprocess.run(["chroot", str(rootfs), "python3", "-m", "venv", "/opt/python"], check=True)
            archive = workdir / "standin-rootfs.tar"
            with tarfile.open(archive, "w") as tar:
                tar.add(rootfs, arcname=".")
            repository, tag = PYTHON_BASE.rsplit(":", 1)
            client.api.import_image_from_file(str(archive), repository=repository, tag=tag, changes=PYTHON_BASE_CHANGES)
            archive.unlink()
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)


def build_prometheus(client: docker.DockerClient) -> None:
    with Step(f"building the stand-in {PROMETHEUS} (Debian's prometheus package)"):
        client.images.build(fileobj=io.BytesIO(PROMETHEUS_DOCKERFILE.encode()), tag=PROMETHEUS, rm=True)


def ensure(client: docker.DockerClient, workdir: Path) -> dict[str, str]:
    """The stand-ins, built when missing; returns the knobs that point Compose at them."""
    if not exists(client, PYTHON_BASE):
        build_python_base(client, workdir)
    if not exists(client, PROMETHEUS):
        build_prometheus(client)
    return {"PYTHON_BASE_IMAGE": PYTHON_BASE, "PROMETHEUS_IMAGE": PROMETHEUS}
