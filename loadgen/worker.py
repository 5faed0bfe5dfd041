"""`python -m loadgen.worker --master-port P`: one worker process of `python -m loadgen ... --workers N`, which starts it."""

from locust.env import Environment  # noqa: I001 - Locust first (gevent monkey-patching)
from locust.event import Events

import argparse
import gc
import json
import os
import sys

import gevent

from loadgen import distributed, master_port
from loadgen.commands import prepare
from loadgen.locustfile import USER_CLASSES
from loadgen.runplan import RunPlan
from loadgen.scenarios import LoadRun

PARENT_CHECK_S = 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadgen.worker", description=__doc__)
    parser.add_argument("--master-host", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, required=True)
    args = parser.parse_args(argv)
    environment = Environment(
        user_classes=list(USER_CLASSES.values()), events=Events(), parsed_options=distributed.locust_options()
    )
    # The identity its master made up for it: the master's port admits no other (loadgen/master_port.py).
    with master_port.worker_identity(os.environ.get(master_port.IDENTITY_ENV)):
        runner = environment.create_worker_runner(args.master_host, args.master_port)
    agent = distributed.WorkerAgent(runner)
    engines = json.loads(os.environ.get(master_port.ENGINES_ENV) or "[]")

    def on_plan(environment, msg, **_kw) -> None:
        """The master's command, its engines as probed: the same phases here, records forwarded, nothing printed.
        The engines' URLs, credentials included, are the ones the master started this process with."""
        run_plan = RunPlan.from_json(msg.data["plan"], engines=engines)
        plan = prepare(run_plan)
        distributed.adopt_targets(plan.targets, msg.data["targets"])
        environment.parsed_options.http_client = run_plan.http_client
        run = LoadRun(plan.phases, agent.recorder(out=None))
        environment.servescope_run = run
        agent.attach(run)

    runner.register_message(distributed.PLAN, on_plan)
    runner.send_message(distributed.LISTENING, {})  # the master sends the plan once every worker has said this
    parent = os.getppid()

    def orphaned() -> None:
        """A master that died cannot tell its workers to quit: they go when they see it gone."""
        while os.getppid() == parent:
            gevent.sleep(PARENT_CHECK_S)
        runner.quit()

    gevent.spawn(orphaned)
    gc.freeze()  # as loadgen/__main__.py: what start-up built is never walked by a collection again
    runner.greenlet.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
