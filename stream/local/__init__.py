"""Local servers for development, tests and benchmarks: never needed to run the worker against your own cluster.

`broker` (Apache Kafka from Maven Central on Java 17, one node or a replicated cluster, or Tansu), `kafka_node`
(a node's cluster id, heap, threads and ``server.properties``), `kafka_security` (SASL_SSL and ACLs for
``--sasl``), `cluster_supervisor` (``python -m stream broker --nodes N`` and ``broker-node``), `registry_server`
(Apicurio Registry), `maven` and `cache` (what they need, fetched once into the cache by one process at a
time), `children` (child processes stopped by PID), `demo` (``python -m stream demo``).

Layer: imports `stream.errors`, `stream.config`, `stream.models`, `stream.kafka`, `stream.codec` and `stream.ops`;
the gateway does not need it, the commands and the benchmarks do.
"""
