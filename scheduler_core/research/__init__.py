"""Research tooling around the core, not run by the Hub: the seed-like generator, trace
import, the placement (fragmentation) benchmark, evaluation and reports, and the
``budgethub`` command line."""
