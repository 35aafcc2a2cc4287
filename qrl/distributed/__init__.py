"""Distributed actor-learner training (ActorQ): nodes and launchers.

Nodes (each a plain class that runs in a thread or as a Ray actor process):
`counting.Counter`, `replay.ReplayServer` (+ `rate_limiters`), `broadcaster.Broadcaster`,
`learner.Learner`, `actor.Actor`, `evaluator.Evaluator`. `weights` encodes and loads the
published policy; `agent` is what an algorithm hands the nodes; `launching` holds programs, the
in-process backend and the supervision loop; `ray_launcher` the Ray backend (the only module
that imports Ray); `run` one ActorQ run and its outputs; `report` and `energy` the study.

Nothing is imported here: the replay, counter and broadcaster processes start without JAX.
"""
