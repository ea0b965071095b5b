"""Introspection: _core.pyi says what the C module has, every C function and
method has a text signature, install()'s keywords are the rows' OPTIONS."""
import ast
import inspect
import os

import fxguard
from fxguard import _core
from fxguard.torch_support.options import OFF_BY_DEFAULT, OPTIONS

STUB = os.path.join(os.path.dirname(fxguard.__file__), "_core.pyi")


def stub_tree() -> ast.Module:
    with open(STUB) as f:
        return ast.parse(f.read())


def stub_names(body) -> dict[str, ast.AST]:
    names = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign):
            names[node.target.id] = node
    return names


def public_c_names(obj) -> set[str]:
    own = vars(obj)
    return {n for n in own if not (n.startswith("__") and n.endswith("__"))} | (
        {"__enter__", "__exit__"} & set(own))


def test_stub_names_are_the_modules():
    stub = {n for n in stub_names(stub_tree().body) if not n.startswith("_RLockStats")}
    assert stub == public_c_names(_core)


def test_stub_parameters_are_the_text_signatures():
    stub = stub_names(stub_tree().body)
    checked = 0
    for name in public_c_names(_core):
        obj = getattr(_core, name)
        if isinstance(obj, type):
            members = stub_names(stub[name].body)
            for attr in public_c_names(obj):
                assert attr in members, f"{name}.{attr} missing from _core.pyi"
                if callable(getattr(obj, attr)):  # not a data attribute (getset)
                    checked += compare(getattr(obj, attr), members[attr], drop_self=True)
            checked += compare(obj, members.get("__new__", members.get("__init__")),
                               drop_self=True)
        elif callable(obj):
            checked += compare(obj, stub[name], drop_self=False)
    assert checked >= 20


def compare(runtime, stub_def: ast.FunctionDef, drop_self: bool) -> int:
    sig = inspect.signature(runtime)  # raises if the C docstring has no text signature
    names = [p.name for p in sig.parameters.values() if p.name != "self"]
    a = stub_def.args
    stub_params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    stub_params += [a.vararg.arg] if a.vararg else []
    if drop_self:
        stub_params = [p for p in stub_params if p not in ("self", "cls")]
    assert sorted(names) == sorted(stub_params), (runtime, names, stub_params)
    return 1


def test_every_c_function_and_method_has_a_signature():
    for name in public_c_names(_core):
        obj = getattr(_core, name)
        targets = [obj] if not isinstance(obj, type) else [obj] + [
            getattr(obj, a) for a in public_c_names(obj)]
        for target in filter(callable, targets):
            inspect.signature(target)


def test_install_options_are_documented_keyword_only_parameters():
    params = inspect.signature(fxguard.install).parameters
    assert tuple(params) == OPTIONS
    for p in params.values():
        assert p.kind is p.KEYWORD_ONLY and p.default is (p.name not in OFF_BY_DEFAULT)
        assert p.name in fxguard.install.__doc__


def test_package_ships_py_typed():
    assert os.path.exists(os.path.join(os.path.dirname(fxguard.__file__), "py.typed"))
