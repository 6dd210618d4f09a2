"""The benchmark: the worker against its limit and its peers, in one run, on the same data and model."""
