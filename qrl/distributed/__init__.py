"""Distributed actor-learner training (ActorQ): nodes and launchers."""
