"""Process-wide JAX settings: XLA thread count before the backend starts, flat optimizer."""

import os
import subprocess
import sys

import jax
import numpy as np

from agents.dqn import config_for, learning
from qrl import runtime
from qrl.replay import Transition

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_recommended_threads_by_observation_shape():
    assert runtime.recommended_xla_threads((4,)) == 1
    assert runtime.recommended_xla_threads((84, 84, 4)) == 0


def test_thread_count_applies_before_the_backend_starts_only():
    script = (
        "import os, jax, jax.numpy as jnp\n"
        "from qrl import runtime\n"
        "from agents.dqn import config_for\n"
        "assert runtime.configure_jax(1) and os.environ['PJRT_NPROC'] == '1'\n"
        "assert runtime.single_threaded_xla() and config_for('gym:CartPole-v1').flat_optimizer\n"
        "jnp.ones(3).block_until_ready()\n"
        "assert runtime.configure_jax(1) and not runtime.configure_jax(2)\n"
        "assert not jax.config.read('jax_cpu_enable_async_dispatch')\n"
        "print('ok')\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "PJRT_NPROC"}
    env["PYTHONPATH"] = REPO
    completed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0 and completed.stdout.strip().endswith("ok"), completed.stderr


def test_flat_optimizer_takes_the_same_steps():
    shape = (2, 16)
    batches = Transition(
        observation=np.random.default_rng(0).normal(size=shape + (4,)).astype(np.float32),
        action=np.ones(shape, np.int32),
        reward=np.ones(shape, np.float32),
        discount=np.full(shape, 0.99, np.float32),
        next_observation=np.random.default_rng(1).normal(size=shape + (4,)).astype(np.float32),
    )
    params = []
    for flat in (False, True):
        config = config_for("gym:CartPole-v1", {"hidden_sizes": "32-32", "flat_optimizer": flat})
        network = learning.make_network(config, (4,), 2)
        state = learning.init(jax.random.PRNGKey(0), config, (4,), np.float32, 2)
        state, _ = learning.make_update(network, config)(state, batches)
        params.append(state.params)
    for a, b in zip(jax.tree.leaves(params[0]), jax.tree.leaves(params[1])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
