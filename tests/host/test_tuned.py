"""A tuned host, checked from the outside: files, units, packages, kernel values."""
from __future__ import annotations

import re

import pytest

GUEST_IDLE_DRIVERS = {"haltpoll"}  # hosttune.checks.cpu.GUEST_IDLE_DRIVERS, restated
# the driver and CUDA stack apply holds (hosttune.checks.driver.STACK_PACKAGE), restated
STACK = re.compile(r"^(nvidia|libnvidia|cuda|libcuda|kmod-nvidia|datacenter-gpu|libcublas|libcudnn|libnccl)")
# the system's directories ahead of the caller's PATH, as hosttune's probe looks up commands (restated): a venv or
# pyenv shim first on the caller's PATH is not the host's python3
PROBE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def version_matches(version: str, pin: str) -> bool:
    bare = version.split(":", 1)[-1]
    return bare == pin or any(bare.startswith(pin + sep) for sep in "-+~.")  # "." : a branch pin (535)


def skip_in_container(facts: dict, what: str) -> None:
    if facts["container"]:
        pytest.skip(f"{what}: a container shares its host's kernel; only the configuration is checked here")


def as_probed(command: str) -> str:
    """The command with the probe's PATH, so check and verify judge the same programs."""
    return f'PATH="{PROBE_PATH}:$PATH" {command}'


def unit_enabled(host, unit: str) -> bool:
    return host.run(f"systemctl is-enabled {unit}").stdout.strip() in ("enabled", "enabled-runtime", "static", "alias")


# -- services ----------------------------------------------------------------------------


def test_irqbalance(host, want, facts):
    if want["irqbalance"] is None:
        pytest.skip("irqbalance not managed by the profile")
    running = host.run("pgrep -x irqbalance").rc == 0
    assert running == want["irqbalance"], f"irqbalance {'not ' if want['irqbalance'] else ''}running"
    if facts["systemd"] and host.run("systemctl cat irqbalance.service").rc == 0:
        assert host.service("irqbalance").is_enabled == want["irqbalance"], "irqbalance enabled at boot"


def test_persistence_daemon(host, want, facts):
    if not want["persistence"] or not (facts["gpus"] or facts["nvidia_smi"]):
        pytest.skip("no NVIDIA GPU, or persistence not managed")
    assert host.run("pgrep -x nvidia-persiste").rc == 0, "nvidia-persistenced is not running"
    if facts["systemd"]:
        assert host.service("nvidia-persistenced").is_enabled


# -- kernel: sysctl, THP, command line, governor, IRQs -----------------------------------


def test_numa_balancing(host, want, facts):
    if want["numa_balancing"] is None:
        pytest.skip("NUMA balancing not managed by the profile")
    if not host.file("/proc/sys/kernel/numa_balancing").exists:
        pytest.skip("kernel without NUMA balancing")
    if facts["systemd"]:
        config = host.check_output("systemd-analyze cat-config sysctl.d")
        values = re.findall(r"^\s*kernel[./]numa_balancing\s*=\s*(\d+)", config, re.M)
        nodes = len(re.findall(r"^node\d+$", host.run("ls /sys/devices/system/node").stdout, re.M))
        if values:
            assert int(values[-1]) == want["numa_balancing"], "the sysctl.d files set another value at boot"
        else:  # the kernel's default: balancing is off with a single node, on with several
            assert want["numa_balancing"] == int(nodes > 1), "nothing sets kernel.numa_balancing at boot"
    skip_in_container(facts, "kernel.numa_balancing")
    assert host.sysctl("kernel.numa_balancing") == want["numa_balancing"]


def test_transparent_hugepages(host, want, facts):
    if want["thp"] is None or not host.file("/sys/kernel/mm/transparent_hugepage/enabled").exists:
        pytest.skip("THP not managed, or no THP in this kernel")
    defaults = host.file("/etc/default/hosttune-thp")
    if defaults.exists:
        assert f"THP_MODE={want['thp']}" in defaults.content_string.splitlines()
        assert unit_enabled(host, "hosttune-thp.service"), "nothing sets THP at boot"
    skip_in_container(facts, "transparent hugepages")
    active = re.search(r"\[(\w+)\]", host.file("/sys/kernel/mm/transparent_hugepage/enabled").content_string)
    assert active and active.group(1) == want["thp"]


def c_state_limit_matters(host) -> bool:
    """hosttune's rule, restated: with no cpuidle driver, or a paravirtual guest's (haltpoll) whose idle states
    are all shallow (exit latency up to 10 µs), a C-state limit changes nothing and apply leaves it out."""
    driver = host.run("cat /sys/devices/system/cpu/cpuidle/current_driver").stdout.strip()
    if driver in ("", "none"):
        return False
    states = host.run("cd /sys/devices/system/cpu/cpu0/cpuidle && for s in state*; do echo $(cat $s/disable) $(cat $s/latency); done")
    deep = [line for line in states.stdout.splitlines() if line.split()[:1] == ["0"] and int(line.split()[1]) > 10]
    return driver not in GUEST_IDLE_DRIVERS or bool(deep)


def wanted_params(host, want) -> list[str]:
    params = []
    if want["max_cstate"] is not None and c_state_limit_matters(host):
        params += [f"intel_idle.max_cstate={want['max_cstate']}", f"processor.max_cstate={want['max_cstate']}"]
    if want["rcu_nocbs"] and (want["rcu_nocbs"] != "auto" or auto_nocbs(host)):  # auto on one CPU: nothing to offload
        params.append(f"rcu_nocbs={want['rcu_nocbs']}")
    if want["nvme_apst"] is False and host.run("ls /sys/class/nvme/").stdout.strip():
        params.append("nvme_core.default_ps_max_latency_us=0")
    return params


def last_values(words: list[str]) -> dict[str, str]:
    return {k: v for k, _, v in (w.partition("=") for w in words)}


def missing_params(words: list[str], params: list[str], auto: set[int]) -> list[str]:
    have = last_values(words)
    out = []
    for param in params:
        key, _, value = param.partition("=")
        ok = have.get(key) == value if key != "rcu_nocbs" else key in have and rcu_matches(have[key], value, auto)
        if not ok:
            out.append(param)
    return out


def rcu_matches(have: str, value: str, auto: set[int]) -> bool:
    """auto: every online CPU but each NUMA node's housekeeping cores, as hosttune writes it."""
    return cpus(have) == (auto if value == "auto" else cpus(value))


def auto_nocbs(host) -> set[int]:
    online = online_cpus(host)
    return online - set().union(*(housekeeping(c) for c in node_cpus(host, online).values()))


def online_cpus(host) -> set[int]:
    return cpus(host.file("/sys/devices/system/cpu/online").content_string)


def test_kernel_command_line_configured(host, want):
    params = wanted_params(host, want)
    if not params:
        pytest.skip("no kernel parameters in the profile")
    grub = host.file("/boot/grub/grub.cfg")
    if grub.exists:
        entries = [l.split()[2:] for l in grub.content_string.splitlines() if l.strip().startswith("linux")]
    elif host.exists("grubby"):
        entries = [l.partition("=")[2].strip('"').split() for l in host.check_output("grubby --info=ALL").splitlines() if l.startswith("args=")]
    else:
        pytest.skip("no grub configuration: the kernel command line is set outside this host")
    assert entries, "no boot entries found"
    for words in entries:
        missing = missing_params(words, params, auto_nocbs(host))
        assert not missing, f"boot entry lacks {missing}"


def test_kernel_command_line_active(host, want, facts):
    params = wanted_params(host, want)
    if not params:
        pytest.skip("no kernel parameters in the profile")
    skip_in_container(facts, "/proc/cmdline")
    missing = missing_params(host.file("/proc/cmdline").content_string.split(), params, auto_nocbs(host))
    assert not missing, f"not on the running kernel's command line (reboot pending?): {missing}"


def test_cpu_governor(host, want, facts):
    files = host.run("ls /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").rc == 0
    if want["governor"] is None or not files:
        pytest.skip("governor not managed, or no cpufreq driver")
    govs = host.check_output("cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor").split()
    assert set(govs) == {want["governor"]}
    if facts["systemd"]:
        assert unit_enabled(host, "hosttune-cpu-governor.service"), "nothing sets the governor at boot"


def housekeeping(node_cpus: set[int]) -> set[int]:
    """hosttune's rule, restated: a NUMA node's first cores, one per 16 CPUs, at least two, never all of them."""
    ordered = sorted(node_cpus)
    return set(ordered[:max(1, min(max(2, len(ordered) // 16), len(ordered) - 1))])


def node_cpus(host, online: set[int]) -> dict[int, set[int]]:
    nodes = re.findall(r"^node(\d+)$", host.run("ls /sys/devices/system/node").stdout, re.M)
    found = {int(n): cpus(host.file(f"/sys/devices/system/node/node{n}/cpulist").content_string) & online for n in nodes}
    return {n: c for n, c in found.items() if c} or {0: online}


def irq_cores(host, want: str, dev: str) -> set[int]:
    """The cores a GPU's interrupts belong on: the profile's list, its node's housekeeping cores, or its node."""
    if want not in ("numa-local", "housekeeping"):
        return cpus(want)
    if want == "numa-local":
        return cpus(host.file(f"{dev}/local_cpulist").content_string)
    layout = node_cpus(host, online_cpus(host))
    node = int(host.file(f"{dev}/numa_node").content_string.strip() or -1)
    if node in layout:
        return housekeeping(layout[node])
    return set().union(*(housekeeping(c) for c in layout.values()))


def test_gpu_interrupts(host, want, facts):
    if want["gpu_irq_cores"] is None or not facts["gpus"]:
        pytest.skip("no NVIDIA GPU on the PCI bus, or IRQ affinity not managed")
    for bdf in facts["gpus"]:
        dev = f"/sys/bus/pci/devices/{bdf}"
        cores = irq_cores(host, want["gpu_irq_cores"], dev)
        for irq in host.run(f"ls {dev}/msi_irqs").stdout.split():
            assert cpus(host.file(f"/proc/irq/{irq}/smp_affinity_list").content_string) <= cores, f"IRQ {irq} of {bdf}"
    if facts["systemd"]:
        assert unit_enabled(host, "hosttune-irq-affinity.service"), "nothing pins GPU IRQs at boot"


# -- packages and tools ------------------------------------------------------------------


def installed_stack(host, facts) -> list[str]:
    if facts["apt"]:
        listing = host.check_output("dpkg-query -W -f '${Package} ${db:Status-Abbrev}\\n'")
        return [l.split()[0] for l in listing.splitlines() if STACK.match(l) and l.split()[1].startswith(("ii", "hi"))]
    return [n for n in host.check_output("rpm -qa --qf '%{NAME}\\n'").split() if STACK.match(n)]


def held(host, facts) -> set[str]:
    if facts["apt"]:
        return set(host.check_output("apt-mark showhold").split())
    locks = host.run("dnf versionlock list -q").stdout.split()
    return {re.sub(r"-(\d+:)?\d[^-]*-[^-]+$", "", l) for l in locks}


def test_stack_packages_held(host, want, facts):
    stack = installed_stack(host, facts)
    if not want["driver"]["held"] or not stack:
        pytest.skip("no driver or CUDA packages, or holds not wanted")
    assert not set(stack) - held(host, facts), f"not held: {sorted(set(stack) - held(host, facts))}"


def test_driver_at_pin(host, want, facts):
    pin = want["driver"]["version"]
    if pin is None or not (facts["gpus"] or facts["nvidia_smi"]):
        pytest.skip("no driver pin, or no NVIDIA GPU")
    names = want["driver"]["packages"]["apt" if facts["apt"] else "dnf"]
    for name in names:
        pkg = host.package(name)
        assert pkg.is_installed, f"{name} is not installed"
        assert version_matches(pkg.version, pin), f"{name} is {pkg.version}, not {pin}"
    if want["driver"]["held"]:
        assert not set(names) - held(host, facts), "pinned driver packages not held"


def test_cuda_toolkit(host, want):
    pin = want["cuda"]
    if pin is None:
        pytest.skip("no CUDA pin")
    link = host.file("/usr/local/cuda")
    assert link.is_symlink and link.linked_to == f"/usr/local/cuda-{pin}"
    login = host.run("env -i HOME=/root PATH=/usr/bin:/bin sh -lc 'echo \"$PATH:$LD_LIBRARY_PATH\"; nvcc --version'")
    assert f"release {pin}" in login.stdout, "nvcc on the login PATH is not the pinned toolkit"
    stale = [d for d in re.findall(r"/usr/local/cuda-(\d+\.\d+)", login.stdout.splitlines()[0]) if d != pin]
    assert not stale, f"other toolkits on PATH or LD_LIBRARY_PATH: {stale}"


def test_numactl(host, want):
    if not want["numactl"]:
        pytest.skip("numactl not required")
    assert host.run(as_probed("command -v numactl")).rc == 0, "numactl is not on the probe's PATH"


def test_python(host, want):
    pin = want["python"]
    if pin is None:
        pytest.skip("no Python pin")
    # run it: a name on PATH (a pyenv shim, a dangling alternative) that cannot start is no interpreter
    runs = [host.run(as_probed(f"{name} --version")) for name in (f"python{pin}", "python3")]
    versions = [(r.stdout + r.stderr).strip() for r in runs if r.rc == 0]
    assert any(v.startswith(f"Python {pin}.") for v in versions), f"no working python{pin} (found: {versions or 'none'})"
