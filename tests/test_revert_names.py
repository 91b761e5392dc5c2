"""Every revert a role treats as benign is an error some contract declares."""

from __future__ import annotations

import pytest

from node.chain.revert_names import errors, known_errors
from node.errors import ConfigError
from node.roles import solver
from node.roles import verifier as daemon


def test_benign_names_exist_in_the_abis() -> None:
    names = known_errors()
    assert {"InvalidStatus", "WindowNotOver", "ClockNotExpired", "NotInCommittee"} <= names
    for module in (solver, daemon):
        consts = {k: v for k, v in vars(module).items()
                  if k.isupper() and "BENIGN" in k and isinstance(v, tuple)}
        assert consts, f"{module.__name__} has no benign-revert constants"
        for key, value in consts.items():
            assert set(value) <= names, f"{module.__name__}.{key}: {set(value) - names}"


def test_a_name_no_contract_has_is_refused() -> None:
    # the names the solver once used (issue 12): they never existed
    with pytest.raises(ConfigError, match="WrongStatus"):
        errors("InvalidStatus", "WrongStatus")
    with pytest.raises(ConfigError, match="WindowOpen"):
        errors("WindowOpen")
