"""The Schema Registry client of the scripts here: confluent-kafka's, with a
request timeout, a note on stderr for a slow call, and a dump of every
thread's stack before the harness's kill.

Why: this client's HTTP session has no timeout unless given one, so a
request the registry never answers waits forever (its own retries, on
network errors and timeouts, never start). In CI (2026-12-06)
write_avro.py was killed by the harness after 180 s with nothing on stderr,
while the other tests kept using the same registry; which request hung, or
whether it was one at all, could not be told. Now a request without an
answer within TIMEOUT_S is sent again by the client (`max.retries`, 3 by
default, with backoff: about 80 s in all against a silent registry), a
call slower than SLOW_S is said on stderr, and a script still running at
DUMP_AFTER_S prints where each thread is (faulthandler) before it is
killed, so the test's failure names the place.
"""

import faulthandler
import sys
import time

from confluent_kafka.schema_registry import SchemaRegistryClient

TIMEOUT_S = 20
SLOW_S = 2
# Under the harness's 180 s (tests/harness/python.rs, READER_TIMEOUT).
DUMP_AFTER_S = 150


def client(url):
    faulthandler.dump_traceback_later(DUMP_AFTER_S, exit=False)
    return SchemaRegistryClient({"url": url, "timeout": TIMEOUT_S})


def call(what, f):
    """f(), said on stderr if it took longer than SLOW_S."""
    started = time.monotonic()
    try:
        return f()
    finally:
        took = time.monotonic() - started
        if took > SLOW_S:
            print(f"{what} took {took:.1f} s", file=sys.stderr, flush=True)
