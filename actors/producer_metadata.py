"""A producer's metadata (mixed into `ProducerClient`, actors/producer_client.py): which leader
each partition has, asked of the active controller one request at a time and asked again while
something is still wanted (the chase); the producer id an idempotent producer is numbered under;
and which voter to ask when one that does not lead answers."""

from __future__ import annotations

from actors.actor import MS
from actors.client_metadata import checked_topic
from actors.effects import Effect, Notify, Send, Trace
from actors.errors import ErrorCode
from actors.messages import (
    InitProducerIdRequest, InitProducerIdResponse, MetadataRequest, MetadataResponse, TopicMetadata,
)


class ProducerMetadata:
    """Uses `ProducerClient`'s `controllers`, `settings`, `topics`, `waiting`, `correlation`, the
    metadata and producer-id fields, `unreachable`, `sequences` and `_dispatch`."""

    def _request_metadata(self, topics: list[str], now_ns: int | None = None) -> list[Effect]:
        """Ask for metadata: one request at a time, and after an answer that did not help (no
        leader yet) not again before `retry_backoff_ms` (the chase asks again)."""
        self.metadata_wanted |= set(topics)
        if self.metadata_correlation and set(topics) <= self.metadata_asked:
            return []  # the request in flight asks for them already (not one more per answer)
        if now_ns is not None and now_ns - self.metadata_answered_ns < self.settings.retry_backoff_ms * MS:
            return []  # the chase asks for everything still wanted once the backoff has passed
        self.correlation += 1
        self.metadata_correlation = self.correlation
        self.metadata_asked = set(self.metadata_wanted)
        return [Send(self.bootstrap, MetadataRequest(correlation_id=self.correlation,
                                                     topics=sorted(self.metadata_wanted)))]

    def _on_metadata(self, response: MetadataResponse, now_ns: int) -> list[Effect]:
        self.controllers.learn(response.controller_endpoints)
        if 0 < response.correlation_id <= self.correlation:
            self.metadata_answered_ns = now_ns  # an earlier request's answer too: the backoff runs from it
        if response.correlation_id == self.metadata_correlation:
            self.metadata_correlation = 0
        effects: list[Effect] = []
        told: list[TopicMetadata] = []
        in_use = self.metadata_wanted | {topic for topic, _ in self.waiting}
        for topic in response.topics:
            if topic.name not in in_use and topic.name not in self.topics:
                continue  # nobody asked about it: not kept (the map holds only topics in use)
            topic = checked_topic(topic)
            self.topics[topic.name] = topic
            told.append(topic)
            if topic.error == ErrorCode.NONE:
                self.metadata_wanted.discard(topic.name)
        effects.append(Notify("metadata", told))
        for key in list(self.waiting):
            effects += self._dispatch(key, now_ns)
        return effects

    def _on_producer_id(self, response: InitProducerIdResponse, now_ns: int) -> list[Effect]:
        if response.correlation_id != self.producer_id_correlation or self.producer_id >= 0:
            # A producer is numbered once: a late or duplicated answer would restart its
            # sequences under another id while batches numbered under the first are in flight.
            return []
        if response.error != ErrorCode.NONE or response.producer_id < 0 or response.producer_epoch < 0:
            # Asked again by the chase, not at once: a controller that keeps refusing (busy, not
            # ready) is asked once a chase interval, not once a round trip.
            return [Trace("producer-id-refused", {"error": response.error,
                                                  "producer_id": response.producer_id})]
        self.producer_id, self.sequences.base_epoch = response.producer_id, response.producer_epoch
        self.producer_secret = response.producer_secret
        effects: list[Effect] = []
        for key in list(self.waiting):
            effects += self._dispatch(key, now_ns)
        return effects

    def _leader_endpoint(self, key: tuple[str, int], now_ns: int) -> str:
        topic = self.topics.get(key[0])
        if topic is None or not 0 <= key[1] < len(topic.partitions):
            return ""
        endpoint = topic.partitions[key[1]].leader_endpoint
        if self.unreachable.get(endpoint, 0) > now_ns:
            return ""  # metadata older than the disconnect we saw: wait for the new leader
        return endpoint

    def _forget_leader(self, key: tuple[str, int]) -> None:
        topic = self.topics.get(key[0])
        if topic is not None and 0 <= key[1] < len(topic.partitions):
            topic.partitions[key[1]].leader_endpoint = ""

    def _chase(self) -> list[Effect]:
        """Ask again for what is still wanted: the previous answer may be lost or stale."""
        effects: list[Effect] = []
        if self.metadata_wanted:
            if self.metadata_correlation:
                self.controllers.rotate()  # unanswered for a whole interval: that voter may be gone
            self.metadata_correlation = 0
            effects += self._request_metadata([])
        if self.settings.idempotent and self.producer_id < 0:
            effects.append(Send(self.bootstrap,
                                InitProducerIdRequest(correlation_id=self.producer_id_correlation)))
        return effects

    def _ask_controller_again(self, correlation_id: int) -> list[Effect]:
        """A voter that does not lead answered: ask the one it named (or the next one)."""
        effects: list[Effect] = []
        # voters naming each other: asked again when the chase is due
        if not self.controllers.follow_at_once():
            if correlation_id == self.metadata_correlation:
                self.metadata_correlation = 0
            return effects
        if correlation_id == self.metadata_correlation:
            self.metadata_correlation = 0
            effects += self._request_metadata([])
        if correlation_id == self.producer_id_correlation and self.producer_id < 0:
            effects.append(Send(self.bootstrap,
                                InitProducerIdRequest(correlation_id=self.producer_id_correlation)))
        return effects
