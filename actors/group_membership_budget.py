"""The bytes classic-group members make the group coordinator hold, and the bounds on them.

A member brings its ids, its subscription metadata and, once the leader has synced, its
assignment. The coordinator keeps them in memory, answers the group's leader with every member's
metadata in one JoinGroupResponse, and stores a stable group's members in one record of its state,
written again at every generation. A request is one frame of up to 32 MiB, and a coordinator holds
up to `groups_max` groups of `group_members_max` members: counted in members alone, that is
terabytes. So the bytes are bounded:

- one member: `group_member_bytes_max` (256 KiB);
- one group: `group_membership_bytes_max` (768 KiB: a stable group's record, written at every
  generation, is one entry of the group quorum's Raft log, at most 1 MiB, as Kafka's group
  metadata must fit one 1 MB record; it also keeps the leader's join answer small);
- every group together: `groups_membership_bytes_max` (64 MiB, as for committed offsets).

A join or a leader's assignments that would pass one is refused with LIMIT_REACHED naming it, and
the group keeps what it held. Texts (ids, assignor names) count in the bytes they are encoded in
(`text_bytes`): counted in characters, client ids above U+FFFF made members hold four times each
bound. A join is judged by an upper bound of what it adds (its member id's length is known only
once it is made); each group's count is measured again after every join and sync and whenever its
members, state or generation changed, so what members take away (leaving, expiring, a rebalance)
is given back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.messages import GroupProtocol, JoinGroupRequest, SyncGroupRequest
from actors.wire_bounds import text_bytes

if TYPE_CHECKING:
    from actors.classic_group import ClassicGroup, Member
    from actors.limits import Limits

# "-" and 12 hex digits after the client id, in a classic or a share member's id
# (GroupCoordinator._on_join, ShareMembership._member_for)
MEMBER_ID_SUFFIX_BYTES = 13


def protocols_bytes(protocols: list[GroupProtocol]) -> int:
    return sum(text_bytes(protocol.name) + len(protocol.metadata) for protocol in protocols)


def member_bytes(member: "Member") -> int:
    return (text_bytes(member.member_id) + text_bytes(member.instance_id or "") + text_bytes(member.client_id)
            + len(member.assignment) + protocols_bytes(member.protocols))


def _shape(group: "ClassicGroup") -> tuple:
    return group.state, group.generation, len(group.members)


class MembershipBudget:
    def __init__(self, limits: "Limits") -> None:
        self.limits = limits
        self._groups: dict[str, tuple[tuple, int]] = {}  # group id -> (shape when measured, bytes)
        self.total_bytes = 0

    def group_bytes(self, group_id: str) -> int:
        measured = self._groups.get(group_id)
        return measured[1] if measured is not None else 0

    def measure(self, group: "ClassicGroup") -> None:
        size = sum(member_bytes(member) for member in group.members.values())
        self.total_bytes += size - self.group_bytes(group.group_id)
        self._groups[group.group_id] = (_shape(group), size)

    def measure_if_reshaped(self, group: "ClassicGroup") -> None:
        measured = self._groups.get(group.group_id)
        if measured is None or measured[0] != _shape(group):
            self.measure(group)

    def forget(self, group_id: str) -> None:
        self.total_bytes -= self.group_bytes(group_id)
        self._groups.pop(group_id, None)

    def invariants(self, groups: dict[str, "ClassicGroup"]) -> None:
        """Every group's count covers what its members hold (only joins and syncs add bytes, and
        both are measured), and the bounds hold."""
        limits = self.limits
        assert self.total_bytes <= limits.groups_membership_bytes_max, f"members hold {self.total_bytes:,} bytes"
        for group_id, group in groups.items():
            held = sum(map(member_bytes, group.members.values()))
            assert held <= self.group_bytes(group_id) <= limits.group_membership_bytes_max, (
                f"group {group_id!r}: members hold {held:,} bytes, counted {self.group_bytes(group_id):,}")

    def refuse_join(self, group: "ClassicGroup | None", request: JoinGroupRequest) -> str | None:
        """Why this join would pass a bound, or None."""
        known = group.members.get(request.member_id) if group is not None and request.member_id else None
        if known is not None:  # a rejoin: only its subscription changes
            before = member_bytes(known)
            after = before - protocols_bytes(known.protocols) + protocols_bytes(request.protocols)
        else:
            before = 0
            after = (text_bytes(request.client_id or "member") + MEMBER_ID_SUFFIX_BYTES
                     + text_bytes(request.client_id) + text_bytes(request.group_instance_id or "")
                     + protocols_bytes(request.protocols))
        return self._refuse(request.group_id, after, after - before, "a member with its ids and subscription")

    def refuse_assignments(self, group: "ClassicGroup", request: SyncGroupRequest) -> str | None:
        """Why the leader's assignments would pass a bound, or None (also for a sync that
        carries none, or comes from another member: those assign nothing)."""
        if not request.assignments or request.member_id != group.leader:
            return None
        given = {entry.member_id: len(entry.assignment) for entry in request.assignments}
        largest, added = 0, 0
        for member in group.members.values():
            size = given.get(member.member_id, 0)
            largest = max(largest, member_bytes(member) - len(member.assignment) + size)
            added += size - len(member.assignment)
        return self._refuse(group.group_id, largest, added, "a member with its assignment")

    def _refuse(self, group_id: str, member_size: int, added: int, what: str) -> str | None:
        limits = self.limits
        if member_size > limits.group_member_bytes_max:
            return (f"{what} would take {member_size:,} bytes; group_member_bytes_max is "
                    f"{limits.group_member_bytes_max:,}")
        if self.group_bytes(group_id) + added > limits.group_membership_bytes_max:
            return (f"group {group_id!r} would hold {self.group_bytes(group_id) + added:,} bytes of members; "
                    f"group_membership_bytes_max is {limits.group_membership_bytes_max:,}")
        if self.total_bytes + added > limits.groups_membership_bytes_max:
            return (f"the coordinator's groups would hold {self.total_bytes + added:,} bytes of members; "
                    f"groups_membership_bytes_max is {limits.groups_membership_bytes_max:,}")
        return None
