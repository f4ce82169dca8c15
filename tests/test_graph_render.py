"""Pictures of graphs with Graphviz: ``Graph.to_dot``, ``Graph.render`` and ``forge info --graph``."""

from __future__ import annotations

import os
import re
import shutil
import xml.etree.ElementTree as ET

import numpy as np
import onnx
import pytest
from test_cli import forge_cli
from model_factory import conv_bn_net, light_model_path

import forge
from forge_core.errors import ForgeError
from forge_core.graph.render import format_bytes

needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz's dot is not installed (./scripts/setup installs it)")

SVG = "{http://www.w3.org/2000/svg}"
SIZE = re.compile(r"^\d+ B$|^\d+\.\d (KiB|MiB|GiB|TiB)$")


def svg_nodes(path) -> list[list[str]]:
    """The lines of text of each drawn node (``<g class="node">``) of an SVG file."""
    root = ET.parse(path).getroot()
    return [[t.text or "" for t in g.iter(f"{SVG}text")]
            for g in root.iter(f"{SVG}g") if g.get("class") == "node"]


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("render") / "conv.onnx"
    onnx.save(conv_bn_net(seed=3), str(path))
    return path


@needs_dot
@pytest.mark.parametrize("name", ["squeezenet", "resnet50", "inception_v1", "shufflenet"])
def test_light_model_is_drawn_with_operators_shapes_and_weight_sizes(name, tmp_path):
    ir = forge.from_onnx(light_model_path(name))
    graph = ir.main
    written = graph.render(tmp_path / "m.svg")
    assert written == str(tmp_path / "m.svg")
    assert os.listdir(tmp_path) == ["m.svg"]  # the staging directory is gone

    nodes = svg_nodes(written)
    assert len(nodes) == len(graph)
    lines = {line for node in nodes for line in node}
    missing = [op for op in ir.operators if op not in lines]
    assert not missing, f"operators not drawn: {missing}"

    # Each constant is drawn with its size in bytes; the first weight's is the size of its data.
    constants = graph.select(type="constant")
    assert constants
    sizes = [line for node in nodes for line in node if SIZE.match(line)]
    assert len(sizes) == len(constants)
    assert format_bytes(constants[0].data.nbytes) in sizes
    assert any(s.endswith("KiB") or s.endswith("MiB") for s in sizes)

    # Each call shows its output's shape and dtype; the input is drawn with its name.
    conv = graph.select(op="nn.conv2d")[0]
    assert f"{'x'.join(map(str, conv.shape))} {conv.dtype}" in lines
    assert graph.inputs[0].name in lines


def test_to_dot_has_one_node_per_graph_node_and_one_edge_per_operand(small_model):
    graph = forge.from_onnx(small_model).main
    dot = graph.to_dot()
    assert dot.startswith("digraph main {")
    assert "rankdir=TB" in dot
    ids = re.findall(r"^\t(n\d+) \[", dot, flags=re.M)
    assert ids == [f"n{i}" for i in range(len(graph))]
    edges = re.findall(r"^\t(n\d+) -> (n\d+)", dot, flags=re.M)
    index = {node.name: i for i, node in enumerate(graph)}
    expected = [(f"n{index[p.name]}", f"n{index[node.name]}") for node in graph for p in node.pred]
    assert edges == expected


@needs_dot
def test_names_with_dot_and_html_syntax_are_escaped(small_model, tmp_path):
    graph = forge.from_onnx(small_model).main
    relu = graph.select(op="nn.relu")[0]
    weird = 'a"b\\c<d>&e/f:g.h'
    relu.set_name(weird)
    long_name = "/features/features.12/block/block.3/Conv_output_0/" + "y" * 40
    graph.select(op="nn.conv2d")[1].set_name(long_name)

    nodes = svg_nodes(graph.render(tmp_path / "m.svg"))
    assert len(nodes) == len(graph)
    lines = {line for node in nodes for line in node}
    assert weird in lines
    shortened = sorted(line for line in lines if "…" in line)  # the conv, and its weight named after it
    assert len(shortened) == 2 and all(len(line) == 32 and line.startswith("/feat") for line in shortened)
    assert shortened[1].endswith("yyyy") and shortened[0].endswith("yyy.weight")
    root = ET.parse(tmp_path / "m.svg").getroot()
    tooltips = [a.get("{http://www.w3.org/1999/xlink}title") or "" for a in root.iter(f"{SVG}a")]
    assert any(t.startswith(f"{long_name} (nn.conv2d)") for t in tooltips)  # the whole name is the tooltip


@needs_dot
def test_render_formats_and_atomic_replacement(small_model, tmp_path):
    graph = forge.from_onnx(small_model).main
    png, pdf = tmp_path / "g.png", tmp_path / "sub" / "g.pdf"
    png.write_bytes(b"old picture")
    assert graph.render(png) == str(png)
    assert png.read_bytes().startswith(b"\x89PNG")
    assert graph.render(str(pdf)) == str(pdf)  # a str path; the missing folder is created
    assert pdf.read_bytes().startswith(b"%PDF")
    assert graph.render(tmp_path / "g.out", format="svg") == str(tmp_path / "g.out")
    assert (tmp_path / "g.out").read_text().lstrip().startswith("<?xml")
    assert sorted(os.listdir(tmp_path)) == ["g.out", "g.png", "sub"]
    with pytest.raises(ForgeError, match="suffix"):
        graph.render(tmp_path / "g")
    with pytest.raises(ForgeError, match="cannot write 'docx'"):
        graph.render(tmp_path / "g.docx")


def test_missing_dot_says_to_install_graphviz(small_model, tmp_path, monkeypatch):
    graph = forge.from_onnx(small_model).main
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(ForgeError, match=r"apt-get install graphviz") as info:
        graph.render(tmp_path / "m.svg")
    assert "Graphviz" in str(info.value) and "scripts/setup" in str(info.value)
    assert not (tmp_path / "m.svg").exists()
    assert graph.to_dot().startswith("digraph")  # the DOT source needs no Graphviz


@needs_dot
def test_cli_info_draws_the_graph(tmp_path):
    model = light_model_path("squeezenet")
    svg = tmp_path / "model.svg"
    done = forge_cli("info", model, "--graph", svg)
    assert "data_0: (1, 3, 224, 224) float32" in done.stdout  # the usual summary first
    ir = forge.from_onnx(model)
    assert f"graph: {len(ir.main)} nodes drawn to {svg}" in done.stdout
    nodes = svg_nodes(svg)
    assert len(nodes) == len(ir.main)
    lines = {line for node in nodes for line in node}
    assert set(ir.operators) <= lines


def test_cli_info_graph_without_dot_fails_in_one_line(small_model, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    done = forge_cli("info", small_model, "--graph", tmp_path / "m.svg", env={"PATH": str(empty)}, check=False)
    assert done.returncode == 1
    assert "forge: error:" in done.stderr and "apt-get install graphviz" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "m.svg").exists()


def test_constant_size_is_in_bytes_of_its_dtype(small_model):
    graph = forge.from_onnx(small_model).main
    weight = graph.select(op="nn.conv2d")[0].pred[1]
    assert weight.type == "constant"
    expected = format_bytes(int(np.prod(weight.shape)) * 4)
    assert expected == format_bytes(weight.data.nbytes)
    assert expected in graph.to_dot()
    assert format_bytes(576) == "576 B" and format_bytes(int(2.3 * 2**20)) == "2.3 MiB"
