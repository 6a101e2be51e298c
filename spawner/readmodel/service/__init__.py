"""The ``budget`` service: budgets, the queue, nodes and allocation admin, in the Hub.

A hub-managed JupyterHub service (its own process, started by the Hub, listed in
its Services menu): server-rendered pages, a JSON API described by an OpenAPI
document, Prometheus ``/metrics``, and admin changes the embedded scheduler takes
in at its next cycle. It reads the scheduler's store through `spawner.readmodel.storeview`.
Run by the Hub as ``python -m spawner.readmodel.service`` (see `spawner.hubconfig`).
"""
