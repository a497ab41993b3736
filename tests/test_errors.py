"""The exception tree of roost.errors: real classes, one per protocol error code, as drawn."""

from __future__ import annotations

import ast
import inspect

import pytest

import roost.errors as errors

GROUPS = (errors.RequestError, errors.ResourceNotFound, errors.StateConflict, errors.ServerError)


def _class_statements() -> dict[str, list[str]]:
    tree = ast.parse(inspect.getsource(errors))
    return {node.name: [ast.unparse(b) for b in node.bases] for node in tree.body if isinstance(node, ast.ClassDef)}


def test_every_protocol_error_is_a_class_statement_under_one_group() -> None:
    classes = _class_statements()
    for code, cls in errors.PROTOCOL_ERRORS.items():
        assert cls.__name__ in classes, f"{cls.__name__} is not a class statement"
        assert cls.code == code
        assert sum(issubclass(cls, group) for group in GROUPS) == 1, cls
        assert cls.__module__ == "roost.errors" and cls.__doc__


def test_codes_are_unique_and_the_docstring_draws_every_class() -> None:
    assert len(set(errors.PROTOCOL_ERRORS)) == len(errors.PROTOCOL_ERRORS) == 14
    drawing = errors.__doc__ or ""
    for cls in (*GROUPS, *errors.PROTOCOL_ERRORS.values()):
        assert f"── {cls.__name__} " in drawing, cls.__name__
    assert set(errors.__all__) >= {cls.__name__ for cls in (*GROUPS, *errors.PROTOCOL_ERRORS.values())}


@pytest.mark.parametrize("cls", list(errors.PROTOCOL_ERRORS.values()))
def test_a_protocol_error_renders_its_code(cls: type[errors.ProtocolError]) -> None:
    with pytest.raises(errors.ProtocolError) as caught:
        raise cls("it failed", data={"k": 1})
    assert caught.value.to_wire() == {"code": cls.code, "message": "it failed", "data": {"k": 1}}
    assert cls().message == cls.code  # no message: the code stands in
