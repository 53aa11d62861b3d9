"""Finding, loading and validating plugins: entry points, `module:attr` and `file.py[:attr]`.

Built-in proxies are found exactly like third-party ones, through the entry-point group
`acp_conductor.proxies`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conductor.errors import ConfigError, PluginError, PluginNotFoundError, PluginValidationError
from conductor.plugins import entry_points as fast_entry_points
from conductor.plugins.api import Proxy
from conductor.record import Record
from conductor.spelling import did_you_mean

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from conductor.config import ComponentSpec

GROUP = "acp_conductor.proxies"


class InstalledProxy(Record, frozen=True):
    name: str
    value: str          # "package.module:attr"
    distribution: str | None

    def load(self) -> type[Proxy[Any]]:
        return find_plugin(self.name)

    def description(self) -> str:
        try:
            return self.load().description()
        except Exception as e:  # a broken third-party plugin must not break the listing
            return f"(cannot load: {type(e).__name__}: {e})"


def installed() -> list[InstalledProxy]:
    """Every proxy registered in the entry-point group, sorted by name."""
    from importlib.metadata import entry_points

    found: dict[str, InstalledProxy] = {}
    for ep in entry_points(group=GROUP):
        dist = ep.dist.name if ep.dist is not None else None
        found.setdefault(ep.name, InstalledProxy(ep.name, ep.value, dist))
    return sorted(found.values(), key=lambda p: p.name)


def _entry_point(name: str) -> EntryPoint | fast_entry_points.FoundEntryPoint | None:
    found = fast_entry_points.find(GROUP, name)
    if found is not None:
        return found
    from importlib.metadata import entry_points  # here: ≈ 15 ms that start-up rarely needs

    for ep in entry_points(group=GROUP):
        if ep.name == name:
            return ep
    return None


def find_plugin(ref: str, *, base_dir: str | None = None) -> type[Proxy[Any]]:
    """Resolve an entry-point NAME, `package.module:attr`, or `path/to/file.py[:attr]`; a
    relative file path is taken relative to `base_dir` (a chain file's folder) if given.

    Raises:
        PluginNotFoundError: nothing by that reference.
        PluginValidationError: found, but not a Proxy subclass.
    """
    module_ref, _, attr = ref.partition(":")
    if module_ref.endswith(".py") or "/" in module_ref or module_ref.startswith("."):
        path = Path(module_ref)
        if base_dir is not None and not path.is_absolute():
            if not (Path(base_dir) / path).is_file():
                raise PluginNotFoundError(f"plugin file {module_ref!r} not found (relative to "
                                          f"{base_dir}, the chain file's folder)")
            path = Path(base_dir) / path
        obj = _from_file(ref, path, attr or None)
    elif attr:
        obj = _from_module(ref, module_ref, attr, base_dir=base_dir)
    else:
        ep = _entry_point(ref)
        if ep is None:
            known = [p.name for p in installed()]
            guess = did_you_mean(ref, known)
            raise PluginNotFoundError(
                f"no proxy named {ref!r} is installed ({guess + ' ' if guess else ''}installed: "
                f"{', '.join(known) or 'none'}); give an installed name, "
                "`package.module:Class`, or `path/to/file.py:Class`; a package installs into "
                f"the Python acp-conductor runs on, {sys.executable} (`{sys.executable} -m "
                "pip install ...`; under pipx: `pipx inject acp-conductor ...`)")
        try:
            obj = ep.load()
        except (Exception, SystemExit) as e:  # the plugin's own code: whatever it raises
            # names it (SystemExit too: `sys.exit("needs X")` is a module refusing to load)
            raise PluginNotFoundError(f"proxy {ref!r} ({ep.value}) cannot be loaded"
                                      f"{_where(e)}: {type(e).__name__}: {e}"
                                      f"{_stale_entry_point(ep.value, e)}") from e
    return validate_plugin(ref, obj)


def _stale_entry_point(value: str, error: BaseException) -> str:
    """The module imported, but lacks the class the entry point names (a class renamed, the
    pyproject.toml not, or not installed again since): say where the name is kept."""
    module_name, _, attr = value.partition(":")
    module = sys.modules.get(module_name.strip())
    if not isinstance(error, AttributeError) or module is None \
            or hasattr(module, attr.strip().partition(".")[0]):
        return ""
    classes = [k for k, v in vars(module).items()
               if inspect.isclass(v) and issubclass(v, Proxy) and v is not Proxy]
    guess = did_you_mean(attr.strip(), classes) or (
        f"did you mean {classes[0]!r}?" if len(classes) == 1 else "")
    return ("; the entry point names a class the module does not have"
            f"{f' ({guess})' if guess else ''}: fix it under "
            "[project.entry-points.\"acp_conductor.proxies\"] in the package's pyproject.toml, "
            "then install the package again (`pip install -e .`)")


def _from_module(ref: str, module_name: str, attr: str, *, base_dir: str | None = None
                 ) -> object:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not (module_name + ".").startswith(e.name + "."):
            raise _import_failed(ref, e) from e  # found, but what it imports is not
        # A module path is imported from the environment, never the chain file's folder;
        # a file of that name there means the file path was meant.
        beside = f"{module_name.replace('.', '/')}.py"
        fix = (f"; {beside} is next to the chain file: write plugin = \"{beside}:{attr}\""
               if base_dir is not None and (Path(base_dir) / beside).is_file() else "")
        raise PluginNotFoundError(
            f"cannot import {module_name!r} for plugin {ref!r}: {e}{fix}") from e
    except (Exception, SystemExit) as e:
        raise _import_failed(ref, e) from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise PluginNotFoundError(f"module {module_name!r} has no attribute {attr!r}") from None


def _from_file(ref: str, path: Path, attr: str | None) -> object:
    if not path.is_file():
        raise PluginNotFoundError(f"plugin file {str(path)!r} not found")
    name = f"acp_conductor_plugin_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginNotFoundError(f"cannot load {str(path)!r} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pydantic look their module up by name
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:
        sys.modules.pop(name, None)
        raise _import_failed(ref, e, _beside(path, e)) from e
    if attr:
        return _from_loaded(module, attr, ref)
    candidates = [v for v in vars(module).values()
                  if inspect.isclass(v) and issubclass(v, Proxy) and v is not Proxy
                  and v.__module__ == name]
    if len(candidates) != 1:
        raise PluginValidationError(ref, f"{len(candidates)} Proxy subclasses in {path}; "
                                         "name one as FILE.py:Class")
    return candidates[0]


def _import_failed(ref: str, error: BaseException, hint: str = "") -> PluginNotFoundError:
    """The plugin's own code raised while it was imported (a syntax error, a missing
    dependency, a misused `@on`): one line naming the plugin, where, and what."""
    return PluginNotFoundError(f"plugin {ref!r} failed to import{_where(error)}: "
                               f"{type(error).__name__}: {error}{hint}")


def _beside(path: Path, error: BaseException) -> str:
    """A plugin file importing a module next to it (as `python mine.py` could) fails: the
    file is loaded by path, and its folder is not put on everyone's import path."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return ""
    top = error.name.partition(".")[0]
    folder = path.parent
    if not ((folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file()):
        return ""
    return (f"; {top} is next to {path.name}, but a plugin file's folder is not on the "
            "import path: install your code as a package (`acp-conductor init --proxy "
            f"NAME`), or run acp-conductor with PYTHONPATH={folder.resolve()}")


def _where(error: BaseException) -> str:
    """` (file, line N)`: where in the plugin's code `error` came from (the deepest frame
    outside the conductor: a misused `@on` raises in conductor code, the fault is the
    caller's), or "" when nothing tells."""
    if isinstance(error, SyntaxError) and error.filename:
        return f" ({error.filename}, line {error.lineno})"
    skip = ("<frozen", str(Path(__file__).resolve().parents[1]),
            str(Path(importlib.__file__).parent))
    # The standard library too (`Side("sucessor")` raises in enum.py), but not what is
    # installed beside it (a plugin's dependencies may be at fault).
    stdlib = str(Path(inspect.__file__).parent) + "/"
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith(skip)
              and not (f.filename.startswith(stdlib) and "-packages/" not in f.filename)]
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def _from_loaded(module: object, attr: str, ref: str) -> object:
    try:
        return getattr(module, attr)
    except AttributeError:
        raise PluginNotFoundError(f"{ref!r}: no attribute {attr!r}") from None


def validate_plugin(ref: str, obj: object) -> type[Proxy[Any]]:
    """Raises PluginValidationError unless `obj` is a usable Proxy subclass."""
    if not (inspect.isclass(obj) and issubclass(obj, Proxy)):
        raise PluginValidationError(
            ref, f"{obj!r} is not a subclass of conductor.plugins.Proxy")
    if obj.takes_options():  # its own model: the plugin has imported pydantic already
        from pydantic import BaseModel

        model = obj.options_model
        if not (inspect.isclass(model) and issubclass(model, BaseModel)):
            raise PluginValidationError(ref,
                                        "options_model must be a pydantic BaseModel subclass")
    return obj


def make_proxy(cls: type[Proxy[Any]], options: dict[str, Any] | None, *, name: str,
               file: str | None, where: str) -> Proxy[Any]:
    """Instantiate with validated options; the proxy is renamed to its chain name.

    Raises:
        ConfigError: the options do not fit the proxy's options model.
    """
    if not options and not cls.takes_options():
        # Nothing to validate: pydantic (NoOptions) stays unimported (see NoOptions). None
        # is the documented "no options given" (a subclass may take `options` positionally).
        return _construct(cls, None, name=name, file=file, where=where)
    from pydantic import ValidationError

    from conductor.validation import problems

    prefix = f"{where}.options" if where else "options"
    try:
        model = cls.options_model.model_validate(options or {})
    except ValidationError as e:
        found = problems(e, cls.options_model, prefix=prefix, unknown="unknown option {key!r}")
        raise ConfigError.combine(
            [ConfigError(f"proxy {name!r}: {p.message}", file=file, field=p.field, hint=p.hint)
             for p in found], file) from None
    return _construct(cls, model, name=name, file=file, where=where)


def _construct(cls: type[Proxy[Any]], options: Any, *, name: str, file: str | None,
               where: str) -> Proxy[Any]:
    """`cls(options)`, renamed. A constructor that raises (e.g. checking its own settings)
    is the chain's problem, reported like a plugin that fails to import: naming the entry
    and the plugin's line, not as the conductor's internal error."""
    try:
        proxy = cls(options)
    except Exception as e:
        # `where` is empty for serve-proxy, whose `file` ("--options") is not at fault here.
        located = f"{file or '<chain>'}: {where}: " if where else ""
        raise PluginError(f"{located}proxy {name!r} failed to start"
                          f"{_where(e)}: {type(e).__name__}: {e}") from None
    proxy.rename(name)
    return proxy


def load_proxy(ref: str, options: dict[str, Any] | None, *, name: str | None = None,
               file: str | None = None, where: str = "proxy") -> Proxy[Any]:
    """find_plugin + make_proxy.

    Raises:
        PluginError: not found or not a Proxy.
        ConfigError: bad options.
    """
    cls = find_plugin(ref)
    default_name = ref.rpartition(":")[2] if ":" in ref else Path(ref).stem
    return make_proxy(cls, options, name=name or default_name.lower(), file=file, where=where)


def load_component_proxy(spec: ComponentSpec, name: str, *, file: str | None,
                         where: str, base_dir: str | None = None) -> Proxy[Any]:
    """The proxy a `use = ...` / `plugin = ...` chain entry names, options validated.

    Raises:
        PluginError: not found or not a Proxy (the message names the file and entry).
        ConfigError: bad options.
    """
    key = "use" if spec.use is not None else "plugin"
    ref = spec.use if spec.use is not None else spec.plugin
    assert ref is not None
    try:
        cls = find_plugin(ref, base_dir=base_dir)
    except PluginError as e:
        raise e.located(f"{file or '<chain>'}: {where}.{key}") from None
    return make_proxy(cls, spec.options, name=name, file=file, where=where)
