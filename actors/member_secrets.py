"""Member secrets: only the process that joined as a group member may act as it.

A member id is no proof of who is asking: DescribeGroup lists every member id of a group and its
generation, and DescribeSharePartitions names each lock's holder (operators need both). With
them, any client could leave a group as another member, commit offsets in its name (the group
then skips records nobody handled), accept a share member's records (never handled, never
delivered again), or rejoin as it.

So a join is answered with a secret as well as a member id, and every later request of that
member carries it (`member_secret`); a request naming a member without its secret is refused
`UNKNOWN_MEMBER_ID` and changes nothing. The secret is derived, never stored: BLAKE2b keyed with
the cluster secret over the group and member ids. Every voter of the group quorum and a restarted
coordinator derive the same one, nothing new is written to the group state, and nothing shows it
but the member's own join answer. What a member secret does not cover (no authentication of
clients at all) is in docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac

SECRET_BYTES = 16
_PERSON = b"railmq-member"  # this use of the cluster secret, apart from message tags (transport/auth.py)
_KEY_BYTES_MAX = 64  # the longest key BLAKE2b takes


class MemberSecrets:
    """Derives and checks member secrets under one key (a cluster's secret; tests use any)."""

    def __init__(self, key: bytes = b"") -> None:
        self.key = bytes(key[:_KEY_BYTES_MAX])

    def of(self, group_id: str, member_id: str) -> bytes:
        group = group_id.encode("utf-8", "surrogatepass")  # the group's length first: no two pairs read alike
        message = len(group).to_bytes(4, "big") + group + member_id.encode("utf-8", "surrogatepass")
        return hashlib.blake2b(message, key=self.key, digest_size=SECRET_BYTES, person=_PERSON).digest()

    def proves(self, group_id: str, member_id: str, secret: bytes) -> bool:
        """Whether `secret` is the one this member's join was answered with (compared in
        constant time: an attacker learns nothing from how long a refusal takes)."""
        return hmac.compare_digest(self.of(group_id, member_id), bytes(secret))


def refusal_text(group_id: str, member_id: str) -> str:
    return (f"the request names member {member_id[:64]!r} of group {group_id[:64]!r} without its "
            "member secret (from that member's join answer): only the process that joined as a member "
            "may act as it")
