"""Failure detection that tolerates jitter: phi accrual with a fixed floor and a ceiling.

A fixed silence rule ("gone after ``failure_timeout`` s") declares a member that is merely
slow -- a loaded machine whose heartbeats arrive late -- dead, and the cluster then moves its
partitions and back again. Instead each member's heartbeat inter-arrival times are sampled
(the last :data:`WINDOW`), and the *suspicion* of a silence of ``t`` seconds is

    phi(t) = -log10(P(the next heartbeat arrives later than t))

under a normal distribution with the samples' mean and standard deviation (Hayashibara et
al., "The phi accrual failure detector", 2004; the logistic approximation of the normal
tail that Akka uses). A member is **gone** once its silence is at least ``floor`` seconds
*and* phi reaches ``threshold`` -- so on a calm network the fixed timeout still decides,
and where heartbeats jitter the deadline stretches with the observed spread -- or once its
silence reaches ``ceiling`` seconds whatever phi says, so a gone member is always noticed.

Gaps that ended a silence longer than ``floor`` are not sampled: they are outages (a pause,
a restart), not the jitter of a member that kept running, and would otherwise make the next
outage of that member slow to notice.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

__all__ = ["WINDOW", "ArrivalWindow", "Detector"]

#: Inter-arrival samples kept per member.
WINDOW = 64


@dataclass
class ArrivalWindow:
    """The recent inter-arrival times of one member's heartbeats (seconds)."""

    samples: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    last: float | None = None

    def arrived(self, now: float, floor: float) -> None:
        if self.last is not None:
            gap = now - self.last
            if 0 <= gap <= floor:
                self.samples.append(gap)
        self.last = now

    def stats(self, bootstrap: float) -> tuple[float, float]:
        """``(mean, standard deviation)`` of the samples; ``bootstrap`` (the heartbeat
        interval) stands in for the mean until there are a few."""
        n = len(self.samples)
        if n < 3:
            return bootstrap, bootstrap / 2
        mean = sum(self.samples) / n
        variance = sum((s - mean) ** 2 for s in self.samples) / n
        return mean, math.sqrt(variance)


@dataclass(frozen=True, slots=True)
class Detector:
    """The rule of the module docstring. ``interval`` is the heartbeat interval: the
    expected mean before samples exist, and half of it is the smallest standard deviation
    used (a perfectly regular member must not look dead one millisecond late)."""

    interval: float
    floor: float
    threshold: float = 8.0
    ceiling_factor: float = 5.0

    @property
    def ceiling(self) -> float:
        return self.floor * self.ceiling_factor

    def phi(self, window: ArrivalWindow, silence: float) -> float:
        """Suspicion of a ``silence`` (seconds since the member was last heard)."""
        mean, std = window.stats(self.interval)
        std = max(std, self.interval / 2)
        y = (silence - mean) / std
        exponent = max(-700.0, min(700.0, -y * (1.5976 + 0.070566 * y * y)))
        e = math.exp(exponent)
        if silence > mean:
            return -math.log10(e / (1.0 + e))
        return -math.log10(1.0 - 1.0 / (1.0 + e))

    def gone(self, window: ArrivalWindow, silence: float) -> bool:
        """Whether a member silent for ``silence`` seconds is gone (see the module)."""
        if silence < self.floor:
            return False
        if silence >= self.ceiling:
            return True
        return self.phi(window, silence) >= self.threshold

    def deadline(self, window: ArrivalWindow) -> float:
        """The silence (seconds) at which the member would be declared gone now (for
        metrics and tests)."""
        lo, hi = self.floor, self.ceiling
        if self.gone(window, lo):
            return lo
        for _ in range(40):  # phi grows with silence: bisect
            mid = (lo + hi) / 2
            if self.gone(window, mid):
                hi = mid
            else:
                lo = mid
        return hi
