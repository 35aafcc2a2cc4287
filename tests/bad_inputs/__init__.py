"""One module per entry point, each with `CASES`: a list of `tests.bad_input.Case`."""
