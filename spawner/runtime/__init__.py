"""How a session runs: the runtime interface, one module per runtime, and the actuator.

``interface.Runtime`` is what one node's runtime implements, on a session's ``runtime_id``
(a Docker container id, a Slurm job id); ``dockernodes`` (a Docker engine) and ``slurm``
(a Slurm partition) are the two there are, and ``spec`` builds the runtime-neutral
``LaunchSpec`` of a session they launch. ``actuator.SessionActuator`` carries out the
scheduler's decisions through them, a facade over collaborators, each with its own state
and handed at construction the ones it calls, so calls and imports run one way:
``takedown`` (preemption) calls ``snaprecord`` (snapshot recording), ``lifecycle`` (a
session's steps) and ``booking`` (ports, slices); ``lifecycle`` calls ``nodewatch`` (health,
sessions that end by themselves) and ``booking``; ``idlepolls`` asks the agents. Below them
``context`` (what they all read) and ``values`` (what they hand each other). ``snapshots``
is the Hub's side of the snapshot store (``SnapshotLayout``).

Nothing here imports the Hub-facing side (``spawner.hub``) or the read model.
"""
