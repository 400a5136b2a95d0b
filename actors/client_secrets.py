"""Client secrets: an identity the cluster hands a client is proved with a secret, not claimed.

Two identities are handed to clients and then named in their requests:

- **A group member's id.** DescribeGroup lists every member id of a group and its generation, and
  DescribeSharePartitions names each lock's holder (operators need both). With them, any client
  could leave a group as another member, commit offsets in its name (the group then skips records
  nobody handled), accept a share member's records (never handled, never delivered again), or
  rejoin as it. So a join is answered with a member secret as well, and every later request of
  that member carries it (`member_secret`); a request naming a member without its secret is
  refused `UNKNOWN_MEMBER_ID` and changes nothing.
- **An idempotent producer's id.** Every batch it writes carries its id in the batch header, so
  anyone who reads the log learns it. With it, any client could take the producer's next sequence
  numbers (its own send then failed `DUPLICATE_SEQUENCE_NUMBER`) or fence it with a higher epoch.
  So InitProducerId is answered with a producer secret as well, and a produce request whose batch
  names a producer id carries it (`producer_secret`), or the leader refuses it
  `CLUSTER_AUTHORIZATION_FAILED` (what Kafka answers a producer without the IdempotentWrite ACL)
  and stores nothing.

A secret is derived, never stored: BLAKE2b keyed with the cluster secret over the identity, with
a personalisation string per kind, so a member secret never proves a producer. Every controller
and group voter, every leader and every restart derive the same one, nothing new is written to
any state, and nothing shows it but the answer that handed the identity out. What client secrets
do not cover (no authentication of clients at all) is in docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac

SECRET_BYTES = 16
_KEY_BYTES_MAX = 64  # the longest key BLAKE2b takes


class _Secrets:
    """Derives and checks one kind of secret under one key (a cluster's secret; tests use any)."""

    PERSON = b""  # BLAKE2b's personalisation: which identity a secret is for

    def __init__(self, key: bytes = b"") -> None:
        self.key = bytes(key[:_KEY_BYTES_MAX])

    def _derive(self, message: bytes) -> bytes:
        return hashlib.blake2b(message, key=self.key, digest_size=SECRET_BYTES, person=self.PERSON).digest()

    @staticmethod
    def _matches(expected: bytes, secret: bytes) -> bool:
        """Compared in constant time: an attacker learns nothing from how long a refusal takes."""
        return hmac.compare_digest(expected, bytes(secret))


class MemberSecrets(_Secrets):
    PERSON = b"railmq-member"

    def of(self, group_id: str, member_id: str) -> bytes:
        group = group_id.encode("utf-8", "surrogatepass")  # the group's length first: no two pairs read alike
        member = member_id.encode("utf-8", "surrogatepass")
        return self._derive(len(group).to_bytes(4, "big") + group + member)

    def proves(self, group_id: str, member_id: str, secret: bytes) -> bool:
        """Whether `secret` is the one this member's join was answered with."""
        return self._matches(self.of(group_id, member_id), secret)


class ProducerSecrets(_Secrets):
    PERSON = b"railmq-producer"

    def of(self, producer_id: int) -> bytes:
        return self._derive(producer_id.to_bytes(8, "big", signed=True))

    def proves(self, producer_id: int, secret: bytes) -> bool:
        """Whether `secret` is the one InitProducerId handed out with this producer id."""
        return self._matches(self.of(producer_id), secret)


def refusal_text(group_id: str, member_id: str) -> str:
    return (f"the request names member {member_id[:64]!r} of group {group_id[:64]!r} without its "
            "member secret (from that member's join answer): only the process that joined as a member "
            "may act as it")


def producer_refusal_text(producer_id: int) -> str:
    return (f"the batch names producer id {producer_id} without its producer secret (from the InitProducerId "
            "answer that handed the id out): only the producer given an id may write under it")
