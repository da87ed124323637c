"""Preconditions as data: operations declare needs; facts and arguments give plan errors or added operations."""

from dataclasses import replace
from pathlib import Path

import pytest

from hosttune.actions.base import Command, Directory, FileWrite, KernelWrite, Remove, Service, Step, Symlink
from hosttune.actions.needs import NeedCommand, NeedDir, NeedModel, NeedPort, NeedSpace, NeedVenv, parents, program
from hosttune.actions.platform import Apt, Dnf
from hosttune.config.inventory import Host
from hosttune.plan.host_plan import HostPlan, journal_requests, with_needs
from hosttune.plan.preconditions import check, requests_for
from hosttune.probes.needs import HostNeeds, parse_needs
from hosttune.transport.base import ConnectionSpec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "needs"
HOST = Host("h", "g", ConnectionSpec("h"))
VENV = Command(("python3", "-m", "venv", "/opt/v"), requires=(NeedVenv("python3"),))
GRUB = Command(("update-grub",), regenerate=True)
DROPIN = FileWrite("/etc/default/grub.d/90-hosttune.cfg", b"x" * 10)


def recorded(name: str) -> HostNeeds:
    requests = [tuple(r.split(":", 1)) for r in (FIXTURES / f"{name}-requests.txt").read_text().split()]
    return parse_needs((FIXTURES / f"{name}.txt").read_text(), requests)


# -- declarations --------------------------------------------------------------------------------


@pytest.mark.parametrize("op, needs", [
    (FileWrite("/etc/x.conf", b"abc"), (NeedSpace("/etc/x.conf", 3),)),
    (Symlink("/usr/local/cuda", "/usr/local/cuda-12.4"), (NeedDir("/usr/local"),)),
    (Service("irqbalance.service", enabled=False), (NeedCommand("systemctl", on_machine=True),)),
    (Command(("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "x")), (NeedCommand("apt-get"),)),
    (Command(("/opt/v/bin/pip", "install", "w")), ()),  # made by an earlier operation of the same plan
    (VENV, (NeedCommand("python3"), NeedVenv("python3"))),
    (Remove("/x"), ()),
    (KernelWrite(("/proc/sys/vm/swappiness",), "1"), ()),
    (Directory("/usr/local"), ()),
])
def test_each_operation_kind_declares_its_needs(op, needs):
    assert op.needs == needs


def test_writes_and_directories_provide_their_parents():
    assert FileWrite("/a/b/c").provides == (NeedDir("/a/b"), NeedDir("/a"), NeedDir("/"))
    assert Directory("/usr/local").provides == (NeedDir("/usr/local"), NeedDir("/usr"), NeedDir("/"))
    assert parents("/") == () and program(("env", "A=1")) == "env"


def test_requests_ask_in_the_root_for_image_programs_and_on_the_machine_for_systemctl():
    ops = (Symlink("/usr/local/cuda", "/usr/local/cuda-12.4"), Service("x.service", enabled=True), DROPIN, GRUB)
    assert requests_for([ops], None, offline=True) == [
        ("dir", "/usr/local"), ("mcmd", "systemctl"), ("space", DROPIN.path), ("cmd", "update-grub")]
    assert ("mcmd", "update-grub") in requests_for([ops], None, offline=False)
    assert requests_for([(VENV,)], Apt(), False) == [("mcmd", "python3"), ("venv", "python3"), ("pkg", "python3-venv")]
    assert ("pkg", "python3.11-pip-wheel") in requests_for([(Command(("x",), requires=(NeedVenv("python3.11"),)),)], Dnf(), False)


# -- the recorded answers -------------------------------------------------------------------------


def test_parse_needs_recorded_on_a_debian_host():
    needs = recorded("host")
    assert needs.machine_commands == {"systemctl": "/usr/bin/systemctl", "no-such-program": None}
    assert needs.venvs == {"python3": "", "python9.9": "python9.9 is not installed"}
    assert needs.candidates == {"python3-venv": "3.11.2-1+b1", "no-such-package": None}
    assert needs.dirs == {"/usr/local": "dir", "/nonexistent/x": "absent", "/etc/hostname": "other"}
    assert needs.space["/opt/hosttune/wheels/x.whl"] == (70503968 * 1024, "/")
    assert needs.ports == {39517: ("?",), 39518: ()}


def test_parse_needs_recorded_on_a_minimal_image():
    needs = recorded("root")
    assert needs.commands == {"update-grub": None, "sh": None}
    assert needs.dirs == {"/usr/local": "absent", "/etc/default": "dir"}


def test_an_unanswered_request_is_a_probe_error():
    from hosttune.errors import ProbeError
    with pytest.raises(ProbeError, match="no answer about dir"):
        parse_needs("@@n:0\n@@n-end:0\n", [("cmd", "sh"), ("dir", "/x")])


def test_parse_needs_recorded_on_a_host_without_python3_venv_serving_a_release():
    needs = recorded("container")
    assert needs.venvs == {"python3": "ModuleNotFoundError: No module named 'ensurepip'"}
    assert needs.candidates == {"python3-venv": "3.11.2-1+b1"}
    assert needs.ports == {38517: ("hosttune-serve.service",), 38518: ()}
    assert needs.machine_commands == {"systemd-analyze": "/usr/bin/systemd-analyze"}


def test_under_a_root_pythons_and_packages_are_the_images_not_the_machines(tmp_path):
    """apply --root makes a venv and installs its package inside the image (chroot): an image without python3 or
    apt has neither, whatever the machine that reaches it has."""
    from hosttune.probes.needs import read_needs
    from hosttune.transport.local import LocalTransport

    (tmp_path / "etc").mkdir()
    (tmp_path / "usr/bin/python3").mkdir(parents=True)  # a directory is no program
    requests = [("venv", "python3"), ("venv", "/usr/bin/python3"), ("pkg", "bash"), ("pkg", "python3-venv")]
    needs = read_needs(LocalTransport(), requests, root=str(tmp_path), manager="apt")
    assert needs.venvs == {"python3": "python3 is not installed", "/usr/bin/python3": "/usr/bin/python3 is not installed"}
    assert needs.candidates == {"bash": None, "python3-venv": None}
    assert check([(VENV,)], needs, Apt(), offline=True).error.endswith(
        "; python3 cannot make a virtualenv (python3 is not installed) and python3-venv is not in the image's package "
        "lists: install python3-venv (or refresh the lists)")


# -- judging: facts + operations → plan errors and added operations ---------------------------------


def test_a_missing_parent_directory_is_made_first_by_a_planned_step():
    link = Symlink("/usr/local/cuda", "/usr/local/cuda-12.4")
    checked = check([(link,)], HostNeeds(dirs={"/usr/local": "absent"}), offline=True)
    assert checked.groups == ((Directory("/usr/local"), link),) and checked.error is None
    assert "added: make directory /usr/local (missing)" in checked.lines


def test_an_earlier_write_meets_a_later_operations_directory():
    write, link = FileWrite("/opt/x/file", b"1"), Symlink("/opt/x/link", "file")
    checked = check([(write,), (link,)], HostNeeds(space={"/opt/x/file": (10, "/")}))
    assert checked.groups == ((write,), (link,)) and checked.error is None


def test_a_path_in_the_way_of_a_directory_is_an_error():
    checked = check([(Symlink("/usr/local/cuda", "x"),)], HostNeeds(dirs={"/usr/local": "other"}))
    assert checked.error == "/usr/local is not a directory; move it away first"


def test_update_grub_missing_from_an_image_is_left_to_the_image_and_said_so():
    needs = HostNeeds(commands={"update-grub": None}, space={DROPIN.path: (10**9, "/")})
    checked = check([(DROPIN, GRUB)], needs, offline=True)
    assert checked.groups == ((DROPIN,),) and checked.error is None
    (note,) = checked.notes[0]
    assert "the image has no update-grub" in note and "the image's own update-grub reads them when it runs" in note


def test_update_grub_missing_on_a_running_host_is_a_plan_time_error():
    checked = check([(DROPIN, GRUB)], HostNeeds(machine_commands={"update-grub": None}, space={DROPIN.path: (10**9, "/")}))
    assert checked.error == "update-grub not found on the host, needed for: $ update-grub"


def test_a_python_without_venv_gets_the_package_installed_first_where_apt_has_it():
    upload = FileWrite("/opt/hosttune/wheels/w.whl", b"w")
    needs = HostNeeds(machine_commands={"python3": "/usr/bin/python3"}, venvs={"python3": "No module named 'ensurepip'"},
                      candidates={"python3-venv": "3.11.2-1+b1"})
    checked = check([(upload, VENV)], needs, Apt())
    refresh, install, *rest = checked.groups[0]
    assert refresh.argv == ("apt-get", "update", "-q") and install.argv[-1] == "python3-venv"
    assert rest == [upload, VENV] and checked.error is None  # before the upload: nothing is sent for a host that cannot install it
    assert any(line.startswith("added: install python3-venv") for line in checked.lines)


@pytest.mark.parametrize("flavour, candidates, error", [
    (Apt(), {"python3-venv": None}, "python3 cannot make a virtualenv (no ensurepip) and python3-venv is not in the host's package lists"),
    (None, {}, "python3 cannot make a virtualenv (no ensurepip) and the host has no apt or dnf"),
])
def test_a_python_without_venv_that_cannot_be_installed_is_a_plan_time_error(flavour, candidates, error):
    needs = HostNeeds(machine_commands={"python3": "/usr/bin/python3"}, venvs={"python3": "no ensurepip"}, candidates=candidates)
    assert check([(VENV,)], needs, flavour).error.startswith(error)


def test_free_space_is_summed_per_filesystem():
    a, b = FileWrite("/opt/a", b"x" * 600), FileWrite("/opt/b", b"x" * 600)
    needs = HostNeeds(space={"/opt/a": (1000, "/opt"), "/opt/b": (1000, "/opt")})
    assert check([(a,)], needs).error is None
    assert check([(a, b)], needs).error == "1.2 kB to write on /opt (1.0 kB free): not enough for /opt/a and 1 more; free space there first"


@pytest.mark.parametrize("listeners, error", [
    ((), None),
    (("hosttune-serve.service",), None),
    (("hosttune-engine@1.service", "nginx.service"), None),
    (("apache2.service",), "port 8000 is in use by apache2.service; choose another port or stop it"),
    (("?",), "port 8000 is in use by a process hosttune cannot name; choose another port or stop it"),
])
def test_a_port_is_free_or_already_ours(listeners, error):
    start = Command(("systemctl", "restart", "x"), requires=(NeedPort(8000, ("hosttune-serve.service", "hosttune-engine@", "nginx.service")),))
    needs = HostNeeds(machine_commands={"systemctl": "/bin/systemctl"}, ports={8000: listeners})
    assert check([(start,)], needs).error == error


def test_a_model_the_engine_cannot_load_is_a_plan_time_error():
    start = Command(("systemctl", "restart", "x"), requires=(NeedModel("/models", "custom"),))
    needs = HostNeeds(machine_commands={"systemctl": "/bin/systemctl"}, models={"/models": "has no readable config.json"})
    assert check([(start,)], needs).error == "the model folder /models has no readable config.json"


def test_an_unmet_need_makes_the_host_plan_an_error_and_sends_nothing():
    plan = HostPlan(HOST, "p", steps=(Step(("cpu.cstates",), "grub", (DROPIN, GRUB)),))
    planned = with_needs(plan, HostNeeds(machine_commands={"update-grub": None}, space={DROPIN.path: (10**9, "/")}))
    assert planned.error == "nothing sent: update-grub not found on the host, needed for: $ update-grub"
    image = with_needs(HostPlan(HOST, "p", steps=plan.steps, root="/img"),
                       HostNeeds(commands={"update-grub": None}, space={DROPIN.path: (10**9, "/")}))
    assert image.error is None and image.steps[0].ops == (DROPIN,) and "update-grub" in image.steps[0].notes[-1]


def test_apply_stops_a_host_at_plan_time_with_one_line_and_sends_nothing(tmp_path):
    from typer.testing import CliRunner

    from hosttune.cli import app

    image = tmp_path / "img"
    (image / "etc/default").mkdir(parents=True)
    (image / "etc/default/grub").write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    (image / "usr").mkdir()
    (image / "usr/local").write_text("a file where a directory must be\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text('hosts:\n  localhost:\n    transport: local\n    rcu_nocbs: "2-31"\n    pins: {cuda: "12.4"}\n')
    before = sorted(str(p.relative_to(image)) for p in image.rglob("*"))
    result = CliRunner().invoke(app, ["apply", "-i", str(inv), "--root", str(image), "--yes"])
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert lines[1] == "  nothing sent: /usr/local is not a directory; move it away first"
    assert "    fails: /usr/local is not a directory; move it away first" in lines
    assert lines[-1] == "plan: 0 changes on 0 of 1 host"
    assert sorted(str(p.relative_to(image)) for p in image.rglob("*")) == before  # not even a journal


def test_a_file_where_a_write_or_link_must_make_a_directory_stops_the_host_at_plan_time(tmp_path):
    """mkdir -p cannot make /etc/sysctl.d/ or /usr/local/ through a file: the plan says so instead of a run that
    fails half-way."""
    from typer.testing import CliRunner

    from hosttune.cli import app

    image = tmp_path / "img"
    (image / "etc").mkdir(parents=True)
    (image / "etc/sysctl.d").write_text("a file where a directory must be\n")
    (image / "usr").write_text("a file where a directory must be\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text('hosts:\n  localhost:\n    transport: local\n    pins: {cuda: "12.4"}\n')
    before = sorted(str(p.relative_to(image)) for p in image.rglob("*"))
    result = CliRunner().invoke(app, ["apply", "-i", str(inv), "--root", str(image), "--yes"])
    assert result.exit_code == 2, result.output
    assert "    fails: /etc/sysctl.d is not a directory; move it away first" in result.output.splitlines()
    assert "    fails: /usr is not a directory; move it away first" in result.output.splitlines()
    assert result.output.splitlines()[-1] == "plan: 0 changes on 0 of 1 host"
    assert sorted(str(p.relative_to(image)) for p in image.rglob("*")) == before  # not even a journal


@pytest.mark.parametrize("needs, blocker", [
    (HostNeeds(dirs={"/var/lib/hosttune/runs": "absent"}, blocked={"/var/lib/hosttune/runs": "/var/lib/hosttune"}),
     "/var/lib/hosttune"),
    (HostNeeds(dirs={"/var/lib/hosttune/runs": "other"}), "/var/lib/hosttune/runs"),
])
def test_a_file_where_the_runs_journal_goes_is_a_plan_time_error(needs, blocker):
    plan = HostPlan(HOST, "p", steps=(Step(("numa.topology",), "sysctl", (DROPIN,)),))
    assert ("dir", "/var/lib/hosttune/runs") in journal_requests(plan)
    planned = with_needs(plan, replace(needs, space={DROPIN.path: (10**9, "/")}))
    assert planned.error == (f"nothing sent: {blocker} is not a directory, and the run's journal goes in "
                             f"/var/lib/hosttune/runs; move it away first")
    assert journal_requests(HostPlan(HOST, "p")) == []  # no steps, no run, no journal
    fine = with_needs(plan, HostNeeds(dirs={"/var/lib/hosttune/runs": "absent"}, space={DROPIN.path: (10**9, "/")}))
    assert fine.error is None


def test_an_image_whose_var_lib_hosttune_is_a_file_stops_at_plan_time(tmp_path):
    from typer.testing import CliRunner

    from hosttune.cli import app

    image = tmp_path / "img"
    (image / "etc/default").mkdir(parents=True)
    (image / "etc/default/grub").write_text('GRUB_CMDLINE_LINUX=""\n')
    (image / "var/lib").mkdir(parents=True)
    (image / "var/lib/hosttune").write_text("x\n")
    before = sorted(str(p.relative_to(image)) for p in image.rglob("*"))
    for confirm in ("--dry-run", "--yes"):
        result = CliRunner().invoke(app, ["apply", "--root", str(image), confirm])
        assert result.exit_code == 2, result.output
        assert result.output.splitlines()[1] == ("  nothing sent: /var/lib/hosttune is not a directory, and the run's "
                                                 "journal goes in /var/lib/hosttune/runs; move it away first")
    assert sorted(str(p.relative_to(image)) for p in image.rglob("*")) == before
