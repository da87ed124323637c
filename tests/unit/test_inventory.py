"""Inventory and profile loading: merging, --limit, and errors that name file, line and field."""

import textwrap

import pytest

from hosttune.errors import InventoryError, ProfileError
from hosttune.config.inventory import load_inventory
from hosttune.config.profile import load_profile, profile_for

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def write(tmp_path, text):
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_example_inventory_loads_and_merges():
    inv = load_inventory(ROOT / "inventories" / "example.yaml")
    by_name = {h.name: h for h in inv.hosts}
    a2 = by_name["gpu-a100-02"]
    assert a2.connection.port == 2222 and a2.connection.user == "deploy" and a2.connection.become
    assert a2.pins.cuda == "12.4" and a2.irq_cores == "0-3" and a2.group == "a100"
    h = by_name["gpu-h200-01"]
    assert h.pins.driver == "580.159.04" and h.profile == "inference-throughput"
    assert by_name["localhost"].connection.transport == "local"
    profile = profile_for(h)
    assert profile.driver.version == "580.159.04" and profile.memory.thp == "madvise"
    assert profile.irq.gpu_affinity == "numa-local"  # from inference-throughput, not overridden


def test_limit_by_group_and_glob():
    inv = load_inventory(ROOT / "inventories" / "example.yaml")
    assert [h.name for h in inv.limit("a100").hosts] == ["gpu-a100-01", "gpu-a100-02"]
    assert [h.name for h in inv.limit("*h200*,localhost").hosts] == ["gpu-h200-01", "localhost"]
    with pytest.raises(InventoryError, match="matches no host"):
        inv.limit("nothing")
    with pytest.raises(InventoryError, match=r"^--limit 'localhost,gpu-a100-1\*': 'gpu-a100-1\*' matches no host or "
                                             r"group in .*example.yaml; correct it or leave it out$"):
        inv.limit("localhost,gpu-a100-1*")  # one mistyped name must not leave its hosts out without a word


@pytest.mark.parametrize("text, where", [
    ("""\
     groups:
       g:
         hosts:
           a:
             adress: 10.0.0.1
     """, r"inv.yaml:5: groups.g.hosts.a.adress: unknown key"),
    ("""\
     hosts:
       a:
         ssh:
           port: 99999
     """, r"inv.yaml:4: hosts.a.ssh.port: must be a port number"),
    ("""\
     defaults:
       irq_cores: "0-3; touch /tmp/x"
     hosts:
       a: {}
     """, r"inv.yaml:2: defaults.irq_cores: not a CPU list"),
    ("""\
     hosts:
       a:
         ssh: {become: "yes"}
     """, r"inv.yaml:3: hosts.a.ssh.become: must be true or false"),
    ("""\
     groups:
       g:
         hosts:
           a: {}
     hosts:
       a: {}
     """, r"host 'a' is already defined"),
    ("hosts: [a, b]\n", r"inv.yaml:1: hosts: must be a mapping"),
    ("hosts:\n  a:\n    gpus: 0-z\n", r"^.*inv.yaml:3: hosts.a.gpus: must be all or GPU indices such as 0-3 or 0,2 \(got '0-z'\)$"),
    ("hosts:\n  a:\n    rcu_nocbs: '2-31,'\n", r"^.*inv.yaml:3: hosts.a.rcu_nocbs: CPU list '2-31,' has an empty entry; "
                                           r"list CPUs such as 0-3,8 \(got '2-31,'\)$"),  # as --limit's and --arch's
    ("hosts:\n  a: {\n", r"inv.yaml:\d+: invalid YAML"),
    ("groups: {}\n", r"no hosts defined"),
])
def test_bad_inventory_names_file_line_field(tmp_path, text, where):
    with pytest.raises(InventoryError, match=where):
        load_inventory(write(tmp_path, text))


def test_relative_key_paths_are_relative_to_the_inventory(tmp_path):
    inv = load_inventory(write(tmp_path, """\
        hosts:
          a: {ssh: {key: keys/id, known_hosts: /etc/kh}}
          b: {ssh: {key: ~/.ssh/id}}
        """))
    a, b = inv.hosts
    assert a.connection.key == str(tmp_path / "keys" / "id") and a.connection.known_hosts == "/etc/kh"
    assert b.connection.key == "~/.ssh/id"


def test_missing_inventory_file(tmp_path):
    with pytest.raises(InventoryError, match="cannot read"):
        load_inventory(tmp_path / "nope.yaml")


def test_profile_extends_and_unknown_settings(tmp_path):
    latency, throughput = load_profile("inference-latency"), load_profile("inference-throughput")
    assert latency.cpu.max_cstate == 1 and throughput.cpu.max_cstate is None
    assert throughput.driver == latency.driver  # inherited
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nextends: inference-latency\nsettings:\n  cpu:\n    governer: performance\n")
    with pytest.raises(ProfileError, match=r"bad.yaml:5: settings.cpu.governer: unknown setting"):
        load_profile(str(bad))
    loop = tmp_path / "loop.yaml"
    loop.write_text(f"name: loop\nextends: {loop}\nsettings: {{}}\n")
    with pytest.raises(ProfileError, match="cycle"):
        load_profile(str(loop))
    with pytest.raises(ProfileError, match="known profiles: inference-latency, inference-latency-monitored, inference-throughput"):
        load_profile("nope")


def test_a_playbook_path_is_relative_to_the_inventory_and_extends_to_the_playbook(tmp_path, monkeypatch):
    """Like ssh.key: the same inventory gives the same profiles from any working directory."""
    (tmp_path / "fleet" / "books").mkdir(parents=True)
    (tmp_path / "fleet" / "books" / "base.yaml").write_text("name: base\nsettings:\n  memory: {thp: never}\n")
    (tmp_path / "fleet" / "books" / "site.yaml").write_text("name: site\nextends: base.yaml\nsettings: {}\n")
    inv = load_inventory(write(tmp_path / "fleet", "hosts:\n  a: {profile: books/site.yaml}\n"))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "books").mkdir()
    (tmp_path / "elsewhere" / "books" / "site.yaml").write_text("name: decoy\nsettings:\n  memory: {thp: always}\n")
    for cwd in (tmp_path, tmp_path / "elsewhere"):
        monkeypatch.chdir(cwd)
        assert profile_for(inv.hosts[0]).memory.thp == "never"


@pytest.mark.parametrize("extends, message", [
    ("5", r"book.yaml:2: extends: must be a profile name or a playbook path \(got 5\)"),
    ("nope", r"book.yaml:2: extends: unknown profile 'nope'; known profiles: inference-latency"),
    ("gone.yaml", r"book.yaml:2: extends: unknown profile 'gone.yaml': no such file"),
])
def test_a_bad_extends_is_an_error_at_its_line(tmp_path, extends, message):
    book = tmp_path / "book.yaml"
    book.write_text(f"name: book\nextends: {extends}\nsettings: {{}}\n")
    with pytest.raises(ProfileError, match=message):
        load_profile(str(book))


@pytest.mark.parametrize("text, message", [
    ("pins: {python: 3.10}", r"inv.yaml:3: hosts.a.pins.python: YAML read it as a number, which drops trailing zeros"),
    ("pins: {cuda: 12.10}", r"inv.yaml:3: hosts.a.pins.cuda: YAML read it as a number"),
    ("tune: {tools: {python: 3.10}}", r"inv.yaml:3: tune.tools.python: YAML read 3.1 as a number"),
    ("tune: {cuda: {toolkit: 12.4}}", r"inv.yaml:3: tune.cuda.toolkit: YAML read 12.4 as a number"),
    ("tune: {nvme: {apst: 'no'}}", r"inv.yaml:3: tune.nvme.apst: must be true, false or null \(got 'no'\)"),
    ("tune: {numa: {balancing: 0}}", r"inv.yaml:3: tune.numa.balancing: must be true, false or null \(got 0\)"),
    ("tune: {driver: {held: maybe}}", r"tune.driver.held: must be true, false or null"),
    ("tune: {gpu: {persistence: 1}}", r"tune.gpu.persistence: must be true, false or null"),
    ("tune: {gpu: {persistence: false}}", r"tune.gpu.persistence: false is not a state hosttune sets .* write null"),
    ("tune: {health: {allreduce_floor_gbps: .nan}}", r"tune.health.allreduce_floor_gbps: must be a positive number"),
])
def test_versions_that_yaml_read_as_numbers_and_switches_that_are_not_booleans_are_errors(tmp_path, text, message):
    """3.10 unquoted is the float 3.1: pinning it would plan python3.1. "no" is a true string."""
    with pytest.raises((InventoryError, ProfileError), match=message):
        inv = load_inventory(write(tmp_path, f"hosts:\n  a:\n    {text}\n"))
        profile_for(inv.hosts[0])
    whole = load_inventory(write(tmp_path, "hosts:\n  a:\n    pins: {driver: 535, python: '3.10'}\n"))
    assert profile_for(whole.hosts[0]).driver.version == "535" and profile_for(whole.hosts[0]).tools.python == "3.10"


def test_two_hosts_on_one_ssh_address_and_port_are_an_error_naming_both(tmp_path):
    """Else check reports one machine twice and apply changes it twice at once."""
    path = write(tmp_path, """\
        groups:
          g:
            hosts:
              a: {address: 10.0.0.1}
        hosts:
          b: {address: 10.0.0.1}
        """)
    with pytest.raises(InventoryError, match=r"inv.yaml:6: host 'b' is 10.0.0.1 port 22, as host 'a' at .*inv.yaml:4 is"):
        load_inventory(path)
    assert len(load_inventory(write(tmp_path, "hosts:\n  a: {address: 10.0.0.1}\n  b: {address: 10.0.0.1, ssh: {port: 2222}}\n"
                                              "  c: {transport: local}\n")).hosts) == 3


def test_two_local_hosts_are_one_machine_and_an_error_naming_both(tmp_path):
    """Else apply changes this machine twice at once and both runs write one journal."""
    path = write(tmp_path, "groups:\n  g:\n    hosts:\n      localhost: {}\nhosts:\n  b: {transport: local}\n")
    with pytest.raises(InventoryError, match=r"^\S*inv.yaml:6: host 'b' is this machine \(transport: local\), as host "
                                             r"'localhost' at \S*inv.yaml:4 is; name this machine once$"):
        load_inventory(path)


def test_a_mistyped_limit_names_the_nearest_host_or_group(tmp_path):
    inv = load_inventory(write(tmp_path, "groups:\n  a100:\n    hosts:\n      gpu-a100-01: {}\nhosts:\n  other: {}\n"))
    with pytest.raises(InventoryError, match=r"'gpu-a10-01' matches no host .* \(did you mean gpu-a100-01\?\); correct it"):
        inv.limit("other,gpu-a10-01")
    with pytest.raises(InventoryError, match=r"matches no host or group in .*inv.yaml \(did you mean a100\?\)$"):
        inv.limit("a10")
    with pytest.raises(InventoryError, match=r"'zzz' matches no host or group in .*inv.yaml; correct it"):
        inv.limit("other,zzz")


def test_a_limit_naming_a_group_without_hosts_says_the_group_is_empty(tmp_path):
    inv = load_inventory(write(tmp_path, "groups:\n  spare:\n    hosts: {}\n  h100: {}\nhosts:\n  other: {}\n"))
    with pytest.raises(InventoryError, match=r"^--limit 'spare': group 'spare' in .*inv.yaml has no hosts; add hosts "
                                             r"under groups.spare.hosts or limit to another group$"):
        inv.limit("spare")
    with pytest.raises(InventoryError, match=r"^--limit 'other,h100': group 'h100' in .*inv.yaml has no hosts"):
        inv.limit("other,h100")
    with pytest.raises(InventoryError, match=r"matches no host or group"):
        inv.limit("zzz")


def test_a_local_host_with_an_address_is_an_error_not_this_machine_probed_in_its_place(tmp_path):
    path = write(tmp_path, "hosts:\n  gpu-01:\n    transport: local\n    address: 10.0.0.5\n")
    with pytest.raises(InventoryError, match=r"inv.yaml:4: gpu-01.address: 10.0.0.5 is never reached: transport: local"):
        load_inventory(path)


def test_tune_is_validated(tmp_path):
    inv = load_inventory(write(tmp_path, """\
        hosts:
          a:
            tune: {gpu: {pstate: P9000}}
        """))
    with pytest.raises(ProfileError, match="gpu.pstate: must be one of"):
        profile_for(inv.hosts[0])


def test_probe_timeout_comes_from_the_inventory(tmp_path, monkeypatch, fixture_text):
    from hosttune import fleet
    from hosttune.transport.base import CommandResult, Transport

    inv = load_inventory(write(tmp_path, """\
        defaults: {probe_timeout: 240}
        hosts:
          a: {transport: local}
          b: {address: 10.0.0.2, probe_timeout: 7.5}
        """))
    seen = {}

    class Recording(Transport):
        def __init__(self, name):
            self.host_name = name

        def _command(self, argv, stdin, timeout):
            seen[self.host_name] = timeout
            return CommandResult(tuple(argv), 0, fixture_text("h200", "probe-output.txt"), "", 0.0)

    monkeypatch.setattr(fleet, "open_transport", lambda spec, **kw: Recording(spec.host_name))
    for host in inv.hosts:
        fleet.probe(host)
    assert seen == {"a": 240.0, "b": 7.5}


def test_addresses_are_names_or_ips(tmp_path):
    inv = load_inventory(write(tmp_path, """\
        hosts:
          a: {address: "[fe80::1]"}
          b: {address: 10.0.0.7}
          c: {address: gpu-01.xn--bcher-kva.example.}
        """))
    assert [h.connection.address for h in inv.hosts] == ["fe80::1", "10.0.0.7", "gpu-01.xn--bcher-kva.example."]
    for bad in ("-gpu.example", "gpu..example", "gpu_01 .example", "a" * 64 + ".example"):
        with pytest.raises(InventoryError, match=r"inv.yaml:3: hosts.a.address: must be a host name"):
            load_inventory(write(tmp_path, f"hosts:\n  a:\n    address: '{bad}'\n"))


@pytest.mark.parametrize("value, line, field, why", [
    ('"a\\tb"', 6, "groups.g.vars.deploy.env.FOO", r"the value holds a control character \('\\t'\), which a systemd "
     r"unit line cannot carry: give it on one line of printable text$"),
    ('"a\\x1bb"', 6, "groups.g.vars.deploy.env.FOO", r"the value holds a control character \('\\x1b'\)"),
    ("[a, b]", 6, "groups.g.vars.deploy.env.FOO", r"must be a single-line scalar \(got list\)$"),
])
def test_a_deploy_env_value_no_unit_line_can_carry_is_refused_at_its_line(tmp_path, value, line, field, why):
    """deploy --set env.FOO=... refuses a tab; the inventory's deploy.env applies the same rule, naming its line."""
    path = write(tmp_path, f"""\
        groups:
          g:
            vars:
              deploy:
                env:
                  FOO: {value}
            hosts: {{gpu-01: {{address: 10.0.0.5}}}}
        """)
    with pytest.raises(InventoryError, match=rf"^{path}:{line}: {field}: {why}"):
        load_inventory(path)
    assert load_inventory(write(tmp_path, path.read_text().replace(value, '"a b"'))).hosts[0].deploy["env"] == {"FOO": "a b"}


def test_a_deploy_env_that_is_not_a_mapping_is_refused_at_its_line(tmp_path):
    path = write(tmp_path, "hosts:\n  a:\n    address: 10.0.0.1\n    deploy:\n      env: [a, b]\n")
    with pytest.raises(InventoryError, match=rf"^{path}:5: hosts.a.deploy.env: must be a mapping of names to values "
                                             r"\(got \['a', 'b'\]\)$"):
        load_inventory(path)


@pytest.mark.parametrize("text, message", [
    ('pins: {driver: "abc def"}', r"inv.yaml:3: hosts.a.pins.driver: must be a driver branch such as 535 or a release "
                                  r"such as 580.159.04 \(got 'abc def'\)"),
    ('pins: {cuda: "12"}', r"inv.yaml:3: hosts.a.pins.cuda: must be a CUDA toolkit version such as '12.4' \(got '12'\)"),
    ("pins: {python: 'python3.11'}", r"inv.yaml:3: hosts.a.pins.python: must be a Python version such as '3.11'"),
    ("pins: {driver: '535; reboot'}", r"inv.yaml:3: hosts.a.pins.driver: must be a driver branch"),
    ("tune: {cuda: {toolkit: '12.4 '}}", r"inv.yaml:3: tune.cuda.toolkit: must be a CUDA toolkit version"),
    ("tune: {driver: {version: ''}}", r"inv.yaml:3: tune.driver.version: must be a driver branch"),
])
def test_a_pin_that_is_no_version_is_an_error_at_its_line(tmp_path, text, message):
    """Left to apply, such a pin names packages no repository has: its plan is blocked at package resolution."""
    with pytest.raises((InventoryError, ProfileError), match=message):
        profile_for(load_inventory(write(tmp_path, f"hosts:\n  a:\n    {text}\n")).hosts[0])


@pytest.mark.parametrize("pins", ["{driver: 535}", "{driver: '535.129'}", "{driver: '580.159.04'}", "{driver: '570.26'}",
                                  "{cuda: '12.4'}", "{cuda: '13.0'}", "{python: '3.10'}", "{python: 3}",
                                  "{python: '3.11.4'}"])
def test_every_pin_form_the_pin_matchers_take_loads(tmp_path, pins):
    profile_for(load_inventory(write(tmp_path, f"hosts:\n  a:\n    pins: {pins}\n")).hosts[0])
