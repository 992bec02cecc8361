"""Encodes values the way a service using confluent-kafka would before
writing them to a bytea payload column: AvroSerializer with a fresh
SchemaRegistryClient, the schema given, the subject by the default
TopicNameStrategy, looked up rather than registered.

stdin: {"registry": url, "topic": str, "schema": str, "values": [object, ...]}
stdout: one JSON object per value, in order: {"framed": hex} or {"error": str}
"""

import json
import sys

from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

import registry_client


def main():
    request = json.load(sys.stdin)
    client = registry_client.client(request["registry"])
    serializer = AvroSerializer(
        client, request["schema"], conf={"auto.register.schemas": False}
    )
    context = SerializationContext(request["topic"], MessageField.VALUE)
    for value in request["values"]:
        try:
            out = {"framed": registry_client.call("serialize", lambda: serializer(value, context)).hex()}
        except Exception as e:  # noqa: BLE001 - reported to the test
            out = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out))


main()
