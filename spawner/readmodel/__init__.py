"""The read model: what a request's position, budget and "why it waits" look like.

``status`` turns the scheduler's verdicts and forecasts into the figures and sentences
the pages show; ``storeview`` computes the same model from the store alone, for the
budget service (``service/``), which runs in a process of its own.

Nothing here imports the Hub-facing side (``spawner.hub``) or the session runtime
(``spawner.runtime``).
"""
