"""Open-loop honesty: in a rate run, how far sends fell behind their schedule, and latency counted from the schedule too.

An open-loop client promises arrivals at given instants. When it cannot keep them (its own in-flight
ceiling, a busy CPU, a server that stalls every connection it has), the sends come late and a latency
measured from the send hides the wait: coordinated omission. Each open-loop record carries its
scheduled instant (`scheduled_at`); the lag is send - schedule, and TTFT / E2E from the schedule add
it back. A phase whose lag p99 passes thresholds.SCHEDULE_LAG_P99_MAX_S is flagged: the run did not
send the load it claims, and its send-based latency is too good.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from report import stats
from report.load import Run
from servescope import slo, thresholds

RULE = (
    f"schedule lag = send - scheduled instant; latency from the schedule = lag + latency from the send; a phase whose "
    f"lag p99 exceeds {thresholds.SCHEDULE_LAG_P99_MAX_S * 1000:g} ms is flagged (servescope/thresholds.py): the client "
    f"fell behind its schedule and send-based latency hides the wait (coordinated omission)"
)


@dataclass
class ScheduleCheck:
    instance: str
    engine: str
    phase: str
    requests: int
    lag: dict  # stats.summary of the lags (seconds)
    ttft_from_send: dict
    ttft_from_schedule: dict
    e2e_from_send: dict
    e2e_from_schedule: dict
    behind: bool  # lag p99 above the threshold

    def text(self) -> str:
        p99 = self.lag["p99"]
        if not self.behind:
            return f"{self.instance} {self.phase}: sends kept the schedule (lag p99 {p99 * 1000:.1f} ms)"
        return (
            f"{self.instance} {self.phase}: the client fell behind its schedule (lag p99 {p99:.3f} s, max "
            f"{self.lag['max']:.3f} s): E2E p99 {self.e2e_from_send['p99']:.3f} s from the send is "
            f"{self.e2e_from_schedule['p99']:.3f} s from the schedule - the send-based latency hides the wait"
        )


def build(run: Run) -> list[ScheduleCheck]:
    out = []
    for instance in run.engines:
        records = [r for r in run.requests_of(instance) if r.scheduled_at is not None]
        for phase in dict.fromkeys(r.phase for r in records):
            recs = [r for r in records if r.phase == phase]
            ok = [r for r in recs if r.ok]
            lags = [slo.schedule_lag(r) for r in recs]
            lag = stats.summary(lags)
            out.append(
                ScheduleCheck(
                    instance=instance,
                    engine=recs[0].engine,
                    phase=phase,
                    requests=len(recs),
                    lag=lag,
                    ttft_from_send=stats.summary([r.ttft_s for r in ok if r.ttft_s is not None]),
                    ttft_from_schedule=stats.summary(
                        [r.ttft_s + slo.schedule_lag(r) for r in ok if r.ttft_s is not None]
                    ),
                    e2e_from_send=stats.summary([r.e2e_s for r in ok if r.e2e_s is not None]),
                    e2e_from_schedule=stats.summary([r.e2e_s + slo.schedule_lag(r) for r in ok if r.e2e_s is not None]),
                    behind=lag["p99"] is not None and lag["p99"] > thresholds.SCHEDULE_LAG_P99_MAX_S,
                )
            )
    return out


def to_json(checks: list[ScheduleCheck]) -> dict:
    return {
        "rule": RULE,
        "lag_p99_max_s": thresholds.SCHEDULE_LAG_P99_MAX_S,
        "phases": [{**asdict(c), "text": c.text()} for c in checks],
    }
