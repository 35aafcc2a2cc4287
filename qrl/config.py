"""Checked overrides of agents' frozen config dataclasses (from flags, JSON or presets).

Every agent's `config.py` keeps its own defaults, presets and `validate`; the parsing of
`key=value` overrides, the checks they all share, the `ConfigMethods` mixin and `config_for`
live here.
"""

import dataclasses
import math
from typing import Any, Callable, ClassVar, Iterable, Mapping, Optional, TypeVar

from qrl import runtime
from qrl.errors import QrlInputError

MATMUL_DTYPES = ("fp32", "bf16")  # training matmul dtypes; bf16 multiplies with fp32 accumulation.
QAT_MIN_BITS = 2
QAT_MAX_BITS = 8
QAT_BACKENDS = ("qrl", "aqt")  # qrl.quant.qat: qrl's own fake quantization, or AQT's matmul.

ConfigT = TypeVar("ConfigT")


def _convert(default: Any, value: Any) -> Any:
    if isinstance(default, tuple):
        items = value.split("-") if isinstance(value, str) else value
        return tuple(type(default[0])(item) if default else int(item) for item in items)
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes"):
            return True
        if text in ("0", "false", "no"):
            return False
        raise ValueError(value)
    if isinstance(default, int) and isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    if isinstance(default, int) and isinstance(value, str):
        return int(float(value)) if float(value).is_integer() else int(value)
    return type(default)(value)


def override(config: ConfigT, values: Mapping[str, Any], agent_name: str) -> ConfigT:
    """`config` with `values` applied; names must be fields and values convert to their type.

    Tuples of ints accept "256-256"; bools accept true/false/1/0/yes/no; ints accept "1e5".
    An unknown key or an unconvertible value is a `QrlInputError` naming the agent.
    """
    fields = {field.name for field in dataclasses.fields(config)}
    label = agent_name.upper()
    changes = {}
    for name, value in values.items():
        if name not in fields:
            raise QrlInputError(f"unknown {label} config key {name!r}; known: {', '.join(sorted(fields))}")
        default = getattr(config, name)
        try:
            changes[name] = _convert(default, value)
        except (TypeError, ValueError, OverflowError):
            raise QrlInputError(f"{label} config {name}={value!r} is not a valid {type(default).__name__}") from None
    return dataclasses.replace(config, **changes)


def check_field_value(name: str, value: Any, agent_name: str) -> None:
    """What every config field of every agent obeys: floats are finite, tuples (layer widths)
    hold at least one size and every size is >= 1."""
    label = agent_name.upper()
    if isinstance(value, float) and not math.isfinite(value):
        raise QrlInputError(f"{label} config {name} must be a finite number, got {value}")
    if isinstance(value, tuple) and (not value or min(value) < 1):
        raise QrlInputError(f"{label} config {name} must be positive layer widths, got {value}")


def check_minimum(config: Any, names: Iterable[str], agent_name: str, minimum: float = 0) -> None:
    """Each named field must be >= `minimum`."""
    for name in names:
        if getattr(config, name) < minimum:
            raise QrlInputError(f"{agent_name.upper()} config {name} must be >= {minimum}, got {getattr(config, name)}")


def check_positive(config: Any, names: Iterable[str], agent_name: str) -> None:
    """Each named field must be > 0."""
    for name in names:
        if getattr(config, name) <= 0:
            raise QrlInputError(f"{agent_name.upper()} config {name} must be > 0, got {getattr(config, name)}")


def check_fraction(config: Any, names: Iterable[str], agent_name: str, low_open: bool = False) -> None:
    """Each named field must lie in [0, 1] ((0, 1] with `low_open`)."""
    for name in names:
        value = getattr(config, name)
        if not (0.0 < value <= 1.0 if low_open else 0.0 <= value <= 1.0):
            interval = "(0, 1]" if low_open else "[0, 1]"
            raise QrlInputError(f"{agent_name.upper()} config {name} must be in {interval}, got {value}")


def check_choice(config: Any, name: str, choices: Iterable[str], agent_name: str) -> None:
    """The named field must be one of `choices`."""
    choices = tuple(choices)
    if getattr(config, name) not in choices:
        raise QrlInputError(
            f"{agent_name.upper()} config {name} must be one of {', '.join(choices)}, got {getattr(config, name)!r}"
        )


def check_qat_fields(config: Any, agent_name: str) -> None:
    """`qat_bits` is 0 (off) or in 2..8; `quant_delay` (updates) is >= 0; `qat_backend` is
    one of `QAT_BACKENDS`."""
    bits = config.qat_bits
    if bits != 0 and not QAT_MIN_BITS <= bits <= QAT_MAX_BITS:
        raise QrlInputError(
            f"{agent_name.upper()} config qat_bits must be in {QAT_MIN_BITS}..{QAT_MAX_BITS} (0 = off), got {bits}"
        )
    if config.quant_delay < 0:
        raise QrlInputError(f"{agent_name.upper()} config quant_delay must be >= 0, got {config.quant_delay}")
    check_choice(config, "qat_backend", QAT_BACKENDS, agent_name)


def total_updates(config: Any, steps: int) -> int:
    """Gradient updates a run of `steps` environment steps takes — the unit of `quant_delay`.

    Off-policy configs (`train_freq`, `gradient_steps`, `learning_starts`): `gradient_steps`
    every `train_freq` steps from `max(learning_starts, train_freq)` on. On-policy configs
    (`num_steps`, `num_envs`): one update per rollout of `num_steps x num_envs` steps (A2C), or
    `num_epochs x num_minibatches` per rollout (PPO).
    """
    if hasattr(config, "num_steps"):
        iterations = max(1, math.ceil(steps / (config.num_steps * config.num_envs)))
        return iterations * getattr(config, "num_epochs", 1) * getattr(config, "num_minibatches", 1)
    first = max(config.learning_starts, config.train_freq)
    trainable_steps = max(steps - first + config.train_freq, 0)
    return max(1, trainable_steps // config.train_freq * config.gradient_steps)


class ConfigMethods:
    """`replace`, `to_dict`, `from_dict` and `override` for an agent's frozen config dataclass.

    Subclass as `class Config(ConfigMethods, agent="dqn", validate=validate)`: `agent` names the
    agent in error messages, `validate(config)` raises for values that cannot train.
    """

    agent_name: ClassVar[str]
    _validate: ClassVar[Callable[[Any], None]]

    def __init_subclass__(cls, agent: str, validate: Callable[[Any], None], **kwargs):
        super().__init_subclass__(**kwargs)
        cls.agent_name = agent
        cls._validate = staticmethod(validate)

    def replace(self: ConfigT, **changes: Any) -> ConfigT:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]):
        """Builds a config from a dict (e.g. config.json); unknown keys are an input error."""
        return cls().override(values)

    def override(self: ConfigT, values: Mapping[str, Any]) -> ConfigT:
        """`self` with `values` applied (names and types checked), then validated: every field by
        `check_field_value`, then the agent's ranges by its `validate`."""
        config = override(self, values, self.agent_name)
        for field in dataclasses.fields(config):
            check_field_value(field.name, getattr(config, field.name), self.agent_name)
        self._validate(config)
        return config


PRESET_KEY = "preset"  # the override that names a preset: `preset=quarl` picks `presets["<env id>@quarl"]`.


def preset_values(
    presets: Mapping[str, Mapping[str, Any]], env_id: str, preset_name: Optional[str], agent_name: str,
) -> Mapping[str, Any]:
    """`presets[env_id]` (empty if there is none) or, with `preset_name`, the named preset
    `presets["<env_id>@<preset_name>"]`; an unknown name is an input error listing the names
    there are for `env_id`."""
    if preset_name is None:
        return presets.get(env_id, {})
    key = f"{env_id}@{preset_name}"
    if key not in presets:
        names = sorted(name.partition("@")[2] for name in presets if name.startswith(f"{env_id}@"))
        label = agent_name.upper()
        known = f"known for {env_id}: {', '.join(names)}" if names else f"{label} has no named presets for {env_id}"
        raise QrlInputError(f"unknown {label} preset {preset_name!r}; {known}")
    return presets[key]


def config_for(
    config_class: type, presets: Mapping[str, Mapping[str, Any]], env_id: str,
    values: Optional[Mapping[str, Any]] = None,
):
    """`config_class`'s defaults, then `presets[env_id]` if there is one, then `values`, validated.

    `values` may name a preset (`preset=<name>`, see `preset_values`): it replaces the env's
    preset. `flat_optimizer` follows the process's XLA threading (`qrl.runtime`) unless given.
    """
    values = dict(values or {})
    preset = preset_values(presets, env_id, values.pop(PRESET_KEY, None), config_class.agent_name)
    defaults = config_class(flat_optimizer=runtime.single_threaded_xla())
    return defaults.override({**preset, **values})
