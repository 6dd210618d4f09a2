"""Kafka plumbing: the clients the worker and the gateway talk to brokers with, and nothing about models.

- taking input: `intake` (confluent-kafka's ``consume()`` or the C consumer), `records` (a consumed batch as
  arrays), `native` (the C producer and consumer, `_nativeproduce.c` and `_nativeconsume.c` over `_rdkafka.h`);
- publishing: `publish` (the output producer, joined produce calls, flushes, transactions, a stuck or broken
  producer replaced), `delivery` (a span's records counted down as the broker acknowledges them), `guarded`
  (calls that may never return, on a thread of their own), `offsets` (spans of records and the acknowledged prefix
  per partition), `deadline` (the time bounds of flushes and closes);
- topics and rights: `topics` (admin helpers), `access` (what the principal may do, and the ACL to grant when it
  may not), `replies` (the ``stream.reply`` header and where a reply may go);
- what librdkafka says: `client_logs` (its logs in the worker's words), `client_stats` (its statistics).

Layer: imports only `stream.errors` and `stream.config`; the codec, ops, the pipeline, the local launchers and
the gateway import it.
"""
