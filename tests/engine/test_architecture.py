"""The engine's dependencies point one way, and it never imports the control plane."""

from pathlib import Path

from layering import Layering

PKG = Path(__file__).resolve().parents[2] / "engine" / "hosttune_engine"
# Every package and top-level module of hosttune_engine/ has a place here, bottom first: a module imports
# its own unit and the layers below it, never a layer above, and the units of one layer are independent
# of each other. `__init__` is the package itself (it hands out `Engine` and `LLM`).
LAYERS = Layering(PKG, (
    ("errors",),                              # the typed errors every layer raises
    ("stop_automaton",),                      # Aho-Corasick over stop strings: a state a new character
    ("stop_strings",),                        # a request's stop strings, indexed (what sampling holds)
    ("config", "sampling", "host_copy"),      # engine and request settings; device-to-host copies
    ("kernels",),                             # Triton kernels beside their torch references, tuned configs
    ("plan",),                                # the kernel plan's values: which kernel and config, and why
    ("layers",),                              # nn.Modules that call the kernels
    ("quant",),                               # quantized formats: specs, packing, quantized linears
    ("model",),                               # the plain model, its config, weight loading, tokenizer
    ("parallel", "cache"),                    # tensor parallelism as a transform of a model; the KV pool
    ("planner",),                             # a model's (or a rank's shard's) kernel plan built, and the model
                                              # prepared from it
    ("core",),                                # sequence, block manager, scheduler, model runner, engine, ranks
    ("llm", "checkpoint", "tuner"),           # offline generation; quantized checkpoints written by the engine;
                                              # the kernels a model's plan runs, tuned on this GPU
    ("__init__",),
    ("server",),                              # the OpenAI-compatible HTTP server and its CLI
    ("__main__",),                            # python -m hosttune_engine
))


def test_every_package_and_module_has_a_layer():
    assert not LAYERS.unplaced(), LAYERS.unplaced()


def test_layers_point_one_way():
    faults = LAYERS.all_faults()
    assert not faults, "\n".join(faults)


def test_engine_never_imports_the_control_plane():
    bad = [(path.name, m) for path in LAYERS.modules() for m in LAYERS.imports(path) if m.split(".")[0] == "hosttune"]
    assert not bad, bad


def test_a_back_arrow_is_a_fault(tmp_path):
    """The check itself, on planted modules: the block manager back in the KV cache package importing the
    core's sequence, a unit reaching its peer through a relative import, and a new package without a layer."""
    package = tmp_path / "hosttune_engine"
    manager, peer, newcomer = (package / "cache" / "block_manager.py", package / "parallel" / "bad.py",
                               package / "newcomer" / "table.py")
    for path in (manager, peer, newcomer):
        path.parent.mkdir(parents=True, exist_ok=True)
    manager.write_text("from hosttune_engine.core.sequence import Sequence\n")
    peer.write_text("from ..cache import kv_pool\nfrom . import group\n")
    newcomer.write_text("from hosttune_engine.kernels import tuning\n")
    planted = LAYERS.at(package)
    assert planted.faults(manager) == [
        "hosttune_engine/cache/block_manager.py (cache) imports hosttune_engine.core.sequence (core, a layer above it)"]
    assert planted.faults(peer) == [
        "hosttune_engine/parallel/bad.py (parallel) imports hosttune_engine.cache (cache, a layer beside it)"]
    assert planted.unplaced() == "without a layer: ['newcomer']; not in hosttune_engine/: " + str(
        sorted(set(LAYERS.units) - {"cache", "parallel"}))
    assert planted.faults(newcomer) == ["hosttune_engine/newcomer/table.py is in newcomer, which has no layer"]
