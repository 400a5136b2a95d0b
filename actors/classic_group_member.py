"""One member of a classic group as the coordinator keeps it: what it joined with, its waiting
join and sync answers, its assignment, and the record the group's state stores for it; and the
assignors a set of members names in common (actors/classic_group.py owns the group's rules)."""

from __future__ import annotations

from typing import Any

from actors.messages import GroupProtocol, JoinGroupRequest


class Member:
    __slots__ = ("member_id", "instance_id", "client_id", "session_timeout_ms", "rebalance_timeout_ms",
                 "protocols", "last_heartbeat_ns", "join_waiter", "sync_waiter", "assignment", "address")

    def __init__(self, member_id: str, instance_id: str | None, client_id: str, session_timeout_ms: int,
                 rebalance_timeout_ms: int, protocols: list[GroupProtocol], now_ns: int, assignment: bytes = b"") -> None:
        self.member_id = member_id
        self.instance_id = instance_id
        self.client_id = client_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.protocols = protocols
        self.last_heartbeat_ns = now_ns
        self.join_waiter: tuple[Any, int] | None = None
        self.sync_waiter: tuple[Any, int] | None = None
        self.assignment = assignment
        self.address: Any = None  # where the member's last request came from

    @classmethod
    def joining(cls, member_id: str, request: JoinGroupRequest, now_ns: int) -> "Member":
        return cls(member_id, request.group_instance_id, request.client_id, request.session_timeout_ms,
                   request.rebalance_timeout_ms, list(request.protocols), now_ns)

    def record(self) -> list[Any]:
        return [self.member_id, self.instance_id, self.client_id, self.session_timeout_ms, self.rebalance_timeout_ms,
                [[protocol.name, protocol.metadata] for protocol in self.protocols], self.assignment]

    @classmethod
    def from_record(cls, record: list[Any], now_ns: int) -> "Member":
        member_id, instance_id, client_id, session_ms, rebalance_ms, protocols, assignment = record
        return cls(member_id, instance_id, client_id, int(session_ms), int(rebalance_ms),
                   [GroupProtocol(name=name, metadata=bytes(metadata)) for name, metadata in protocols], now_ns,
                   bytes(assignment))


def named_by_all(members: list[Member]) -> set[str]:
    """The assignors every one of `members` names, in one walk of them. Asked name by name, with
    each member's names gathered again for each, a join into a group of 1,000 members naming 32
    assignors cost ~36 ms of the coordinator, and choosing the group's protocol ~40 ms."""
    shared: set[str] | None = None
    for member in members:
        names = {protocol.name for protocol in member.protocols}
        shared = names if shared is None else shared & names
        if not shared:
            break
    return shared or set()
