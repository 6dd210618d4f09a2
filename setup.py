"""The optional C extensions (stream/_nativeproduce.c, stream/_nativeconsume.c, sharing stream/_rdkafka.h;
stream/_nativecodec.c); everything else is configured in pyproject.toml. Where they cannot be compiled (no C
compiler), the install still succeeds: the worker then takes input and publishes through confluent-kafka and decodes
and encodes with numpy."""

from setuptools import Extension, setup

_FLAGS = ["-O3", "-Wall", "-Wextra", "-Wno-missing-field-initializers"]
setup(ext_modules=[
    Extension("stream._nativeproduce", ["stream/_nativeproduce.c"], depends=["stream/_rdkafka.h"],
              libraries=["dl", "pthread"], extra_compile_args=_FLAGS, optional=True),
    Extension("stream._nativeconsume", ["stream/_nativeconsume.c"], depends=["stream/_rdkafka.h"],
              libraries=["dl"], extra_compile_args=_FLAGS, optional=True),
    Extension("stream._nativecodec", ["stream/_nativecodec.c"], extra_compile_args=_FLAGS, optional=True),
])
