"""A router in front of N replicas: nginx's upstream module (Debian's nginx), round robin or least connections."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from urllib.error import HTTPError, URLError
from urllib.request import urlopen

from report.replicas import LEAST_CONN, ROUND_ROBIN
from servescope import children
from stack import provision
from stack.errors import StackError

POLICIES = {ROUND_ROBIN: "", LEAST_CONN: "least_conn;"}  # the plan's routing policies -> nginx's directive


def config(upstreams: list[str], port: int, policy: str, workdir: Path, host: str = "127.0.0.1") -> str:
    """nginx.conf for one streaming upstream group: no buffering (tokens pass as they come), kept-alive upstream
    connections (a new TCP connection per request would be the router's cost, not the engines')."""
    if policy not in POLICIES:
        raise StackError(f"router policy {policy!r}: expected {' or '.join(POLICIES)}")
    if not upstreams:
        raise StackError("a router needs at least one replica")
    servers = "\n".join(f"        server {u.removeprefix('http://').rstrip('/')} max_fails=0;" for u in upstreams)
    return f"""worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {workdir}/body;
    proxy_temp_path {workdir}/proxy;
    fastcgi_temp_path {workdir}/fastcgi;
    uwsgi_temp_path {workdir}/uwsgi;
    scgi_temp_path {workdir}/scgi;
    upstream replicas {{
        {POLICIES[policy]}
{servers}
        keepalive 256;
    }}
    server {{
        listen {host}:{port};
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
            proxy_next_upstream off;
        }}
    }}
}}
"""


class Router:
    """nginx in the foreground of its own folder, started and stopped with the caller (`with Router(...) as url`)."""

    def __init__(self, upstreams: list[str], port: int, policy: str, workdir: Path):
        self.workdir = Path(workdir)
        self.port = port
        self.text = config(upstreams, port, policy, self.workdir)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> str:
        binary = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
        if binary is None:
            raise StackError(f"nginx is not installed: {provision.NGINX.how_to_install}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        for temp in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.workdir / temp).mkdir(exist_ok=True)
            (self.workdir / temp).chmod(0o777)  # nginx's workers drop to nobody when started as root
        conf = self.workdir / "nginx.conf"
        conf.write_text(self.text)
        self.proc = subprocess.Popen(
            [binary, "-p", str(self.workdir), "-c", str(conf), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "stderr.log", "w"),  # noqa: SIM115 - the child holds it for its life
        )
        url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                said = (self.workdir / "stderr.log").read_text().strip().splitlines()
                raise StackError(f"nginx exited ({self.proc.returncode}): {said[-1] if said else 'no output'}")
            try:
                urlopen(url + "/health", timeout=1).close()
                return url
            except HTTPError:  # nginx answered (a replica's status passed on)
                return url
            except (URLError, OSError):
                time.sleep(0.1)
        self.__exit__(None, None, None)
        raise StackError(f"nginx did not answer on {url} within 10 s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            children.stop(self.proc)
