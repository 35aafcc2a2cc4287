"""Networks whose dense and conv layers take a `Precision` (see `qrl.networks.layers`)."""

from qrl.networks.layers import CALIBRATION, Conv, Dense
from qrl.networks.torsos import (
    ACME_UNIFORM_INIT, MLP, NEAR_ZERO_INIT, MinAtarCNN, NatureCNN, make_torso, orthogonal, quarl_mlp,
    torso_for_observation,
)

__all__ = [
    "ACME_UNIFORM_INIT", "CALIBRATION", "Conv", "Dense", "MLP", "MinAtarCNN", "NEAR_ZERO_INIT", "NatureCNN",
    "make_torso", "orthogonal", "quarl_mlp", "torso_for_observation",
]
