"""Bad inputs to launch.actorq_schemes: each refused with one line before any file is written."""

from tests.bad_input import Case, a_file

_W = "--workdir={tmp}/schemes"


def _case(name, fragment, *args, setup=None):
    return Case("launch.actorq_schemes", name, (*args,), fragment, setup)


CASES = [
    _case("schemes-unknown-scheme", "unknown actor int8 scheme 'int4'", _W, "--schemes=int8,int4"),
    _case("schemes-bad-task", "--tasks entries are agent@env@learner_steps", _W, "--tasks=dqn@gym:CartPole-v1"),
    _case("schemes-zero-steps", "--tasks entries are agent@env@learner_steps", _W, "--tasks=dqn@gym:CartPole-v1@0"),
    _case("schemes-unknown-agent", "agent 'sac' does not run distributed", _W, "--tasks=sac@gym:Pendulum-v1@100"),
    _case("schemes-zero-episodes", "--episodes must be >= 1", _W, "--episodes=0"),
    _case("schemes-unknown-comm", "unknown comm precision 'int4'", _W, "--comm_precision=int4"),
    _case("schemes-no-workdir", "--workdir is required"),
    _case("schemes-workdir-is-a-file", "exists and is not a directory", "--workdir={tmp}/afile", setup=a_file),
]
