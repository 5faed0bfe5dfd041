"""One clock for records stamped in several processes: a worker's offset to the master's clock, and its bound."""

from __future__ import annotations


def clock_offset(probes: list[tuple[float, float, float]]) -> tuple[float, float, float] | None:
    """(offset to add to this clock's epoch stamps, the estimate, its error bound) from probes of another clock.

    Each probe: t1 = this clock's epoch time when the question left, the round trip (monotonic), t2 = the other
    clock's time in its answer. The other clock read t2 somewhere inside the round trip: from the probe with the
    shortest one, offset = t2 - (t1 + rtt/2), wrong by at most rtt/2. An estimate within that bound cannot be
    told from 0; on one host it is 0 (one clock), so nothing is shifted. None: no probe came back.
    """
    if not probes:
        return None
    t1, rtt, t2 = min(probes, key=lambda p: p[1])
    estimate, bound = t2 - (t1 + rtt / 2), rtt / 2
    return (0.0 if abs(estimate) <= bound else estimate), estimate, bound
