"""Records: the part of dataclasses this code base uses, importing nothing.

The hook is exec'd per container (python -I -S), so its imports are paid every time.
Measured there: `import dataclasses` pulls in inspect, ast, dis, tokenize, enum and re
(11-18 ms), and each @dataclass compiles its generated methods with exec (~0.7 ms a
class; 38 classes on the hook's path). A record builds its methods as closures over
the field names instead (~0.05 ms a class): no exec, no compile, no imports.

Supported, as dataclasses does it under `from __future__ import annotations`:
  @record / @record(frozen=True); field(default=..., default_factory=...);
  fields(), replace(), asdict(), is_record(); __init__ (positional and keyword, in
  field order), __repr__, __eq__, __hash__ (frozen: of the field values; otherwise
  unhashable), __match_args__; fields of record bases first; ClassVar annotations are
  not fields. Methods a class defines itself are kept.
Not supported (nothing here uses them): __post_init__, InitVar, kw_only, order, slots,
and field() options other than the two above. asdict() does not deep-copy values that
are not records, lists, tuples or dicts (ours are all immutable scalars).
Values live in the instance __dict__, written directly, so frozen records need no
object.__setattr__ per field and pickle/copy work as for any object.
"""
from __future__ import annotations

from _operator import attrgetter     # compiled into the interpreter: no file to import

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, TypeVar

    T = TypeVar("T")

_FIELDS = "__record_fields__"


class FrozenInstanceError(AttributeError):
    """Assigning to or deleting a field of a frozen record."""


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class Field:
    __slots__ = ("name", "type", "default", "default_factory")

    def __init__(self, default: Any = MISSING, default_factory: Any = MISSING) -> None:
        self.name = ""
        self.type = ""
        self.default = default
        self.default_factory = default_factory

    def __repr__(self) -> str:
        return (f"Field(name={self.name!r}, type={self.type!r}, default={self.default!r}, "
                f"default_factory={self.default_factory!r})")


def field(*, default: Any = MISSING, default_factory: Callable[[], Any] | Any = MISSING) -> Any:
    """A field's default, or a callable making one per instance (lists, dicts, records)."""
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("cannot specify both default and default_factory")
    return Field(default, default_factory)


def fields(obj: Any) -> tuple[Field, ...]:
    """The fields of a record class or instance, in order."""
    try:
        return getattr(obj, _FIELDS)
    except AttributeError:
        raise TypeError("must be called with a record type or instance") from None


def is_record(obj: Any) -> bool:
    """Whether obj is a record class or an instance of one."""
    cls = obj if isinstance(obj, type) else type(obj)
    return hasattr(cls, _FIELDS)


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of record obj with the given fields changed."""
    for f in fields(obj):
        if f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    return obj.__class__(**changes)


def asdict(obj: Any) -> dict[str, Any]:
    """obj's fields as a dict, recursing through records, lists, tuples and dicts."""
    if not is_record(obj) or isinstance(obj, type):
        raise TypeError("asdict() should be called on record instances")
    return _asdict(obj)


def _asdict(obj: Any) -> Any:
    if hasattr(type(obj), _FIELDS):
        return {f.name: _asdict(getattr(obj, f.name)) for f in getattr(obj, _FIELDS)}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):     # a namedtuple
        return type(obj)(*[_asdict(v) for v in obj])
    if isinstance(obj, (list, tuple)):
        return type(obj)(_asdict(v) for v in obj)
    if isinstance(obj, dict):
        return type(obj)((_asdict(k), _asdict(v)) for k, v in obj.items())
    return obj


def record(cls: type | None = None, /, *, frozen: bool = False) -> Any:
    """Class decorator: @record or @record(frozen=True)."""
    if cls is None:
        return lambda c: _process(c, frozen)
    return _process(cls, frozen)


def _is_classvar(annotation: object) -> bool:
    return isinstance(annotation, str) and annotation.startswith(("ClassVar", "typing.ClassVar"))


def _process(cls: type, frozen: bool) -> type:
    own = cls.__dict__
    if "__post_init__" in own:
        raise TypeError(f"{cls.__name__}: record does not support __post_init__")
    found: dict[str, Field] = {}
    for base in cls.__mro__[-1:0:-1]:
        for f in base.__dict__.get(_FIELDS, ()):
            found[f.name] = f
    for name, annotation in own.get("__annotations__", {}).items():
        if _is_classvar(annotation):
            continue
        value = own.get(name, MISSING)
        f = value if isinstance(value, Field) else Field(default=value)
        f.name, f.type = name, annotation
        if f.default is not MISSING and type(f.default).__hash__ is None:
            raise ValueError(f"mutable default {type(f.default)} for field {name} is not allowed: "
                             "use default_factory")
        if f.default is MISSING:
            if isinstance(value, Field):
                delattr(cls, name)
        else:
            setattr(cls, name, f.default)
        found[name] = f             # a redefined base field keeps its place, as in dataclasses
    all_fields = tuple(found.values())
    seen_default = False
    for f in all_fields:
        if f.default is MISSING and f.default_factory is MISSING:
            if seen_default:
                raise TypeError(f"non-default argument {f.name!r} follows default argument")
        else:
            seen_default = True

    names = tuple(f.name for f in all_fields)
    values = _make_values(names)
    setattr(cls, _FIELDS, all_fields)
    methods: dict[str, Any] = {
        "__init__": _make_init(cls, all_fields),
        "__repr__": _make_repr(names, values),
        "__eq__": _make_eq(values),
        "__match_args__": names,
    }
    if frozen:
        setattr_, delattr_ = _make_frozen(cls, frozenset(names))
        for name, method in (("__setattr__", setattr_), ("__delattr__", delattr_)):
            if name in own:
                raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")
            setattr(cls, name, method)
    for name, method in methods.items():
        if name not in own:
            if callable(method):
                method.__qualname__ = f"{cls.__qualname__}.{name}"
            setattr(cls, name, method)
    # As dataclasses (eq=True): a __hash__ written in the class stays; otherwise a frozen
    # record hashes its values and a mutable one is unhashable.
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    if not explicit_hash:
        cls.__hash__ = _make_hash(values) if frozen else None  # type: ignore[assignment]
    return cls


def _make_init(cls: type, all_fields: tuple[Field, ...]) -> Callable[..., None]:
    names = tuple(f.name for f in all_fields)
    count = len(names)
    defaults = {f.name: f.default for f in all_fields if f.default is not MISSING}
    factories = {f.name: f.default_factory for f in all_fields if f.default_factory is not MISSING}
    known = frozenset(names)

    def fill(values: dict[str, Any], args: tuple, kwargs: dict[str, Any]) -> None:
        given = len(args)
        if given > count:
            raise TypeError(f"{cls.__name__}.__init__() takes {count + 1} positional arguments "
                            f"but {given + 1} were given")
        values.update(zip(names, args))
        missing = []
        for name in names[given:]:
            if name in kwargs:
                values[name] = kwargs.pop(name)
            elif name in defaults:
                values[name] = defaults[name]
            elif name in factories:
                values[name] = factories[name]()
            else:
                missing.append(name)
        for name in kwargs:
            if name in known:
                raise TypeError(f"{cls.__name__}.__init__() got multiple values for argument {name!r}")
            raise TypeError(f"{cls.__name__}.__init__() got an unexpected keyword argument {name!r}")
        if missing:
            raise TypeError(f"{cls.__name__}.__init__() missing {len(missing)} required "
                            f"argument{'s' if len(missing) > 1 else ''}: "
                            + ", ".join(repr(n) for n in missing))

    # Straight into the instance dict: no __setattr__ (frozen or not), in field order.
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs or len(args) != count:
            fill(self.__dict__, args, kwargs)
        else:
            self.__dict__.update(zip(names, args))

    return __init__


def _make_values(names: tuple[str, ...]) -> Callable[[Any], tuple]:
    """A function giving an instance's field values as a tuple (C speed for eq and hash)."""
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()


def _make_repr(names: tuple[str, ...], values: Callable[[Any], tuple]) -> Callable[[Any], str]:
    def __repr__(self: Any) -> str:
        inner = ", ".join([f"{n}={v!r}" for n, v in zip(names, values(self))])
        return f"{self.__class__.__qualname__}({inner})"

    return __repr__


def _make_eq(values: Callable[[Any], tuple]) -> Callable[[Any, Any], Any]:
    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is not self.__class__:
            return NotImplemented
        # Tuples, as dataclasses: `is` before `==` per item (a NaN equals itself).
        return values(self) == values(other)

    return __eq__


def _make_hash(values: Callable[[Any], tuple]) -> Callable[[Any], int]:
    def __hash__(self: Any) -> int:
        return hash(values(self))

    return __hash__


def _make_frozen(cls: type, names: frozenset[str]) -> tuple[Callable[..., None], Callable[..., None]]:
    # As dataclasses: a plain subclass of a frozen record may still set attributes of its own.
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __setattr__, __delattr__
