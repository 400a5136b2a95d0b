"""Take the console screenshot docs/console.md shows (docs/pictures/console.png).

    python docs/tools/console_screenshot.py [--out docs/pictures/console.png]

A 3-node cluster with two topics under a steady keyed load and a consumer group that falls
behind on purpose, the console beside it (as `railmq up --console` runs it); one press of "kill
leader" so the timeline and the chart show a failover, then "explain" on an early offset. Needs
Debian's chromium (chaos/console/browser.py). Unlike the SVG pictures this one is a photograph
of a live run, so it is not checked for being current.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

OUT_DEFAULT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pictures", "console.png"
)


def _load(bootstrap: str, stop: threading.Event) -> None:
    from railmq.producer import Producer

    with Producer(bootstrap, acks="all", idempotent=True, linger_ms=5) as producer:
        sent = 0
        while not stop.is_set():
            producer.send("orders", f"order-{sent}", key=f"customer-{sent % 11}")
            if sent % 3 == 0:
                producer.send("payments", f"payment-{sent}", key=f"customer-{sent % 7}")
            sent += 1
            time.sleep(0.002)
        producer.flush(30)


def _slow_group(bootstrap: str, stop: threading.Event) -> None:
    from railmq.consumer import Consumer

    with Consumer(
        bootstrap, group_id="billing", auto_offset_reset="earliest", max_poll_records=50
    ) as consumer:
        consumer.subscribe(["orders"])
        while not stop.is_set():
            consumer.poll(200)
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT_DEFAULT)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from chaos.console.browser import launch, why_no_browser
    from chaos.console.server import Console
    from railmq.admin import Admin
    from railmq.cluster import LocalCluster

    if why_no_browser():
        raise SystemExit(why_no_browser())
    with LocalCluster(3, fault_injection=True) as cluster:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(
                "orders", partitions=3, replication_factor=3, config={"min_insync_replicas": 2}
            )
            admin.create_topic(
                "payments", partitions=2, replication_factor=3, config={"min_insync_replicas": 2}
            )
            for topic in ("orders", "payments"):
                admin.wait_for_leaders(topic, full_isr=True)
        stop = threading.Event()
        workers = [
            threading.Thread(target=work, args=(cluster.bootstrap, stop)) for work in (_load, _slow_group)
        ]
        for worker in workers:
            worker.start()
        try:
            with Console(cluster.bootstrap, cluster=cluster) as console, sync_playwright() as playwright:
                browser = launch(playwright)
                try:
                    page = browser.new_page(viewport={"width": 1440, "height": 1200})
                    page.goto(console.url + "/")
                    time.sleep(8)
                    page.click(
                        "[data-testid=partition][data-topic='orders'][data-partition='1'] "
                        "[data-testid=kill-leader]"
                    )
                    time.sleep(6)
                    page.fill("#explain-offset", "40")
                    page.click("#explain-button")
                    page.wait_for_selector("[data-testid=story-step]")
                    time.sleep(1.5)
                    page.screenshot(path=args.out, full_page=True)
                finally:
                    browser.close()
        finally:
            stop.set()
            for worker in workers:
                worker.join(60)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
