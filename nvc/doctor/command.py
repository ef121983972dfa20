"""The ``nvc-py doctor`` command (registered by nvc/commands/cli.py): every check, one line each,
exit 0 only when every check that applies holds."""

from __future__ import annotations

import json

import click

from nvc.doctor import FAIL, MARKS, Check


def checks(config_path: str | None, root: str | None, run: bool) -> list[Check]:
    """Every check, in the order a GPU reaches a container: configuration, driver, NVML, nodes, the
    host's cgroups and ldconfig, the hook server, each engine, CDI; then the containers."""
    from nvc.doctor import engines, host
    from nvc.doctor import run as runs
    from nvc.hook.setup.processes import docker_host

    found, conf = host.configuration(config_path)
    if root is not None:
        conf = conf._replace(root=root)
    found = [found]
    check, version = host.driver()
    found.append(check)
    gpus = ()
    if version is not None:
        check, gpus = host.nvml(conf)
        found += [check, host.device_nodes(conf.root, gpus)]
    found += [host.cgroup_version(), host.ldconfig(conf), engines.server(config_path)]
    podman, crio = engines.hooks_engine("podman", "podman"), engines.hooks_engine("CRI-O", "crio")
    found += [podman, crio]
    docker, dockerd = engines.docker()
    found += [*docker, *engines.containerd()]
    found.append(engines.systemd_reload([(podman, "podman"), (crio, "CRI-O")], dockerd=dockerd))
    if gpus:
        found.append(engines.cdi(lambda: _fresh_spec(conf)))
    if run:
        found += runs.run_containers(runs.registered(podman, docker, docker_host(dockerd)), conf.log_file)
    return found


def security_checks() -> list[Check]:
    """The hostile-image cases through each engine nvc-py is registered with (nvc/doctor/security.py)."""
    from nvc.doctor import engines, security
    from nvc.doctor import run as runs
    from nvc.hook.setup.processes import docker_host

    podman = engines.hooks_engine("podman", "podman")
    docker, dockerd = engines.docker()
    return security.run_cases(runs.registered(podman, docker, docker_host(dockerd)))


def _fresh_spec(conf) -> dict:  # noqa: ANN001 - nvc.config.Config
    """The CDI spec ``cdi generate`` would write now (compared by device names and nodes only)."""
    from nvc import cdi
    from nvc.config.options import parse_user
    from nvc.system import programs

    return cdi.generate(
        conf.root,
        conf.ldcache,
        parse_user(conf.user),
        "index",
        programs.installed_program(programs.HOOK_SCRIPT),
        programs.hook_env(None),
    )


def text(found: list[Check]) -> str:
    lines = []
    for check in found:
        line = f"{MARKS[check.status]} {check.name}: {check.detail}"
        lines.append(line + (f"\n    → {check.fix}" if check.fix else ""))
    failed = sum(c.status == FAIL for c in found)
    lines.append(f"{'all checks hold' if not failed else f'{failed} check(s) failed'}")
    return "\n".join(lines) + "\n"


@click.command("doctor", short_help="Check this host for GPU containers; say what to fix.")
@click.option(
    "--run",
    "run",
    is_flag=True,
    help="Also start a small container through each registered engine, "
    "asking for GPU 0, and say whether it sees the GPU.",
)
@click.option(
    "--security",
    "security",
    is_flag=True,
    help="Instead, run the hostile-image regression cases against the installed hook through each "
    "registered engine, in throw-away containers; one line per case (passed, failed, not "
    "applicable). Leaves nothing behind.",
)
@click.option("--json", "as_json", is_flag=True, help="JSON output: the checks and whether all hold.")
@click.option(
    "--config",
    "config_path",
    metavar="PATH",
    default=None,
    help="Configuration file the hook reads [default: $NVC_PY_CONFIG, else /etc/nvc-py/config.yaml].",
)
@click.pass_context
def doctor(ctx: click.Context, run: bool, security: bool, as_json: bool, config_path: str | None) -> None:
    """Check what a GPU container needs on this host: the driver and NVML, device nodes, cgroups, the
    ldconfig the hook runs, the hook server, each installed engine's registration where that engine
    reads it (podman, CRI-O, Docker, containerd), the CDI spec; one line each, with what to do.
    Exit status 0 only when every check that applies holds (1 otherwise). With --security, the
    hostile-image cases of docs/security.md instead (exit 0 only when none failed)."""
    given = ctx.find_root().obj  # the global options (nvc.commands.cli._Given): --root chooses the driver root
    if security:
        found = security_checks()
    else:
        found = checks(config_path, given.root if given is not None else None, run)
    if as_json:
        click.echo(
            json.dumps(
                {"ok": all(c.status != FAIL for c in found), "checks": [c._asdict() for c in found]},
                indent=2,
                ensure_ascii=False,
            )
        )
    elif security:
        from nvc.doctor.security import text as case_lines

        click.echo(case_lines(found), nl=False)
    else:
        click.echo(text(found), nl=False)
    if any(c.status == FAIL for c in found):
        ctx.exit(1)
