"""Spreading a pool's requests over its replicas.

- round_robin: replica i, i+1, ... in turn (what a plain Kubernetes Service gives).
- least_outstanding: the replica with the fewest unfinished requests (ties: lowest index),
  what load balancers call least-request (Envoy's LEAST_REQUEST, NGINX's least_conn over
  one request a connection); a plain Kubernetes Service balances connections instead.
- prefix_affinity: requests sharing a prompt prefix go to the same replica, so its prefix
  cache keeps the prefix (consistent hashing on the prefix group); others least-outstanding.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capplan.sim.replica import Replica
    from capplan.sim.request import SimRequest


_OUTSTANDING = attrgetter("outstanding")


class Router:
    """Picks a replica for each new request."""

    def __init__(self, policy: str, replicas: list[Replica]) -> None:
        if policy not in ("round_robin", "least_outstanding", "prefix_affinity"):
            raise ValueError(f"unknown router policy {policy!r}")
        self.policy = policy
        self.replicas = replicas
        self._next = 0

    def route(self, r: SimRequest) -> Replica:
        reps = self.replicas
        if len(reps) == 1:
            return reps[0]
        if self.policy == "round_robin":
            rep = reps[self._next]
            self._next = (self._next + 1) % len(reps)
            return rep
        if self.policy == "prefix_affinity" and r.prefix_blocks:
            return reps[_mix(r.prefix_base) % len(reps)]
        return min(reps, key=_OUTSTANDING)

    def finished(self, r: SimRequest, replica: Replica) -> None:
        """Hook for policies that track completions (outstanding counts live on replicas)."""


def _mix(key: int) -> int:
    """A well-spread hash of a prefix group's key (splitmix64's finaliser)."""
    z = key & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)
