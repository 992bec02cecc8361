"""Decodes Kafka record values in the Confluent wire format with
confluent-kafka's own AvroDeserializer and a fresh SchemaRegistryClient,
which fetches each writer schema by the id in the frame, as any consumer
would.

stdin: {"registry": url, "topic": str, "values": [hex | null, ...]}
stdout: one JSON object per value, in order:
  {"value": <the decoded datum, JSON-friendly>, "schema_id": int} or
  {"error": str}
JSON-friendly: datetimes as epoch milliseconds (UTC), dates as ISO text,
Decimals as their exact text, UUIDs as text, bytes as hex.
"""

import datetime
import decimal
import json
import sys
import uuid

from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

import registry_client

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def plain(v):
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=datetime.timezone.utc)
        return (v - EPOCH) // datetime.timedelta(milliseconds=1)
    if isinstance(v, datetime.date):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, bytes):
        return v.hex()
    return v


def main():
    request = json.load(sys.stdin)
    client = registry_client.client(request["registry"])
    deserializer = AvroDeserializer(client)
    context = SerializationContext(request["topic"], MessageField.VALUE)
    for value in request["values"]:
        try:
            raw = bytes.fromhex(value)
            datum = registry_client.call("deserialize", lambda: deserializer(raw, context))
            out = {"value": plain(datum), "schema_id": int.from_bytes(raw[1:5], "big")}
        except Exception as e:  # noqa: BLE001 - reported to the test
            out = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out))


main()
