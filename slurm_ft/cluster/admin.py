"""``slurm-ft admin install``: put the SPANK plugin, the prolog/epilog and a site config into a Slurm installation.

What it does (every path is an option; ``--dry-run`` only prints):

1. builds ``spank/`` with ``make`` (hardening flags) into ``<prefix>/lib/slurm-ft/slurm_ft_spank.so``;
2. writes the wrappers ``<prefix>/libexec/slurm-ft/slurm-ft-{prolog,epilog,healthcheck}`` from ``prolog/`` and
   ``epilog/`` (tiny isolated-Python scripts that call ``slurm_ft.cluster.hooks`` with the site config path);
3. writes ``<config-dir>/config.toml`` unless one exists (an existing one is validated, never replaced);
4. prints the ``slurm.conf`` and ``plugstack.conf`` lines it needs, or with ``--edit`` changes the given files
   after a timestamped backup: settings slurm-ft needs are added or merged, a conflicting one (another Prolog)
   stops the install with a message naming it;
5. writes a systemd unit for the monitor (``slurm-ft-monitor.service``).

``install_in_dir`` is the same code with every path inside one directory and the TEST-ONLY knobs on; the lab
cluster (``slurm-ft lab up``, ``slurm_ft.lab.cluster``) calls it while it writes its slurm.conf.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from slurm_ft.cluster.hooks import Settings
from slurm_ft.core.config import load_site_config
from slurm_ft.core.errors import ConfigError, SlurmFtError
from slurm_ft.slurm import headers
from slurm_ft.slurm.parsers import parse_version

PLUGIN_NAME = "slurm_ft_spank.so"
WRAPPERS = {"prolog": "prolog/slurm-ft-prolog.in", "epilog": "epilog/slurm-ft-epilog.in",
            "healthcheck": "prolog/slurm-ft-healthcheck.in"}
UNIT_NAME = "slurm-ft-monitor.service"
# Merged into comma-separated slurm.conf settings: run the prolog at allocation on every node; requeue a job
# whose prolog failed without holding it, so it runs elsewhere.
MERGED_FLAGS = {"PrologFlags": ("Alloc",), "SchedulerParameters": ("nohold_on_prolog_fail",)}
PROLOG_EPILOG_TIMEOUT = 90  # seconds; above [hooks] budget_s so slurm-ft's own bound acts first


class AdminError(SlurmFtError):
    """The install cannot go on; nothing after the failing step was changed."""


NO_SOURCES = ("this slurm-ft has no hook sources (spank/, prolog/, epilog/): install it from a wheel or sdist "
              "built by `pip wheel .`, or run it from the source tree")


def hook_sources() -> Path:
    """Where ``spank/``, ``prolog/`` and ``epilog/`` are: inside the installed package (a wheel ships them as
    ``slurm_ft/hook_sources/``, see setup.py), else the source tree this package runs from."""
    package = Path(__file__).resolve().parents[1]  # slurm_ft/
    shipped = package / "hook_sources"
    return shipped if (shipped / "spank" / "Makefile").is_file() else package.parent


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class InstallConfig:
    """``slurm-ft admin install``: where things go."""

    prefix: Path = Path("/usr/local")
    """Installation prefix of the SPANK plugin and the hook scripts (``--prefix``)."""
    config_dir: Path = Path("/etc/slurm-ft")
    """Where the site config (``config.toml``) goes."""
    state_dir: Path = Path("/var/lib/slurm-ft")
    """slurm-ft's state directory (quarantine store, job registry, node reports)."""
    slurm_conf: Path | None = None
    """The slurm.conf to edit when ``edit`` is set; unset: only print the lines to add."""
    plugstack: Path | None = None
    """The plugstack.conf to write; unset: ``plugstack.conf`` next to ``slurm_conf`` (or in /etc/slurm)."""
    systemd_dir: Path | None = Path("/etc/systemd/system")
    """Where the monitor's systemd unit goes; unset: no unit."""
    python: str = sys.executable
    """The interpreter the hook scripts and the monitor run with."""
    slurm_user: str = "slurm"
    """Slurm's SlurmUser (owns the state the hooks write)."""
    edit: bool = False
    """Edit slurm.conf and plugstack.conf in place (after a timestamped backup) instead of printing the lines."""
    test_mode: bool = False
    """TEST-ONLY: the lab's recorded-NVML injection (``[health] test_mode``)."""
    source: Path = dataclasses.field(default_factory=hook_sources)
    """Where ``spank/``, ``prolog/`` and ``epilog/`` are (the wheel ships them; else the source tree)."""
    slurm_include: Path | None = None
    """Slurm headers to build the SPANK plugin against; unset: those of the Slurm first on PATH."""
    default_ckpt_dir: Path | None = None
    """The SPANK plugin's ``default_ckpt_dir=``; unset: sbatch needs ``--ft-ckpt-dir``."""

    def __post_init__(self) -> None:
        for name in ("prefix", "config_dir", "state_dir", "slurm_conf", "plugstack", "systemd_dir", "source",
                     "slurm_include", "default_ckpt_dir"):
            value = getattr(self, name)
            if value is None:
                continue
            path = Path(value)
            if not path.is_absolute():
                raise ConfigError(f"{name}: must be an absolute path, got {str(value)!r}")
            if name != "source" and any(c in str(path) for c in " \t\n\r\0"):
                raise ConfigError(f"{name}: must not contain spaces or control characters "
                                  f"(slurm.conf cannot quote them), got {str(value)!r}")
            object.__setattr__(self, name, path)
        if self.edit and self.slurm_conf is None:
            raise ConfigError("edit: --edit needs --slurm-conf PATH")
        if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", self.slurm_user):
            raise ConfigError(f"slurm_user: not a user name (--slurm-user): {self.slurm_user!r}")
        if not Path(self.python).is_absolute():
            raise ConfigError(f"python: must be an absolute path, got {self.python!r}")

    lib_dir = property(lambda self: self.prefix / "lib" / "slurm-ft")
    libexec_dir = property(lambda self: self.prefix / "libexec" / "slurm-ft")
    config_path = property(lambda self: self.config_dir / "config.toml")
    plugin_path = property(lambda self: self.lib_dir / PLUGIN_NAME)

    @property
    def plugstack_path(self) -> Path:
        if self.plugstack is not None:
            return self.plugstack
        return (self.slurm_conf.parent if self.slurm_conf else Path("/etc/slurm")) / "plugstack.conf"

    def wrapper(self, kind: str) -> Path:
        return self.libexec_dir / f"slurm-ft-{kind}"


@dataclasses.dataclass(slots=True)
class InstallResult:
    """What an install did or would do."""

    written: list[str] = dataclasses.field(default_factory=list)
    kept: list[str] = dataclasses.field(default_factory=list)
    backups: list[str] = dataclasses.field(default_factory=list)
    slurm_conf_lines: list[str] = dataclasses.field(default_factory=list)
    plugstack_line: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- pure parts ------------------------------------------------------------------------------------------


def slurm_conf_settings(cfg: InstallConfig) -> dict[str, str]:
    """The slurm.conf settings slurm-ft needs (flags are merged with what is there, see MERGED_FLAGS)."""
    return {
        "Prolog": str(cfg.wrapper("prolog")),
        "Epilog": str(cfg.wrapper("epilog")),
        "PlugStackConfig": str(cfg.plugstack_path),
        "PrologFlags": ",".join(MERGED_FLAGS["PrologFlags"]),
        "SchedulerParameters": ",".join(MERGED_FLAGS["SchedulerParameters"]),
        "PrologEpilogTimeout": str(PROLOG_EPILOG_TIMEOUT),
    }


def plugstack_line(cfg: InstallConfig) -> str:
    """The plugstack.conf line; with the site's default checkpoint dir, ``--ft`` alone is enough to submit."""
    default = f" default_ckpt_dir={cfg.default_ckpt_dir}" if cfg.default_ckpt_dir is not None else ""
    return f"required {cfg.plugin_path}{default}"


def render_wrapper(template: str, *, python: str, config: Path, slurm_bin: Path) -> str:
    """A wrapper script from its template: the interpreter in the shebang, the config path and the Slurm
    commands' directory as literals."""
    for mark in ("@PYTHON@", "@CONFIG@", "@SLURM_BIN@"):
        if mark not in template:
            raise AdminError(f"wrapper template lacks {mark}")
    return (template.replace("@PYTHON@", python).replace("@CONFIG@", json.dumps(str(config)))
            .replace("@SLURM_BIN@", json.dumps(str(slurm_bin))))


def render_site_config(cfg: InstallConfig) -> str:
    """A commented site config with slurm-ft's defaults (the lab's adds the TEST-ONLY knobs)."""
    lines = [
        "# slurm-ft site config (written by `slurm-ft admin install`; yours to edit, reinstall keeps it).",
        f'state_dir = "{cfg.state_dir}"',
        "",
        "[health]",
        "# expected_gpus = 8            # every node must show this many GPUs (unset: not checked)",
        "# max_temperature_c = 95",
        "# drain_xids = [48, 79]        # unset: the classifier's Xid table (rules.toml)",
    ]
    if cfg.test_mode:
        lines += [
            "# TEST-ONLY (lab cluster): <test_nvml_snapshot_dir>/<node>.json replaces NVML on that node.",
            "test_mode = true",
            f'test_nvml_snapshot_dir = "{cfg.state_dir.parent / "test-nvml"}"',
        ]
    lines += [
        "",
        "[hooks]",
        "# min_free_gb = 1.0            # free space the job's --ft-ckpt-dir needs",
        "# use_quarantine_store = true  # false where state_dir is on NFS (drain directly, monitor adopts)",
        f'log_file = "{cfg.state_dir.parent / "log" / "slurm-ft-hooks.log"}"' if cfg.test_mode
        else '# log_file = "/var/log/slurm-ft/hooks.log"   # default <state_dir>/log/hooks.log',
        "",
        "[quarantine]",
        f'slurm_user = "{cfg.slurm_user}"',
        "# strike_window_s = 86400",
        "# suspect_after = 2",
        "# quarantine_after = 3",
        "# min_quarantine_s = 300",
        "# probation_s = 3600",
        "",
    ]
    return "\n".join(lines)


def render_unit(cfg: InstallConfig) -> str:
    return "\n".join([
        "[Unit]",
        "Description=slurm-ft job monitor (classifies failed jobs, quarantines nodes, requeues)",
        "After=network-online.target slurmctld.service",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"Environment=SLURM_FT_CONFIG={cfg.config_path}",
        f"ExecStart={cfg.python} -I -m slurm_ft.cli monitor",
        "Restart=on-failure",
        "RestartSec=10",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])


_SETTING_RE = re.compile(r"^\s*([A-Za-z]+)\s*=\s*(.*?)\s*$")


def edit_slurm_conf(text: str, wanted: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` with ``wanted`` applied, and what changed. Flags in MERGED_FLAGS are merged; any other
    setting already present with a different value is a conflict (AdminError naming it), never replaced."""
    lines = text.splitlines()
    index = {}
    for i, line in enumerate(lines):
        m = _SETTING_RE.match(line.split("#", 1)[0])
        if m and " " not in m.group(2):  # one Key=value per line (NodeName=... lines have several)
            index[m.group(1).lower()] = i
    changes = []
    appended = []
    for key, value in wanted.items():
        at = index.get(key.lower())
        if at is None:
            appended.append(f"{key}={value}")
            changes.append(f"added {key}={value}")
            continue
        current = _SETTING_RE.match(lines[at].split("#", 1)[0]).group(2)  # type: ignore[union-attr]
        if key in MERGED_FLAGS:
            tokens = [t for t in current.split(",") if t]
            missing = [f for f in value.split(",") if f.lower() not in {t.lower() for t in tokens}]
            if missing:
                lines[at] = f"{key}={','.join(tokens + missing)}"
                changes.append(f"merged {key}: {current} -> {','.join(tokens + missing)}")
        elif current != value:
            if key == "PrologEpilogTimeout":
                continue  # the site's timeout wins; slurm-ft bounds itself
            raise AdminError(f"slurm.conf already sets {key}={current}; slurm-ft needs {key}={value}. "
                             f"Chain the existing script from the site's own, or remove it, then rerun")
    if appended:
        lines += ["", "# slurm-ft (slurm-ft admin install)"] + appended
    return "\n".join(lines) + "\n", changes


def edit_plugstack(text: str, line: str) -> tuple[str, bool]:
    """``text`` with the plugin line added (or an older slurm-ft line replaced); whether it changed."""
    kept = []
    for existing in text.splitlines():
        fields = existing.split("#", 1)[0].split()
        if len(fields) >= 2 and fields[1].endswith("/" + PLUGIN_NAME):
            if existing.strip() == line:
                return text, False
            continue  # an older slurm-ft plugin path
        kept.append(existing)
    return "\n".join(kept + [line]) + "\n", True


# --- side effects ----------------------------------------------------------------------------------------


def plugin_headers(explicit: Path | None) -> Path:
    """The include dir to build the plugin with: the running Slurm's headers, checked against its version."""
    try:
        include_dir = headers.find_include_dir(explicit)
        running = running_slurm_version()
        headers.check_matches(include_dir, running)
    except ConfigError as exc:
        raise AdminError(str(exc)) from exc
    return include_dir


def slurm_bin_dir() -> Path:
    """Where the Slurm commands (scontrol, sinfo) of the Slurm first on PATH live; the hooks put it first on PATH."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        raise AdminError("no scontrol on PATH: put the Slurm slurm-ft is installed for first on PATH")
    return Path(scontrol).parent


def running_slurm_version() -> str:
    """``slurmd -V`` of the Slurm first on PATH: the daemon that will load the plugin (``-V`` needs no config)."""
    slurmd = headers.find_program("slurmd")
    if slurmd is None:
        raise AdminError("no slurmd on PATH or in /usr/sbin: put the Slurm the plugin is for first on PATH")
    done = subprocess.run([slurmd, "-V"], capture_output=True, text=True, timeout=30,  # noqa: S603
                          check=False, stdin=subprocess.DEVNULL)
    try:
        return parse_version(done.stdout or done.stderr)
    except ValueError as exc:
        raise AdminError(f"{slurmd} -V: {exc}") from exc


def build_plugin(source: Path, out_dir: Path, include_dir: Path) -> Path:
    """``make -C <source>/spank OUT=<out_dir> SLURM_INCLUDE=<include_dir>``; the built plugin's path."""
    makefile = source / "spank" / "Makefile"
    if not makefile.is_file():
        raise AdminError(f"no {makefile}: {NO_SOURCES}")
    if shutil.which("make") is None or shutil.which(os.environ.get("CC", "cc")) is None:
        raise AdminError("building the SPANK plugin needs make and a C compiler: apt-get install -y build-essential")
    out_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    done = subprocess.run(["make", "-s", "-B", "-C", str(source / "spank"), f"OUT={out_dir}",  # noqa: S603
                           f"SLURM_INCLUDE={include_dir}"],
                          capture_output=True, text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        output = (done.stderr or done.stdout).strip()[-800:]
        raise AdminError(f"make -C spank failed (exit {done.returncode}): {output}")
    return out_dir / PLUGIN_NAME


def _write(path: Path, text: str, mode: int, result: InstallResult) -> None:
    """Atomic write with ``mode``; a file with the same content is left alone."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    if path.exists() and not path.is_symlink() and path.read_text() == text:
        os.chmod(path, mode)
        result.kept.append(str(path))
        return
    tmp = path.with_name(f".{path.name}.slurm-ft-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    result.written.append(str(path))


def _edit_file(path: Path, new_text: str, result: InstallResult) -> None:
    """Replace ``path`` (keeping mode and owner) after copying it to ``<path>.slurm-ft-backup-<stamp>``."""
    stamp = dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    backup = path.with_name(f"{path.name}.slurm-ft-backup-{stamp}")
    st = path.stat()
    shutil.copy2(path, backup)
    result.backups.append(str(backup))
    tmp = path.with_name(f".{path.name}.slurm-ft-tmp")
    tmp.write_text(new_text)
    os.chmod(tmp, st.st_mode & 0o7777)
    os.chown(tmp, st.st_uid, st.st_gid)
    os.replace(tmp, path)
    result.written.append(str(path))


def _validate_site_config(path: Path) -> None:

    Settings.load(load_site_config(path))


def install(cfg: InstallConfig, *, dry_run: bool = False, rewrite_config: bool = False) -> InstallResult:
    """Install into a Slurm installation (see the module docstring). Raises AdminError; partial work stays."""
    result = InstallResult(slurm_conf_lines=[f"{k}={v}" for k, v in slurm_conf_settings(cfg).items()],
                           plugstack_line=plugstack_line(cfg))
    templates = {kind: (cfg.source / rel) for kind, rel in WRAPPERS.items()}
    for path in templates.values():
        if not path.is_file():
            raise AdminError(f"no {path}: {NO_SOURCES}")
    if dry_run:
        result.notes.append("dry run: nothing written")
        return result
    include_dir = plugin_headers(cfg.slurm_include)
    build_plugin(cfg.source, cfg.lib_dir, include_dir)
    result.written.append(str(cfg.plugin_path))
    slurm_bin = slurm_bin_dir()
    for kind, path in templates.items():
        _write(cfg.wrapper(kind), render_wrapper(path.read_text(), python=cfg.python, config=cfg.config_path,
                                                 slurm_bin=slurm_bin), 0o755, result)
    if cfg.config_path.exists() and not rewrite_config:
        result.kept.append(str(cfg.config_path))
    else:
        _write(cfg.config_path, render_site_config(cfg), 0o644, result)
    try:
        _validate_site_config(cfg.config_path)
    except SlurmFtError as exc:
        raise AdminError(f"site config {cfg.config_path} is invalid: {exc}") from exc
    cfg.state_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    if cfg.systemd_dir is not None:
        _write(cfg.systemd_dir / UNIT_NAME, render_unit(cfg), 0o644, result)
    if cfg.edit:
        _apply_edits(cfg, result)
    return result


def _apply_edits(cfg: InstallConfig, result: InstallResult) -> None:
    assert cfg.slurm_conf is not None  # InstallConfig checks edit => slurm_conf
    if not cfg.slurm_conf.is_file():
        raise AdminError(f"--slurm-conf {cfg.slurm_conf} does not exist")
    new_conf, changes = edit_slurm_conf(cfg.slurm_conf.read_text(), slurm_conf_settings(cfg))
    plug_path = cfg.plugstack_path
    old_plug = plug_path.read_text() if plug_path.exists() else ""
    new_plug, plug_changed = edit_plugstack(old_plug, plugstack_line(cfg))
    if changes:
        _edit_file(cfg.slurm_conf, new_conf, result)
        result.notes.extend(f"slurm.conf: {c}" for c in changes)
    if plug_changed:
        if plug_path.exists():
            _edit_file(plug_path, new_plug, result)
        else:
            _write(plug_path, new_plug, 0o644, result)
        result.notes.append(f"plugstack.conf: {plugstack_line(cfg)}")
    result.notes.append("run `scontrol reconfigure` (slurmctld and every slurmd must see the same files)")


def install_in_dir(root: Path, *, config_dir: Path, state_dir: Path, slurm_user: str) -> list[str]:
    """Install everything under ``root`` (a lab cluster's directory; the site config in ``config_dir``, the state in
    ``state_dir``), TEST-ONLY knobs on; the slurm.conf lines the cluster must append."""
    root = Path(root).absolute()
    cfg = InstallConfig(prefix=root / "slurm-ft", config_dir=Path(config_dir), state_dir=Path(state_dir),
                        plugstack=root / "plugstack.conf", systemd_dir=None, slurm_user=slurm_user, test_mode=True)
    result = InstallResult()
    install(cfg, rewrite_config=True)
    (root / "test-nvml").mkdir(exist_ok=True, mode=0o755)
    _write(cfg.plugstack_path, plugstack_line(cfg) + "\n", 0o644, result)
    # SchedulerParameters/PrologFlags are merged into the lab's own lines by slurm_ft.lab.slurmconf.
    return [f"{k}={v}" for k, v in slurm_conf_settings(cfg).items()]


# --- CLI -------------------------------------------------------------------------------------------------


def register(subparsers: Any, name: str) -> None:
    parser = subparsers.add_parser(name, help="install slurm-ft into a Slurm installation (as root)",
                                   description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="admin_command", metavar="ACTION", required=True)
    inst = sub.add_parser("install", help="install the SPANK plugin, prolog/epilog, site config and monitor unit",
                          description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    inst.add_argument("--prefix", type=Path, default=Path("/usr/local"),
                      help="installs <prefix>/lib/slurm-ft and <prefix>/libexec/slurm-ft (default /usr/local)")
    inst.add_argument("--config-dir", type=Path, default=Path("/etc/slurm-ft"), help="default /etc/slurm-ft")
    inst.add_argument("--state-dir", type=Path, default=Path("/var/lib/slurm-ft"), help="default /var/lib/slurm-ft")
    inst.add_argument("--slurm-conf", type=Path, help="the slurm.conf to edit with --edit")
    inst.add_argument("--plugstack", type=Path, help="plugstack.conf (default: next to --slurm-conf, or /etc/slurm)")
    inst.add_argument("--edit", action="store_true", help="edit --slurm-conf and plugstack.conf (backups kept)")
    inst.add_argument("--systemd-dir", type=Path, default=Path("/etc/systemd/system"), help="for the monitor unit")
    inst.add_argument("--no-systemd", action="store_true", help="do not write the monitor unit")
    inst.add_argument("--slurm-user", default="slurm", help="Slurm's SlurmUser (may change quarantine)")
    inst.add_argument("--slurm-include", type=Path,
                      help="Slurm's include dir to build the SPANK plugin with (default: the headers of the Slurm "
                           "first on PATH, <prefix>/include, else pkg-config slurm, else /usr/include)")
    inst.add_argument("--default-ckpt-dir", type=Path,
                      help="checkpoint dir of an --ft job that names none (default: none, sbatch then refuses "
                           "--ft without --ft-ckpt-dir)")
    inst.add_argument("--dry-run", action="store_true", help="print what is needed, write nothing")
    inst.add_argument("--json", action="store_true", help="print the result as JSON")
    inst.set_defaults(func=_install_cmd)
    check = sub.add_parser("check-config", help="validate a site config")
    check.add_argument("--config", type=Path, help="default $SLURM_FT_CONFIG or /etc/slurm-ft/config.toml")
    check.set_defaults(func=_check_cmd)


def _install_cmd(args: argparse.Namespace) -> int:
    cfg = InstallConfig(prefix=args.prefix.absolute(), config_dir=args.config_dir.absolute(),
                        state_dir=args.state_dir.absolute(),
                        slurm_conf=args.slurm_conf.absolute() if args.slurm_conf else None,
                        plugstack=args.plugstack.absolute() if args.plugstack else None,
                        systemd_dir=None if args.no_systemd else args.systemd_dir.absolute(),
                        slurm_user=args.slurm_user, edit=args.edit,
                        slurm_include=args.slurm_include.absolute() if args.slurm_include else None,
                        default_ckpt_dir=args.default_ckpt_dir)
    if not args.dry_run and os.geteuid() != 0:
        raise AdminError("admin install writes root-run hooks: run it as root (or use --dry-run)", exit_code=77)
    result = install(cfg, dry_run=args.dry_run)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    for path in result.written:
        print(f"wrote   {path}")
    for path in result.kept:
        print(f"kept    {path}")
    for path in result.backups:
        print(f"backup  {path}")
    for note in result.notes:
        print(f"note    {note}")
    if not cfg.edit:
        print("\n# add to slurm.conf (PrologFlags/SchedulerParameters: merge with existing values):")
        print("\n".join(result.slurm_conf_lines))
        print(f"# optional, node health checks between jobs:\n# HealthCheckProgram={cfg.wrapper('healthcheck')}"
              "\n# HealthCheckInterval=300")
        print(f"\n# add to {cfg.plugstack_path}:\n{result.plugstack_line}")
    return 0


def _check_cmd(args: argparse.Namespace) -> int:

    site = load_site_config(args.config)
    settings = Settings.load(site)
    print(f"{site.source}: ok (state_dir {settings.state_dir})")
    return 0


