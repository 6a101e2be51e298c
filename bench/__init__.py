"""Benchmarks run by `make bench`; each module prints its figures and the command that made
them, and its ``collect(argv)`` returns them keyed by the ids in bench/bars.toml (the
module's FIGURES), where each figure's bar and aim are kept and checked."""
