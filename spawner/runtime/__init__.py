"""How a session runs: the runtime interface, one module per runtime, and the actuator.

``interface.Runtime`` is what one node's runtime implements; ``dockernodes`` (a Docker
engine) and ``slurm`` (a Slurm partition) are the two there are, and ``spec`` builds the
runtime-neutral description of a session they launch. ``actuator.SessionActuator``
carries out the scheduler's decisions through them, with its collaborators: booking
slices, the lifecycle of a session, take-down on preemption, snapshot recording and
node watching. ``snapshots`` is the Hub's side of the snapshot store.

Nothing here imports the Hub-facing side (``spawner.hub``) or the read model.
"""
