"""The optional C extensions (stream/kafka/_nativeproduce.c, stream/kafka/_nativeconsume.c, sharing
stream/kafka/_rdkafka.h; stream/codec/_nativecodec.c; stream/models/_textprep.c, the text model's tokenizing of
ASCII texts and pass planning); everything else is configured in pyproject.toml. Where they cannot be compiled (no
C compiler), the install still succeeds: the worker then takes input and publishes through confluent-kafka and
decodes and encodes with numpy, and --model minilm tokenizes every text with the tokenizers library."""

from setuptools import Extension, setup

_FLAGS = ["-O3", "-Wall", "-Wextra", "-Wno-missing-field-initializers"]
setup(ext_modules=[
    Extension("stream.kafka._nativeproduce", ["stream/kafka/_nativeproduce.c"], depends=["stream/kafka/_rdkafka.h"],
              libraries=["dl", "pthread"], extra_compile_args=_FLAGS, optional=True),
    Extension("stream.kafka._nativeconsume", ["stream/kafka/_nativeconsume.c"], depends=["stream/kafka/_rdkafka.h"],
              libraries=["dl"], extra_compile_args=_FLAGS, optional=True),
    Extension("stream.codec._nativecodec", ["stream/codec/_nativecodec.c"], extra_compile_args=_FLAGS, optional=True),
    Extension("stream.models._textprep", ["stream/models/_textprep.c"], extra_compile_args=_FLAGS, optional=True),
])
