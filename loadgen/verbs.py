"""The load generator's commands and their one-line help, importable without Locust (the `servescope` dispatcher lists them)."""

from __future__ import annotations

COMMANDS = {
    "compare": "the reference experiment: per engine warm-up, matched-set sequential, burst",
    "sequential": "one user, the prompt set back to back",
    "burst": "N requests released at the same instant, awaited, K times",
    "ramp": "steps of closed-loop users, each held",
    "rate": "open-loop arrivals (constant or Poisson); requests don't wait for each other",
    "sweep": "one closed-loop phase per concurrency level",
    "replay": "a trace's requests at their own times (--prompts trace:FILE), open loop, --speed times faster",
    "knee": "the highest concurrency (or rate) that meets the SLOs, and the server resource that ran out above it",
}
QUICK_HELP = (
    "find the engines running here (or at URLs), measure one user and a short knee on each, answer in plain words"
)
WEBUI_HELP = (
    "Locust's web UI on LOCUST_PORT (127.0.0.1), opened pre-filled: Host = the engine URL, "
    "Number of users = the burst size, scenario and engine under Custom parameters"
)
