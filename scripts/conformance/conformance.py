#!/usr/bin/env python3
"""The conformance check of a render (issue 45): every command line the bundle writes, read against the real packages
of the versions the inventory names, taken from the registry (pinned and hash-checked by the inventory's pip locks,
cached: a warm run downloads nothing). Nothing is imported or installed; the wheels are read as zip files.

- vLLM's command (`vllm@.service`'s ExecStart runs `VENV/bin/vllm serve MODEL ...`): the script must be one of the
  wheel's console scripts (its dist-info's entry_points.txt), and the subcommand one that a class under
  vllm/entrypoints/cli names (`name = "serve"`, parsed).
- vLLM (`vllm@.service`'s ExecStart and each instance's SERVE_EXTRA_ARGS): each flag must be one the version's own
  argument parser defines. Read from its source, parsed (ast): the literal flags of every `add_argument` call under
  vllm/engine and vllm/entrypoints, and the fields of the frontend's argument dataclasses (`*FrontendArgs`, which
  vLLM turns into `--field-name`). A `--no-X` is taken where `--X` is a flag (vLLM's booleans are
  BooleanOptionalAction; this accepts the negation of a non-boolean too).
- SERVE_KV_TRANSFER_CONFIG: each key (at the top and in each of MultiConnector's `connectors`) must be a field of the
  version's `KVTransferConfig`; each `kv_connector` a name its connector factory registers; each
  `kv_connector_extra_config` key one that the connector's package reads (a string constant given to `.get()` or used
  as a subscript in a module of the connector's package).
- the router (VLLM_ROUTER_ARGS), by the program its unit runs (vllm_router_implementation): vllm-router's flags are
  the ones `vllm_router/router_args.py` adds, smg's the ones `smg/router_args.py` adds (`add_argument`, the
  `{prefix}` empty in both, as each command builds it; smg's `--api-key` is added in process by pd-smg-launch).
- mooncake_master (MOONCAKE_MASTER_ARGS) and mooncake_client (MOONCAKE_CLIENT_ARGS): each flag one the binary lists
  with gflags' `--helpxml`, run from the wheel with its bundled libraries. The cuda13 build's mooncake_client links
  libcuda.so.1, the GPU driver's library: a named test double stands in for it (gflags_of).

    conformance.py --render DIR --inventory inventory/prod [--vault-password-file F] [--cache DIR]
Exit 1 with one line per problem: the flag or key, the file it came from, the package and version.
- The vLLM patches (plugins/tools/pd_bundle_*.py): each declares what it needs beside its import-time check
  (*_TARGETS: names a module defines, CLASS.ATTR for a class's attribute or one its methods set on self; *_CALLS:
  text a function's source must hold, the same substring test the patch runs). Each is read in the version's module
  source. The runtime check itself is getattr on the imported module; this one is the source, parsed: one list, two
  readings. pd_bundle_store_breaker wraps mooncake.store, a compiled module: not read here (it refuses at import).
"""
import argparse
import ast
import configparser
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import zipfile
import xml.etree.ElementTree as ET
from pathlib import Path
import yaml

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("PD_LAB_CACHE", Path.home() / ".cache" / "pd-lab")) / "conformance"


# --- reading sources -------------------------------------------------------------------------------------------

def _text(node, bindings):
    """The string an expression evaluates to, where it is a literal or an f-string over names in bindings; else
    None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            elif (isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name)
                  and part.value.id in bindings):
                out.append(bindings[part.value.id])
            else:
                return None
        return "".join(out)
    return None


def argparse_flags(source, bindings=None):
    """The option strings (starting with -) of every add_argument call in source."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            for arg in node.args:
                text = _text(arg, bindings or {})
                if text and text.startswith("-"):
                    out.add(text)
    return out


def class_fields(source, names):
    """{class name: [annotated field names]} of the classes in source named in names (a set) or, names being a
    callable, for which names(class name, base names) is true; a class's bases in the same source add theirs."""
    tree = ast.parse(source)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def fields(cls, seen=()):
        own = [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
        for base in cls.bases:
            name = getattr(base, "id", None)
            if name in classes and name not in seen:
                own = fields(classes[name], seen + (cls.name,)) + own
        return own
    want = names if callable(names) else (lambda n, bases: n in names)
    return {n: fields(c) for n, c in classes.items() if want(n, [getattr(b, "id", None) for b in c.bases])}


def registered_connectors(source):
    """{connector name: module path} of every register_connector(NAME, MODULE, CLASS) call in source."""
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "register_connector" \
                and len(node.args) >= 2:
            name, module = _text(node.args[0], {}), _text(node.args[1], {})
            if name and module:
                out[name] = module
    return out


def read_keys(source):
    """String constants that source reads as keys: the first argument of a .get() call, or a subscript."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get" and node.args:
            text = _text(node.args[0], {})
            if text:
                out.add(text)
        elif isinstance(node, ast.Subscript):
            text = _text(node.slice, {})
            if text:
                out.add(text)
    return out


def gflags_names(helpxml):
    """The flag names of a gflags program's --helpxml output."""
    return {f.findtext("name") for f in ET.fromstring(helpxml).iter("flag")} - {None}


def _defined(tree):
    """{top-level name: node or None} of a module: its defs, classes, assignments and imported names."""
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                out[(alias.asname or alias.name).split(".")[0]] = None
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(target, ast.Name):
                    out[target.id] = None
        elif isinstance(node, (ast.If, ast.Try)):  # names defined under a version or import guard
            out.update(_defined(ast.Module(body=node.body, type_ignores=[])))
    return out


def _class_attr(cls, attr):
    """The node of attribute attr of a class: a method, a class-level assignment, or self.attr set in a method;
    True where it exists without a node of its own; None where it does not."""
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == attr:
            return node
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(target, ast.Name) and target.id == attr:
                    return True
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and node.attr == attr and isinstance(node.ctx, ast.Store):
            return True
    return None


def missing_in_source(source, names):
    """The dotted names (NAME, or CLASS.ATTR) of names that a module's source does not define."""
    defined, out = _defined(ast.parse(source)), []
    for dotted in names:
        head, _, attr = dotted.partition(".")
        if head not in defined:
            out.append(dotted)
        elif attr and isinstance(defined[head], ast.ClassDef) and _class_attr(defined[head], attr) is None:
            out.append(dotted)
        # A name imported from elsewhere (defined[head] is None): its attributes are not followed.
    return out


def calls_missing(source, where, calls):
    """The texts of calls that the source of where (None: the whole module; CLASS.FUNC: that method) lacks: the
    same substring test the patches run on inspect.getsource at import."""
    text = source
    if where:
        cls, _, func = where.partition(".")
        node = _defined(ast.parse(source)).get(cls)
        node = _class_attr(node, func) if isinstance(node, ast.ClassDef) else None
        text = ast.get_source_segment(source, node) if isinstance(node, ast.AST) else ""
    return [c for c in calls if c not in (text or "")]


# --- the packages ----------------------------------------------------------------------------------------------

class Wheel:
    """A wheel read in place (a zip file)."""

    def __init__(self, path):
        self.path = Path(path)
        self.zip = zipfile.ZipFile(self.path)
        self.names = self.zip.namelist()

    def read(self, name):
        return self.zip.read(name).decode("utf-8")

    def sources(self, prefix, recursive=True):
        """[(name, text)] of the .py files under prefix (a directory in the wheel)."""
        out = []
        for n in self.names:
            if n.startswith(prefix) and n.endswith(".py") and (recursive or "/" not in n[len(prefix):]):
                out.append((n, self.read(n)))
        return out


def vllm_facts(wheel):
    """What a vLLM wheel's source defines: its CLI flags, KVTransferConfig's fields, the registered connectors and the
    keys each connector's package reads."""
    flags = set()
    for name, text in wheel.sources("vllm/engine/") + wheel.sources("vllm/entrypoints/"):
        flags |= argparse_flags(text)
        frontend = class_fields(text, lambda n, bases: n.endswith("FrontendArgs"))
        flags |= {"--" + f.replace("_", "-") for fields in frontend.values() for f in fields}
    kv_fields, connectors = set(), {}
    for name, text in wheel.sources("vllm/config/") + wheel.sources("vllm/distributed/kv_transfer/", True):
        if "class KVTransferConfig" in text:
            kv_fields |= set(class_fields(text, {"KVTransferConfig"}).get("KVTransferConfig", []))
        if "register_connector(" in text:
            connectors.update(registered_connectors(text))
    keys = {}
    for conn, module in connectors.items():
        package = module.replace(".", "/").rsplit("/", 1)[0] + "/"
        keys[conn] = set().union(*[read_keys(t) for _, t in wheel.sources(package, recursive=False)] or [set()])
    return {"flags": flags, "kv_fields": kv_fields, "connectors": connectors, "extra_keys": keys}


def vllm_commands(wheel):
    """{console script: the set of its subcommands} of a vLLM wheel: the scripts of its entry_points.txt; the
    subcommands are the string `name` of each class under vllm/entrypoints/cli (vLLM's CLISubcommand classes), given
    to every script whose entry point lives in that package."""
    text = next((wheel.read(n) for n in wheel.names if n.endswith(".dist-info/entry_points.txt")), "")
    eps = configparser.ConfigParser(delimiters=("=",))
    eps.optionxform = str
    eps.read_string(text)
    subcommands = set()
    for _, src in wheel.sources("vllm/entrypoints/cli/"):
        for cls in (n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "name"
                                                        for t in stmt.targets) \
                        and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                    subcommands.add(stmt.value.value)
    scripts = eps["console_scripts"] if eps.has_section("console_scripts") else {}
    return {name: (subcommands if target.strip().startswith("vllm.entrypoints.cli.") else set())
            for name, target in scripts.items()}


def _vllm_units(root):
    return sorted(Path(root).glob("*/etc/systemd/system/vllm@.service"))


def _exec_argv(unit):
    """A unit file's ExecStart, split as a shell would (systemd's ${VAR} stays one token)."""
    return shlex.split(next(l.split("=", 1)[1] for l in unit.read_text().splitlines() if l.startswith("ExecStart=")))


def rendered_commands(render_dir):
    """[(host, file, script, subcommand)] of every vllm@.service in a render: ExecStart's program name and its first
    argument."""
    root, out = Path(render_dir), []
    for unit in _vllm_units(root):
        argv = _exec_argv(unit)
        out.append((unit.relative_to(root).parts[0], unit.relative_to(root), Path(argv[0]).name,
                    argv[1] if len(argv) > 1 else ""))
    return out


def command_problems(commands, known, label):
    """One message per vLLM unit whose program is not a console script of the version, or whose subcommand that
    script does not have. known: vllm_commands' answer."""
    out = []
    for host, path, script, sub in commands:
        if script not in known:
            out.append("%s runs %r, which %s does not install as a console script (it has: %s)" % (
                path, script, label, ", ".join(sorted(known)) or "none"))
        elif sub not in known[script]:
            out.append("%s runs `%s %s`: %s's %s has no subcommand %r (it has: %s)" % (
                path, script, sub, label, script, sub, ", ".join(sorted(known[script])) or "none"))
    return out


def module_source(wheel, dotted):
    """The source of module dotted in the wheel (a .py file or a package's __init__.py), or None."""
    base = dotted.replace(".", "/")
    for name in (base + ".py", base + "/__init__.py"):
        if name in wheel.names:
            return wheel.read(name)
    return None


PATCHES = REPO / "plugins" / "tools"


def patch_targets(patches_dir=PATCHES):
    """{patch: (targets {module: names}, calls {module[:CLASS.FUNC]: texts})} declared by each vLLM patch
    (plugins/tools/pd_bundle_*.py: the *_TARGETS and *_CALLS dicts beside its import-time check), read as literals
    from the patch's source (module-level string constants resolved), without running it."""
    out = {}
    for path in sorted(Path(patches_dir).glob("pd_bundle_*.py")):
        tree, consts, targets, calls = ast.parse(path.read_text()), {}, {}, {}
        for node in tree.body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
                continue
            name = node.targets[0].id
            try:
                value = _literal(node.value, consts)
            except ValueError as exc:
                if name.endswith(("_TARGETS", "_CALLS")):  # a declaration this reader cannot follow: say so
                    raise ValueError("%s: %s is not a literal over the module's constants (%s)" % (path.name, name, exc))
                continue
            consts[name] = value
            if name.endswith("_TARGETS"):
                targets.update(value)
            elif name.endswith("_CALLS"):
                calls.update(value)
        if targets or calls:
            out[path.stem] = (targets, calls)
    return out


def _literal(node, consts):
    """A literal expression over earlier module constants: strings, tuples, dicts, +, and generator-free
    tuple(...) of names; anything else raises ValueError."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in consts:
        return consts[node.id]
    if isinstance(node, ast.Name) and node.id in ("int", "str", "dict", "list", "float", "bool"):
        return node.id  # a type in a constant (store_wait's REQUIRED): its name
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e, consts) for e in node.elts)
    if isinstance(node, ast.Dict):
        return {_literal(k, consts): _literal(v, consts) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal(node.left, consts) + _literal(node.right, consts)
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "tuple" and len(node.args) == 1 \
            and isinstance(node.args[0], ast.GeneratorExp):
        gen = node.args[0]
        comp = gen.generators[0]
        items = _literal(comp.iter, consts)
        out = []
        for item in items:
            local = dict(consts)
            if isinstance(comp.target, ast.Tuple):
                for t, v in zip(comp.target.elts, item):
                    if isinstance(t, ast.Name):
                        local[t.id] = v
            elif isinstance(comp.target, ast.Name):
                local[comp.target.id] = item
            out.append(_literal(gen.elt, local))
        return tuple(out)
    raise ValueError(ast.dump(node)[:80])


def patch_problems(wheel, label, patches=None):
    """One message per name or call a patch declares that the wheel's module source lacks."""
    out = []
    for patch, (targets, calls) in (patch_targets() if patches is None else patches).items():
        for module, names in targets.items():
            source = module_source(wheel, module)
            if source is None:
                out.append("%s: module %s is not in %s" % (patch, module, label))
                continue
            out += ["%s: %s has no %s in %s" % (patch, module, n, label) for n in missing_in_source(source, names)]
        for key, texts in calls.items():
            module, _, where = key.partition(":")
            source = module_source(wheel, module)
            if source is None:
                out.append("%s: module %s is not in %s" % (patch, module, label))
                continue
            out += ["%s: %s%s no longer calls %s in %s" % (patch, module, " " + where if where else "", t, label)
                    for t in calls_missing(source, where or None, texts)]
    return out


ROUTER_ARGS = {"vllm-router": "vllm_router/router_args.py", "smg": "smg/router_args.py"}
# A router host whose unit runs smg's launcher runs smg: its file name, from the role that defines it.
SMG_LAUNCHER = yaml.safe_load((REPO / "roles" / "vllm_router" / "vars" / "main.yml").read_text())[
    "_vllm_router_smg_launcher"].rsplit("/", 1)[-1]


def router_flags(wheel, program="vllm-router"):
    return argparse_flags(wheel.read(ROUTER_ARGS[program]), {"prefix": ""})


def gflags_of(wheel, binary):
    """The flags a Mooncake binary of the wheel lists (--helpxml), run with the wheel's bundled libraries. The cuda
    builds link libcuda.so.1, the GPU driver's library, which a machine without a GPU lacks: a test double stands in
    for it (one of the wheel's own libraries under that name). With lazy binding (the loader's default) no CUDA symbol
    is resolved until called, and --helpxml calls none."""
    with tempfile.TemporaryDirectory() as tmp:
        members = [n for n in wheel.names if n == "mooncake/" + binary or ".libs/" in n]
        wheel.zip.extractall(tmp, members)
        exe = Path(tmp) / "mooncake" / binary
        exe.chmod(0o755)
        libs = sorted(Path(tmp).glob("*.libs"))
        stand_in = Path(tmp) / "no-gpu-stand-in"
        stand_in.mkdir()
        bundled = sorted(p for d in libs for p in d.iterdir() if ".so" in p.name)
        if bundled:
            (stand_in / "libcuda.so.1").symlink_to(bundled[0])
        res = subprocess.run([str(exe), "--helpxml"], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, LD_LIBRARY_PATH=":".join(str(p) for p in libs + [stand_in])))
        if "<AllFlags>" not in res.stdout:
            raise RuntimeError("%s of %s did not list its flags: %s" % (binary, wheel.path.name,
                                                                       (res.stderr or res.stdout).strip()[:300]))
        return gflags_names(res.stdout)


# --- the inventory's versions ----------------------------------------------------------------------------------

def lock_pins(inventory):
    """{(name, version): sha256} of every pin in the inventory's pip locks (pip-locks/**/*.txt)."""
    out = {}
    for path in sorted(Path(inventory).glob("pip-locks/**/*.txt")):
        for line in path.read_text().splitlines():
            m = re.match(r"^([A-Za-z0-9_.-]+)==([^ ;]+).*--hash=sha256:([0-9a-f]{64})", line)
            if m:
                out[(m.group(1).lower().replace("_", "-"), m.group(2))] = m.group(3)
    return out


def fetch(name, version, pins, cache=CACHE):
    """The wheel of name==version in cache, downloaded (no dependencies) when it is not there; hash-checked where
    the inventory's locks pin it."""
    cache.mkdir(parents=True, exist_ok=True)
    stem = name.replace("-", "_")
    found = sorted(cache.glob("%s-%s-*.whl" % (stem, version)))
    if found:
        return found[0]
    sha = pins.get((name, version))
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as req:
        req.write("%s==%s%s\n" % (name, version, " --hash=sha256:" + sha if sha else ""))
        req.flush()
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(cache),
               "-r", req.name] + (["--require-hashes"] if sha else [])
        subprocess.run(cmd, check=True, timeout=1800)
    found = sorted(cache.glob("%s-%s-*.whl" % (stem, version)))
    if not found:
        raise RuntimeError("pip download %s==%s wrote no wheel to %s" % (name, version, cache))
    return found[0]


# --- the render ------------------------------------------------------------------------------------------------

def _env(path):
    """KEY=VALUE lines of an environment file, values unquoted as systemd reads them."""
    out = {}
    for line in Path(path).read_text().splitlines():
        m = re.match(r"^([A-Z_][A-Z0-9_]*)=(.*)$", line)
        if m:
            value = m.group(2)
            out[m.group(1)] = " ".join(shlex.split(value)) if value[:1] in "\"'" else value
    return out


def _flags(tokens):
    return [t.split("=", 1)[0] for t in tokens if t.startswith("--")]


def _router_program(host_dir):
    """The program a rendered router host's unit runs: smg where it starts smg's launcher, else vllm-router."""
    unit = host_dir / "etc" / "systemd" / "system" / "vllm-router.service"
    return "smg" if unit.exists() and SMG_LAUNCHER in unit.read_text() else "vllm-router"


def rendered(render_dir):
    """[(program, host, file, [flags])] and [(host, file, kv_transfer_config)] of a render directory."""
    root, cmds, kv = Path(render_dir), [], []
    for unit in _vllm_units(root):
        host = unit.relative_to(root).parts[0]
        cmds.append(("vllm", host, unit.relative_to(root), _flags(_exec_argv(unit))))
        for env_file in sorted((root / host / "etc" / "vllm").glob("*.env")):
            env = _env(env_file)
            if "SERVE_EXTRA_ARGS" in env:
                cmds.append(("vllm", host, env_file.relative_to(root), _flags(shlex.split(env["SERVE_EXTRA_ARGS"]))))
            if "SERVE_KV_TRANSFER_CONFIG" in env:
                kv.append((host, env_file.relative_to(root), json.loads(env["SERVE_KV_TRANSFER_CONFIG"])))
    for program, pattern, var in (("router", "*/etc/vllm-router/router.env", "VLLM_ROUTER_ARGS"),
                                  ("mooncake_master", "*/etc/mooncake/master.env", "MOONCAKE_MASTER_ARGS"),
                                  ("mooncake_client", "*/etc/vllm/mooncake-store-client.env", "MOONCAKE_CLIENT_ARGS")):
        for env_file in sorted(root.glob(pattern)):
            env, host = _env(env_file), env_file.relative_to(root).parts[0]
            if var in env:
                cmds.append((_router_program(root / host) if program == "router" else program, host,
                             env_file.relative_to(root), _flags(shlex.split(env[var]))))
    return cmds, kv


# --- the checks ------------------------------------------------------------------------------------------------

def flag_problems(cmds, known, labels):
    """One message per flag of a rendered command line that its program's version does not define. known:
    {program: set of flags, with or without the leading dashes}; labels: {program: 'name version'}."""
    out = []
    for program, host, path, flags in cmds:
        have = known.get(program)
        if have is None:
            continue
        for flag in flags:
            bare = flag.lstrip("-")
            ok = flag in have or bare in have or (bare.startswith("no-") and "--" + bare[3:] in have)
            if not ok:
                out.append("%s (%s, host %s) is not a flag of %s" % (flag, path, host, labels[program]))
    return out


def kv_problems(kv, facts, label):
    """One message per key or connector of a rendered kv_transfer_config that the vLLM version does not know."""
    out = []

    def one(conf, where):
        for key in conf:
            if key not in facts["kv_fields"]:
                out.append("kv_transfer_config key %s (%s) is not a field of %s's KVTransferConfig" % (key, where, label))
        name = conf.get("kv_connector")
        if name is None:
            return
        if name not in facts["connectors"]:
            out.append("kv_connector %s (%s) is not a connector %s registers" % (name, where, label))
            return
        extra = conf.get("kv_connector_extra_config") or {}
        for key in extra:
            if key not in facts["extra_keys"].get(name, set()):
                out.append("kv_connector_extra_config key %s of %s (%s) is read nowhere in %s's connector package %s"
                           % (key, name, where, label, facts["connectors"][name]))
        for n, sub in enumerate(extra.get("connectors") or []):
            one(sub, "%s, connectors[%d]" % (where, n))
    for host, path, conf in kv:
        one(conf, "%s, host %s" % (path, host))
    return out



def role_defaults(roles_dir=REPO / "roles"):
    """Every role's defaults, merged as preflight reads them (plugins/filter/preflight.py's load_roles)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("pd_preflight_filter", REPO / "plugins" / "filter" / "preflight.py")
    preflight = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(preflight)
    return dict(preflight.load_roles(str(roles_dir))["defaults"])


def versions_of(groups, hostvars, defaults=None):
    """{program: (package, version)} that the inventory's hosts install (hostvars as ansible-inventory --list gives
    them, the roles' defaults beneath). Refuses an inventory whose hosts install two versions of one program: this
    check reads one version per program."""
    defaults = role_defaults() if defaults is None else defaults

    def val(host, var):
        return str(hostvars.get(host, {}).get(var, defaults.get(var)))
    vllm_hosts = list(groups.get("vllm_prefill") or []) + list(groups.get("vllm_decode") or [])
    found = {
        "vllm": {(val(h, "vllm_package"), val(h, "vllm_version")) for h in vllm_hosts},
        "vllm-router": {("vllm-router", val(h, "vllm_router_version")) for h in groups.get("vllm_router") or []
                        if val(h, "vllm_router_implementation") == "vllm-router"},
        "smg": {("smg", val(h, "vllm_router_smg_version")) for h in groups.get("vllm_router") or []
                if val(h, "vllm_router_implementation") == "smg"},
        "mooncake_master": {(val(h, "mooncake_package"), val(h, "mooncake_version"))
                            for h in groups.get("mooncake_master") or []},
        "mooncake_client": {(val(h, "mooncake_package"), val(h, "mooncake_version")) for h in vllm_hosts},
    }
    out = {}
    for program, pins in found.items():
        if len(pins) > 1:
            raise ValueError("the hosts install %s as %s: this check reads one version per program"
                             % (program, " and ".join("%s==%s" % p for p in sorted(pins))))
        if pins:
            out[program] = next(iter(pins))
    return out


def check(render_dir, versions, inventory, cache=CACHE):
    """(problems, summary lines) of a render against versions ({program: (package, version)})."""
    pins, cmds_kv = lock_pins(inventory), rendered(render_dir)
    cmds, kv = cmds_kv
    known, labels, facts, patch_msgs, cmd_msgs = {}, {}, None, [], []
    for program, (package, version) in versions.items():
        wheel = Wheel(fetch(package, version, pins, Path(cache)))
        labels[program] = "%s %s" % (package, version)
        if program == "vllm":
            facts = vllm_facts(wheel)
            known[program] = facts["flags"]
            patch_msgs = patch_problems(wheel, labels[program])
            commands = rendered_commands(render_dir)
            cmd_msgs = command_problems(commands, vllm_commands(wheel), labels[program])
        elif program in ROUTER_ARGS:
            known[program] = router_flags(wheel, program)
        else:
            known[program] = gflags_of(wheel, program)
    problems = flag_problems(cmds, known, labels)
    if facts is not None:
        problems += cmd_msgs + kv_problems(kv, facts, labels["vllm"]) + patch_msgs
        summary_cmds = sorted({"%s %s" % (c, sub) for _, _, c, sub in commands})
    summary = ["%s: %d flags on %d command lines, read against %s" % (
        p, sum(len(f) for q, _, _, f in cmds if q == p), sum(1 for q, _, _, _ in cmds if q == p), labels[p])
        for p in known]
    if facts is not None:
        summary.append("vllm units: %d run %s, read against %s's console scripts" % (
            len(commands), " and ".join(summary_cmds) or "nothing", labels["vllm"]))
    summary.append("kv_transfer_config: %d documents, read against %s" % (len(kv), labels.get("vllm")))
    declared = patch_targets()
    summary.append("patches: %d names and calls of %s, read against %s" % (
        sum(len(n) for t, cl in declared.values() for n in list(t.values()) + list(cl.values())),
        ", ".join(sorted(declared)), labels.get("vllm")))
    return problems, summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--render", required=True, help="a render directory (playbooks/render.yml -e render_dir=DIR)")
    ap.add_argument("--inventory", default=str(REPO / "inventory" / "prod"), help="the inventory it was rendered from")
    ap.add_argument("--vault-password-file", help="for ansible-inventory, where the inventory has a vault")
    ap.add_argument("--cache", default=str(CACHE))
    args = ap.parse_args(argv)
    cmd = [str(Path(sys.executable).with_name("ansible-inventory")), "-i", args.inventory, "--list"]
    cmd += ["--vault-password-file", args.vault_password_file] if args.vault_password_file else []
    data = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    groups = {g: v.get("hosts", []) for g, v in data.items() if isinstance(v, dict) and g != "_meta"}
    problems, summary = check(args.render, versions_of(groups, data["_meta"]["hostvars"]), args.inventory, args.cache)
    for line in summary:
        print("conformance: " + line)
    for p in problems:
        print("conformance: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
