"""Parses Kafka records (read from the broker by the test) with real
clients: the CloudEvents SDK's Kafka binding and OpenTelemetry's W3C
trace-context propagator.

stdin: {"mode": "binary" | "structured" | "none", "records": [{"key": hex | null,
"value": hex | null, "headers": [[name, hex], ...]}, ...]} (hex: the exact bytes)
stdout: one JSON object per record, in order:
  {"event": {attributes..., "data": ...} | null, "error": str | null,
   "trace": {"trace_id": hex, "span_id": hex, "sampled": bool,
             "tracestate": str, "valid": bool} | null}
"""

import json
import sys

from cloudevents.core.bindings import kafka
from cloudevents.core.formats.json import JSONFormat
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator


def b(v):
    return None if v is None else bytes.fromhex(v)


def event_of(mode, message):
    if mode == "binary":
        event = kafka.from_binary(message, JSONFormat())
    elif mode == "structured":
        event = kafka.from_structured(message, JSONFormat())
    else:
        return None
    out = {}
    for name, value in event.get_attributes().items():
        out[name] = value.isoformat() if hasattr(value, "isoformat") else value
    data = event.get_data()
    out["data"] = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return out


def trace_of(headers):
    carrier = {name: value.decode("utf-8") for name, value in headers.items()}
    if "traceparent" not in carrier:
        return None
    context = TraceContextTextMapPropagator().extract(carrier=carrier)
    span = trace.get_current_span(context).get_span_context()
    return {
        "valid": span.is_valid,
        "trace_id": format(span.trace_id, "032x"),
        "span_id": format(span.span_id, "016x"),
        "sampled": span.trace_flags.sampled,
        "remote": span.is_remote,
        "tracestate": span.trace_state.to_header(),
    }


def main():
    request = json.load(sys.stdin)
    mode = request["mode"]
    for r in request["records"]:
        headers = {name: b(value) for name, value in r["headers"]}
        value = b(r["value"])
        message = kafka.KafkaMessage(headers=headers, key=b(r["key"]), value=value)
        result = {"event": None, "error": None, "trace": trace_of(headers)}
        try:
            result["event"] = event_of(mode, message)
        except Exception as e:  # reported to the test, which fails on it
            result["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(result))


main()
