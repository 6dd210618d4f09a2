"""The demo models' schema names (`stream.models.demo`), in a module of their own so that what needs only the names
(the gateway's default input schema, `stream.models.declared`) does not import torch."""

EVENT_SCHEMA = "stream.demo.FraudEvent"  # the demo's schemas, in the repository's schemas/ folder
PREDICTION_SCHEMA = "stream.demo.FraudPrediction"
# the text demo's (--model minilm) input and output, in the schemas folder too
TEXT_EVENT_SCHEMA = "stream.demo.TextEvent"
TEXT_EMBEDDING_SCHEMA = "stream.demo.TextEmbedding"
TEXT_COPY_FIELDS = "event_id,event_ts_ms=ts_ms"
