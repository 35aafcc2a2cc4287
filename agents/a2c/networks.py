"""A2C's networks are PPO's: separate actor and critic (SB3's MlpPolicy layout for both agents).

See `agents/ppo/networks.py`: orthogonally initialized tanh MLPs (Nature CNN for frames), an
actor head of logits or Gaussian means with a state-independent log-std, a value head.
"""

from agents.ppo.networks import Actor, Critic, Torso, make_actor, make_actor_critic

__all__ = ["Actor", "Critic", "Torso", "make_actor", "make_actor_critic"]
