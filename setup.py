"""The optional C extension (stream/_nativeproduce.c); everything else is configured in pyproject.toml. Where it
cannot be compiled (no C compiler), the install still succeeds and the worker publishes through confluent-kafka."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("stream._nativeproduce", ["stream/_nativeproduce.c"], libraries=["dl", "pthread"],
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
                             optional=True)])
