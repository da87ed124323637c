"""Hostile inventory values never reach a shell unquoted: nothing they say is executed."""

import subprocess
import uuid

from typer.testing import CliRunner

from hosttune.cli import app
from hosttune.quoting import join
from hosttune.transport.local import LocalTransport

HOSTILE = [
    'gpu0; touch {marker}', '$(touch {marker})', '`touch {marker}`', "a' ; touch {marker}; '",
    'x" && touch {marker} && "', "with spaces and\ttabs", "new\nline; touch {marker}", "--help",
]


def hostile_values(tmp_path):
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    return marker, [v.format(marker=marker) for v in HOSTILE]


def test_quoting_round_trips_through_a_real_shell(tmp_path):
    marker, values = hostile_values(tmp_path)
    for value in values:
        out = subprocess.run(["sh", "-c", join(["printf", "%s", value])], capture_output=True, text=True, check=True)
        assert out.stdout == value
    assert not marker.exists()


def test_local_transport_passes_argv_verbatim(tmp_path):
    marker, values = hostile_values(tmp_path)
    result = LocalTransport().read(["printf", "%s\\n", *values])
    assert result.ok and result.stdout.splitlines()[:1] == [values[0]]
    assert not marker.exists()


def test_check_with_hostile_inventory_executes_nothing(tmp_path):
    marker, values = hostile_values(tmp_path)
    inv = tmp_path / "inv.yaml"
    for v in (v.replace("\n", " ").replace("\t", " ") for v in values):  # one local host per file: it is one machine
        inv.write_text(f"hosts:\n  h:\n    transport: local\n    ssh: {{user: {v!r}, key: {v!r}, known_hosts: {v!r}}}\n")
        result = CliRunner().invoke(app, ["check", "-i", str(inv), "--format", "json"])
        assert result.exit_code in (0, 1), result.output
    assert not marker.exists()


def test_hostile_pins_are_refused_when_the_inventory_is_read(tmp_path):
    marker, values = hostile_values(tmp_path)
    inv = tmp_path / "inv.yaml"
    for kind, value in ((k, v.replace("\n", " ")) for v in values for k in ("driver", "cuda", "python")):
        inv.write_text(f"defaults:\n  pins: {{{kind}: {value!r}}}\nhosts:\n  h:\n    transport: local\n")
        result = CliRunner().invoke(app, ["check", "-i", str(inv)])
        assert result.exit_code == 2 and f"{inv}:2: defaults.pins.{kind}: must be " in result.output, result.output
    assert not marker.exists()


def test_hostile_addresses_are_refused_when_the_inventory_is_read(tmp_path):
    marker, values = hostile_values(tmp_path)
    for value in values:
        inv = tmp_path / "inv.yaml"
        inv.write_text(f"hosts:\n  h:\n    address: {value.replace(chr(10), ' ')!r}\n")
        result = CliRunner().invoke(app, ["check", "-i", str(inv)])
        assert result.exit_code == 2 and f"{inv}:3: hosts.h.address:" in result.output, result.output
    assert not marker.exists()
