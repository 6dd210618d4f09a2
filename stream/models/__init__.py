"""Model handlers: the protocol's types (`InputSpec`, `OutputSpec`, from `stream.models.spec`; `TextBuffer`, the
string input of ``text_buffer=True``, from `stream.models.text_buffer`) and the built-in
handlers (`demo`: the fraud MLP; `exported`: a `torch.export` archive; `minilm`: all-MiniLM-L6-v2 text embeddings,
with `bert` and `shapes`).

Layer: above `stream.errors` only; the pipeline, the codec's encoder and the benchmarks import it. Importing this
package imports no model (and not torch): only the types.
"""

from stream.models.spec import INPUT_DTYPES, NUMERIC_DTYPES, OUTPUT_TYPES, InputSpec, OutputSpec
from stream.models.text_buffer import TextBuffer

__all__ = ["INPUT_DTYPES", "NUMERIC_DTYPES", "OUTPUT_TYPES", "InputSpec", "OutputSpec", "TextBuffer"]
