"""The benchmark: the worker against its limit and its peers, in one run, on the same data and model."""

# The last revision before the field plans (issue 31): `make bench` compares the demo layout's drain with it.
BEFORE_FIELD_PLANS = "41686ef"
