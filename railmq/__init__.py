"""railmq: a Kafka-style partitioned, replicated log, built as actor processes you can break.

The client API lives in submodules: `railmq.cluster.LocalCluster`, `railmq.admin.Admin`,
`railmq.producer.Producer`, `railmq.consumer.Consumer`, `railmq.share_consumer.ShareConsumer`.
"""

__version__ = "0.1.0"  # also in pyproject.toml; tests/cli/test_cli_basics.py checks they agree
