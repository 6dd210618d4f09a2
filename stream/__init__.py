"""Kafka streaming micro-batch inference worker.

The packages are layers, lowest first; a module imports only from its own package and those below it
(`tests/unit/test_layers.py` checks every import):

- this package's `errors` and `config`: the errors every layer raises, the worker's settings;
- `models`: the handler protocol's types and the built-in handlers;
- `kafka`: clients, topics, offsets, replies, the C consumer and producer;
- `codec`: Avro in the Confluent wire format, decoders and encoders (C and numpy);
- `ops`: metrics, health, stalls, ``top``, verify, compare;
- `pipeline`: the worker;
- `local`: local brokers and registries for development and tests, the demo;
- `gateway`: the HTTP front for callers that wait;
- the commands: `cli` (``python -m stream``) and `bench`.
"""

__version__ = "0.1.0"
