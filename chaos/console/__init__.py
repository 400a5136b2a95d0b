"""The live console: a cluster's topology, rates, lag, event timeline, fault buttons and the story
of one offset, in a browser (`railmq console`, `railmq up --console`), as Prometheus metrics and
in the terminal (`railmq top`).

It lives under chaos/ because it reuses the chaos harness's fault plans (chaos/links.py), its
report's charts and the labs, and the import direction (DESIGN.md) lets only chaos/ and the CLI
roof use those. It is an observer with a few buttons: it reads metadata, counters and the
actors' trace file, and never touches a record, an offset or a file of the cluster.

    traces.py     follow trace.jsonl across rotations; scan old files for one partition
    events.py     trace lines -> timeline entries (category, severity, sentence)
    snapshot.py   the view the page draws: topology, rates, lag (pure)
    journal.py    what the console saw over time, per partition and group (for explain)
    collector.py  the polling thread that builds snapshots and feeds subscribers
    faults.py     kill, pause, resume, isolate, heal: by supervisor, pid or fault switch
    explain.py    the life of one offset
    metrics.py    Prometheus exposition with Kafka's names
    app.py        the HTTP routes (starlette), server-sent events
    server.py     uvicorn in a thread, started and stopped cleanly
    top.py        `railmq top` (rich Live)
"""
