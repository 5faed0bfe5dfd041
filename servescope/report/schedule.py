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

from servescope.contracts import thresholds
from servescope.judgements import stats
from servescope.report import query
from servescope.report.load import Run

RULE = (
    f"schedule lag = send - scheduled instant; latency from the schedule = lag + latency from the send; a phase whose "
    f"lag p99 exceeds {thresholds.SCHEDULE_LAG_P99_MAX_S * 1000:g} ms is flagged (servescope/contracts/thresholds.py): the client "
    f"fell behind its schedule and send-based latency hides the wait (coordinated omission)"
)


# servescope/judgements/slo.schedule_lag in the engine: seconds the send came after its scheduled instant (0 without one).
LAG = "CASE WHEN scheduled_at IS NULL THEN 0.0 ELSE greatest(0.0, started_at - scheduled_at) END"


@dataclass
class ScheduleCheck:
    """One open-loop phase's schedule lag, and its TTFT and E2E counted from the send and from the schedule."""

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
        phases = run.con.execute(
            f"SELECT phase, first(engine ORDER BY {query.ORDER}), count(*) FROM requests "
            f"WHERE instance = ? AND scheduled_at IS NOT NULL GROUP BY phase ORDER BY min(({query.ORDER}))",
            [instance],
        ).fetchall()
        for phase, engine, n in phases:
            params = [instance, phase]
            lags = _summary(run, LAG, params, ok_only=False)
            out.append(
                ScheduleCheck(
                    instance=instance,
                    engine=engine,
                    phase=phase,
                    requests=n,
                    lag=lags,
                    ttft_from_send=_summary(run, "ttft_s", params),
                    ttft_from_schedule=_summary(run, f"ttft_s + {LAG}", params),
                    e2e_from_send=_summary(run, "e2e_s", params),
                    e2e_from_schedule=_summary(run, f"e2e_s + {LAG}", params),
                    behind=lags["p99"] is not None and lags["p99"] > thresholds.SCHEDULE_LAG_P99_MAX_S,
                )
            )
    return out


def _summary(run: Run, expr: str, params: list, ok_only: bool = True) -> dict:
    """stats.summary of an expression over one phase's scheduled requests (the successful ones, by default)."""
    where = ("ok AND " if ok_only else "") + "instance = ? AND phase = ? AND scheduled_at IS NOT NULL"
    return stats.summary(query.column(run.con, expr, where, params, order=False))


def to_json(checks: list[ScheduleCheck]) -> dict:
    return {
        "rule": RULE,
        "lag_p99_max_s": thresholds.SCHEDULE_LAG_P99_MAX_S,
        "phases": [{**asdict(c), "text": c.text()} for c in checks],
    }
