"""Operating the pipeline: what a worker reports and how an operator reads it.

`metrics` (the Prometheus families), `health` (liveness and readiness), `stalls` (what a stuck stage looks like),
`summary` (the end-of-run line), `top` (``python -m stream top``), `verify` (an output topic read back against
its input: lost, duplicated, out of lineage), `compare` (``python -m stream compare``: two output topics joined
by input lineage, for shadow rollouts), `gc_pauses` (the garbage collector's pauses as a histogram).

Layer: imports `stream.errors`, `stream.config`, `stream.kafka` and `stream.codec`; the pipeline, the local
launchers and the gateway import it.
"""
