"""Networks whose dense and conv layers take a `Precision` (see `qrl.networks.layers`)."""

from qrl.networks.layers import CALIBRATION, Conv, Dense
from qrl.networks.torsos import MLP, MinAtarCNN, NatureCNN, make_torso, torso_for_observation

__all__ = ["CALIBRATION", "Conv", "Dense", "MLP", "MinAtarCNN", "NatureCNN", "make_torso", "torso_for_observation"]
