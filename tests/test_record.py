"""libinject.record: the dataclasses subset the code base uses, with dataclasses' results."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import sysconfig

import pytest

from libinject.record import (FrozenInstanceError, asdict, field, fields, is_record, record,
                              replace)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar


@record(frozen=True)
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


@record
class Bag:
    name: str
    items: list[int] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)


@record(frozen=True)
class Outer:
    point: Point
    points: tuple[Point, ...] = ()
    by_name: dict[str, Point] = field(default_factory=dict)
    listed: list[Point] = field(default_factory=list)
    nothing: Point | None = None


@record(frozen=True)
class WithClassVar:
    limit: ClassVar[int] = 3
    value: int = 1


@record(frozen=True)
class Base:
    a: int
    b: str = "b"


@record(frozen=True)
class Derived(Base):
    c: float = 1.5


@record(frozen=True)
class OwnRepr:
    v: int

    def __repr__(self) -> str:
        return "mine"


@dataclasses.dataclass(frozen=True)
class DcPoint:      # Point as a dataclass: what record must match
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


# --- construction ---------------------------------------------------------------------

def test_positional_in_field_order():
    p = Point(1, 2, ("t",))
    assert (p.x, p.y, p.tags) == (1, 2, ("t",))


def test_keywords():
    assert Point(y=5, x=4) == Point(4, 5)


def test_defaults():
    assert Point(1).y == 0


def test_default_is_class_attribute():
    assert Point.y == 0


def test_default_factory_fresh_per_instance():
    assert Bag("a").items is not Bag("b").items


def test_factory_only_field_is_no_class_attribute():
    assert not hasattr(Bag, "items")


def test_missing_argument():
    with pytest.raises(TypeError, match="missing 1 required argument: 'x'"):
        Point()


def test_too_many_arguments():
    with pytest.raises(TypeError, match="takes 4 positional arguments but 5 were given"):
        Point(1, 2, (), 4)


def test_unexpected_keyword():
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        Point(1, z=3)


def test_duplicate_argument():
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        Point(1, x=2)


def test_inherited_fields_first():
    assert [f.name for f in fields(Derived)] == ["a", "b", "c"]


def test_inherited_positional():
    assert Derived(1, "x", 2.5).c == 2.5


def test_classvar_is_no_field():
    assert [f.name for f in fields(WithClassVar)] == ["value"]


def test_own_methods_kept():
    assert repr(OwnRepr(1)) == "mine"


# --- eq, hash, frozen -----------------------------------------------------------------

def test_equal():
    assert Point(1, 2) == Point(1, 2)


def test_not_equal():
    assert Point(1, 2) != Point(1, 3)


def test_other_class_not_equal():
    assert Base(1, "b") != Derived(1, "b")


def test_eq_other_type_is_not_implemented():
    assert Point(1).__eq__((1, 0, ())) is NotImplemented


def test_nan_field_equals_itself():
    nan = float("nan")
    assert Point(nan) == Point(nan)


def test_frozen_hash_of_values():
    assert hash(Point(1, 2)) == hash((1, 2, ()))


def test_frozen_hash_as_dataclasses():
    assert hash(Point(1, 2, ("a",))) == hash(DcPoint(1, 2, ("a",)))


def test_mutable_unhashable():
    with pytest.raises(TypeError, match="unhashable"):
        hash(Bag("a"))


def test_frozen_setattr():
    with pytest.raises(FrozenInstanceError):
        Point(1).x = 2


def test_frozen_delattr():
    with pytest.raises(FrozenInstanceError):
        del Point(1).x


def test_frozen_new_attribute():
    with pytest.raises(FrozenInstanceError):
        Point(1).other = 2


def test_frozen_error_is_attribute_error():
    assert issubclass(FrozenInstanceError, AttributeError)


def test_mutable_setattr():
    b = Bag("a")
    b.name = "b"
    assert b == Bag("b")


# --- repr, match ------------------------------------------------------------------------

def test_repr_as_dataclasses():
    assert repr(Point(1, 2, ("a",))) == repr(DcPoint(1, 2, ("a",))).replace("DcPoint", "Point")


def test_repr_nested():
    assert repr(Outer(Point(1))) == ("Outer(point=Point(x=1, y=0, tags=()), points=(), by_name={}, "
                                     "listed=[], nothing=None)")


def test_match_args():
    match Point(3, 4):
        case Point(x, y):
            got = (x, y)
    assert got == (3, 4)


# --- replace, asdict, fields, is_record ---------------------------------------------------

def test_replace_changes():
    assert replace(Point(1, 2), y=5) == Point(1, 5)


def test_replace_keeps_original():
    p = Point(1, 2)
    replace(p, y=5)
    assert p.y == 2


def test_replace_unknown_field():
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        replace(Point(1), z=1)


def test_replace_non_record():
    with pytest.raises(TypeError):
        replace((1, 2), x=1)


def test_asdict_flat():
    assert asdict(Point(1, 2, ("a",))) == {"x": 1, "y": 2, "tags": ("a",)}


def test_asdict_as_dataclasses():
    assert asdict(Point(1, 2, ("a",))) == dataclasses.asdict(DcPoint(1, 2, ("a",)))


def test_asdict_recursive():
    o = Outer(Point(1), (Point(2),), {"k": Point(3)}, [Point(4)])
    assert asdict(o) == {
        "point": {"x": 1, "y": 0, "tags": ()},
        "points": ({"x": 2, "y": 0, "tags": ()},),
        "by_name": {"k": {"x": 3, "y": 0, "tags": ()}},
        "listed": [{"x": 4, "y": 0, "tags": ()}],
        "nothing": None,
    }


def test_asdict_copies_containers():
    b = Bag("a", [1])
    assert asdict(b)["items"] is not b.items


def test_asdict_of_class():
    with pytest.raises(TypeError):
        asdict(Point)


def test_fields_names():
    assert [f.name for f in fields(Point)] == ["x", "y", "tags"]


def test_fields_types_are_annotation_strings():
    assert [f.type for f in fields(Point)] == [f.type for f in dataclasses.fields(DcPoint)]


def test_fields_default():
    assert fields(Point)[1].default == 0


def test_fields_default_factory():
    assert fields(Bag)[1].default_factory is list


def test_fields_of_instance():
    assert fields(Point(1)) == fields(Point)


def test_fields_of_non_record():
    with pytest.raises(TypeError):
        fields(object())


@pytest.mark.parametrize("obj, want", [(Point, True), (Point(1), True), (DcPoint, False),
                                       (object(), False), ("Point", False)])
def test_is_record(obj, want):
    assert is_record(obj) is want


# --- definitions it refuses, as dataclasses does -------------------------------------------

def test_mutable_default_refused():
    with pytest.raises(ValueError, match="mutable default"):
        @record
        class Bad:
            items: list = []


def test_non_default_after_default_refused():
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        @record
        class Bad:
            a: int = 0
            b: int


def test_default_and_factory_refused():
    with pytest.raises(ValueError):
        field(default=1, default_factory=int)


def test_post_init_refused():
    with pytest.raises(TypeError, match="__post_init__"):
        @record
        class Bad:
            a: int

            def __post_init__(self) -> None:
                pass


# --- what it is for ---------------------------------------------------------------------------

def _imported_by(code: str) -> set[str]:
    # As the hook runs: -I -S, the repository and site-packages (prctl, cffi) on the path.
    path = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), sysconfig.get_paths()["purelib"]]
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c",
         f"import sys; sys.path[:0] = {path!r}; before = set(sys.modules); {code}; "
         "print(' '.join(sorted(set(sys.modules) - before)))"],
        capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_record_imports_nothing():
    # __future__: every module's `from __future__ import annotations` loads it anyway.
    assert _imported_by("import libinject.record") <= {"__future__", "_operator", "libinject", "libinject.record"}


def test_hook_path_imports_no_typing():
    mods = _imported_by("import libinject.runtime.hook, libinject.config, libinject.request.oci_state, "
                        "libinject.request.oci_spec, libinject.pipeline, libinject.plan.planner, "
                        "libinject.discover.snapshot, libinject.discover.driver, libinject.apply.live")
    assert "typing" not in mods
