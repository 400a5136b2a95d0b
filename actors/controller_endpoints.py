"""Where a process sends metadata requests: the controller quorum's voters, and which one leads.

Every process that talks to the controller (clients, replicas, node agents, the group
coordinator, admin tools) is given a bootstrap string: one endpoint, or several separated by
commas (KRaft's `controller.quorum.voters`). It keeps one `ControllerEndpoints` and sends to
`current`. The rules, the same everywhere:

- an `ErrorResponse` with `NOT_CONTROLLER` names the active controller when the voter knows it:
  go there (`redirect`); without a hint an election is under way: try the next voter;
- a request that went unanswered, or a connection that dropped, moves to the next voter (`rotate`);
- a metadata answer lists every voter (`learn`), so a client bootstrapped with one address can
  still find the quorum when that voter dies; a voter or hint no cluster process could be
  (`named_endpoint`) is not taken;
- hints are followed at once only as many times in a row as there are voters (`follow_at_once`):
  voters naming each other (a stale or hostile pair) would otherwise keep a client asking at
  network speed; past that, the caller asks again on its next tick, until a metadata answer.

A single coordinator (no quorum) is the one-endpoint case: it never answers `NOT_CONTROLLER`, and
rotating among one endpoint changes nothing. The list is bounded (`ENDPOINTS_MAX`): an answer
naming more voters than any quorum has is a hostile one, and only its first voters are kept.
"""

from __future__ import annotations

from typing import Any

from actors.errors import ErrorCode

ENDPOINTS_MAX = 16  # voters a quorum may have (odd, usually 3 or 5): more is a hostile answer
# An endpoint an answer names is at most this long: `tcp://`, a host name (253 characters in DNS)
# and a port. A 10 KB one was looked up by libzmq at each reconnect of each client.
NAMED_ENDPOINT_CHARS_MAX = len("tcp://") + 253 + len(":65535")
# ZeroMQ transports that reach sockets of this machine alone. A cluster's processes listen on TCP
# (transport/runtime.py), so an answer naming one of these points a client at a socket it picked.
LOCAL_TRANSPORTS = ("ipc:", "inproc:")


def named_endpoint(endpoint: object) -> bool:
    """Whether an endpoint an answer names (a leader, the group coordinator, a voter) may be
    connected to. An answer is a claim, and any local process may answer on a dead leader's port:
    no local transport, no `tcp://A;B` (ZeroMQ binds the client's side to A first: a port a
    restarting broker needs), nothing past `NAMED_ENDPOINT_CHARS_MAX` or unprintable. What ZeroMQ
    cannot parse at all the runtime drops and counts (`dropped_out_bad_endpoint`)."""
    return (isinstance(endpoint, str) and 0 < len(endpoint) <= NAMED_ENDPOINT_CHARS_MAX
            and endpoint.isprintable() and not endpoint.lower().startswith(LOCAL_TRANSPORTS)
            and ";" not in endpoint and " " not in endpoint)


def split_bootstrap(bootstrap: str) -> list[str]:
    endpoints = [part.strip() for part in bootstrap.split(",") if part.strip()]
    return list(dict.fromkeys(endpoints))[:ENDPOINTS_MAX] or [bootstrap]


class ControllerEndpoints:
    def __init__(self, bootstrap: str) -> None:
        self.endpoints = split_bootstrap(bootstrap)
        self.index = 0
        self.redirects = 0
        self.redirects_in_a_row = 0  # since the last metadata answer

    @property
    def current(self) -> str:
        return self.endpoints[self.index]

    def __contains__(self, endpoint: object) -> bool:
        return endpoint in self.endpoints

    def __len__(self) -> int:
        return len(self.endpoints)

    def rotate(self) -> str:
        self.index = (self.index + 1) % len(self.endpoints)
        return self.current

    def redirect(self, hint: str) -> str:
        """Follow a NOT_CONTROLLER hint (or, with none, try the next voter)."""
        self.redirects += 1
        self.redirects_in_a_row += 1
        if not named_endpoint(hint):
            return self.rotate()
        if hint not in self.endpoints:
            if len(self.endpoints) >= ENDPOINTS_MAX:
                return self.rotate()
            self.endpoints.append(hint)
        self.index = self.endpoints.index(hint)
        return self.current

    def learn(self, endpoints: list[str]) -> None:
        """Adopt the voter list a controller announced, keeping the current target when it is one."""
        self.redirects_in_a_row = 0  # a controller answered: the hints led somewhere
        wanted = [endpoint for endpoint in endpoints if named_endpoint(endpoint)][:ENDPOINTS_MAX]
        if not wanted or wanted == self.endpoints:
            return
        current = self.current
        self.endpoints = list(dict.fromkeys(wanted))
        self.index = self.endpoints.index(current) if current in self.endpoints else 0

    def follow_at_once(self) -> bool:
        """Whether to send again at once after a redirect, or wait for the next tick."""
        return self.redirects_in_a_row <= len(self.endpoints)

    def take(self, message: Any) -> bool:
        """True when `message` is a NOT_CONTROLLER answer (and the target moved): the caller
        sends its request again, to `current`."""
        if getattr(message, "error", 0) != ErrorCode.NOT_CONTROLLER:
            return False
        self.redirect(getattr(message, "controller_endpoint", ""))
        return True
