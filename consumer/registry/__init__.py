"""The Schema Registry edge: schemas by id and subject (`client.SchemaRegistry`, over
confluent-kafka's async registry client, and `memory.MemoryRegistry`, its fake), and the record
codecs of a source's formats (`codecs`): JSON, and Avro, Protobuf and JSON Schema in the
Confluent wire format (a zero magic byte, the 4-byte schema id, for Protobuf the message
indexes, then the payload)."""
