"""Decodes Kafka record values in the Confluent wire format with
confluent-kafka's own JSONDeserializer, given no schema of its own and a
fresh SchemaRegistryClient: it fetches the writer schema by the id in the
frame and validates each value with it (the jsonschema package), as a
consumer without a local schema would.

stdin: {"registry": url, "topic": str, "values": [hex | null, ...]}
stdout: one JSON object per value, in order:
  {"value": <the decoded document>, "schema_id": int} or {"error": str}
"""

import json
import sys

from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

import registry_client


def main():
    request = json.load(sys.stdin)
    client = registry_client.client(request["registry"])
    deserializer = JSONDeserializer(None, schema_registry_client=client)
    context = SerializationContext(request["topic"], MessageField.VALUE)
    for value in request["values"]:
        try:
            raw = bytes.fromhex(value)
            document = registry_client.call("deserialize", lambda: deserializer(raw, context))
            out = {"value": document, "schema_id": int.from_bytes(raw[1:5], "big")}
        except Exception as e:  # noqa: BLE001 - reported to the test
            out = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out))


main()
