"""The worker: input in micro-batches through the model to predictions, commits after acknowledgement.

`worker` (the process: threads, signals, shutdown), `failure` (its first failure), `batching` (closing batches
by count or time), `spans` (records into the open batch, a closed batch into spans, spans acknowledged), `stage` (the
prepare, device and finish stages), `processing` (one batch: decode, bind, predict, encode, publish, dead-letter),
`inference` (handlers and devices), `inputs` (decoded columns into model inputs), `contract` (the decode stage, shared
with the gateway), `stops` (a stop on purpose, noted for the next start), `schemas` (the reader and output
schemas a handler needs), `committer`, `rebalance` and `transactions` (the commit policy at-least-once and
exactly-once, and what an assignment change does to them), `pausing` (backpressure), `stall_check`, `stop_at_end`,
`runtime` (the process's allocator and threads), `faults` (test-only fault injection).

Layer: imports every layer below it (`stream.errors`, `stream.config`, `stream.models`, `stream.kafka`,
`stream.codec`, `stream.ops`); the commands (`stream.cli`, `stream.bench`) import it, and the gateway its decode
stage (`contract`, which loads no model and no torch for the built-in models).
"""
