"""Tests of the PipeDream/DAPPLE graph.txt reader: parsing quirks, batch sizes and names, errors (the DAG: test_model_graph)."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from graph_files import node, write
from pipeplan.core.errors import ProfileError
from pipeplan.io.graph_txt import batch_size_from_name, parse_graph_txt, profile_name_from_file, read_graph_txt
from pipeplan.presets.resolve import list_profiles, load_profile

SHARED = Path("/work/shared/profiles")
PRESETS = Path(__file__).resolve().parents[1] / "src" / "pipeplan" / "presets" / "profiles"


def test_every_builtin_profile_loads() -> None:
    """All 26 shipped profiles parse into chains with one cut per pair of adjacent layers."""
    names = list_profiles()
    assert len(names) == 26
    for name in names:
        profile = load_profile(name)
        assert profile.num_layers > 1
        assert len(profile.cut_bytes or ()) == profile.num_layers - 1
        assert profile.reference_device == "V100"
        assert profile.batch_size >= 1


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared profiles not on this machine")
def test_every_shared_file_loads_and_matches_the_package_copy() -> None:
    """Each of the 26 files in the shared folder reads from its path and is byte-identical to the shipped copy."""
    files = sorted(SHARED.glob("*/*.txt"))
    assert len(files) == 26
    for path in files:
        read_graph_txt(path)
        assert filecmp.cmp(path, PRESETS / path.parent.name / path.name, shallow=False), path


# Expected totals were computed from the files by an independent method, awk over node lines:
#   grep -- ' -- .* -- ' FILE | awk -F' -- ' '{n++; match($3,/forward_compute_time=[0-9.]+/);
#     fw=substr($3,RSTART+21,RLENGTH-21); match($3,/parameter_size=[0-9.]+/); p+=substr($3,RSTART+15,RLENGTH-15);
#     if ($2 !~ /^Input[0-9]*$/) f+=fw} END {print n, f, p}'


@pytest.mark.parametrize(
    ("name", "layers", "fwd_ms", "param_bytes"),
    [
        ("pipedream/vgg16", 41, 233.902, 553430176),  # Input's 17.972 ms of data loading excluded
        ("pipedream/alexnet", 23, 44.801, 244403360),  # Input's 635.902 ms excluded
        ("dapple/amoeba-36", 44, 48.670, 3731135780),  # multi-output activation lists
    ],
)
def test_totals_match_hand_computed_values(name: str, layers: int, fwd_ms: float, param_bytes: int) -> None:
    """Layer count, forward ms without Input nodes and parameter bytes equal the awk totals of the file."""
    profile = load_profile(name)
    assert profile.num_layers == layers
    assert profile.total_fwd_ms == pytest.approx(fwd_ms, abs=1e-9)
    assert profile.total_param_bytes == param_bytes


def test_multi_output_activation_is_the_sum() -> None:
    """`activation_size=[602112; 4004]` gives 606116 bytes; the file's total over all outputs is kept (awk: 295129416)."""
    profile = load_profile("dapple/amoeba-36")
    assert profile.layers[0].name == "node1:Input"
    assert profile.layers[0].activation_bytes == 602112 + 4004
    assert sum(layer.activation_bytes for layer in profile.layers) == 295129416


def test_input_nodes_cost_zero_ms() -> None:
    """An Input node's data-loading time (635.902 ms in alexnet) becomes 0 ms forward and backward."""
    layer = load_profile("pipedream/alexnet").layers[0]
    assert layer.name == "node1:Input"
    assert (layer.fwd_ms, layer.bwd_ms) == (0.0, 0.0)


def test_numbered_input_nodes_cost_zero_but_similar_names_do_not(tmp_path: Path) -> None:
    """`Input0` is a data source; `input_ids` (a real bert layer) keeps its time."""
    path = write(
        tmp_path,
        "m-pbs-4.txt",
        [node("node1", "Input0", fwd=5), node("node2", "input_ids", fwd=0.5), node("node3", "head", fwd=3), "\tnode1 -- node3"],
    )
    profile = read_graph_txt(path)
    assert [layer.fwd_ms for layer in profile.layers] == [0.0, 0.5, 3.0]


def test_any_leading_whitespace_on_edge_lines(tmp_path: Path) -> None:
    """Edges indented by a tab, two spaces, or a space and a tab all count (bert-24 and amoeba-36 do this)."""
    lines = [node("node3", "c"), node("node1", "a"), node("node2", "b")]
    lines += ["\tnode1 -- node2", "  node2 -- node3", " \tnode1 -- node3"]
    profile = read_graph_txt(write(tmp_path, "w-pbs-1.txt", lines))
    assert [layer.name for layer in profile.layers] == ["node1:a", "node2:b", "node3:c"]
    # a feeds b and c: after a only a crosses; after b, b and a (still read by c)
    assert profile.cut_bytes == (10.0, 20.0)


def test_batch_size_from_the_file_name_or_the_argument(tmp_path: Path) -> None:
    """`-pbs-N` in the name wins; without it the argument is used; both must agree when both are given."""
    lines = [node("n1", "a"), node("n2", "b"), "\tn1 -- n2"]
    assert read_graph_txt(write(tmp_path, "m-pbs-32-simplified.txt", lines)).batch_size == 32
    plain = write(tmp_path, "graph.txt", lines)
    assert read_graph_txt(plain, profile_batch_size=16).batch_size == 16
    with pytest.raises(ProfileError, match=r"graph\.txt: batch size unknown.*--profile-batch-size"):
        read_graph_txt(plain)
    with pytest.raises(ProfileError, match=r"says batch size 32 .*given is 8"):
        read_graph_txt(tmp_path / "m-pbs-32-simplified.txt", profile_batch_size=8)
    with pytest.raises(ProfileError, match=r"integer >= 1, got 0"):
        read_graph_txt(plain, profile_batch_size=0)


def test_names_drop_the_batch_suffix_but_keep_other_suffixes() -> None:
    """`gnmt-32-pbs-64-simplified.txt` is named gnmt-32-simplified and measured with 64 samples."""
    assert profile_name_from_file("/x/gnmt-32-pbs-64-simplified.txt") == "gnmt-32-simplified"
    assert batch_size_from_name("/x/gnmt-32-pbs-64-simplified.txt") == 64
    assert batch_size_from_name("graph.txt") is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "n2 -- b -- forward_compute_time=1, backward_compute_time=2, activation_size=10",
            r"bad-pbs-1\.txt:2: node n2 is missing field parameter_size",
        ),
        (
            "n2 -- b -- forward_compute_time=-1, backward_compute_time=2, activation_size=10, parameter_size=0",
            r"bad-pbs-1\.txt:2: node n2 forward_compute_time must be a finite number >= 0, got '-1'",
        ),
        (
            "n2 -- b -- forward_compute_time=1, backward_compute_time=2, activation_size=[10; -4], parameter_size=0",
            r":2: node n2 activation_size must be a finite number >= 0, got '\[10; -4\]'",
        ),
        (
            "n2 -- b -- forward_compute_time=1, backward_compute_time=abc, activation_size=10, parameter_size=0",
            r":2: node n2 backward_compute_time must be a finite number >= 0, got 'abc'",
        ),
        (
            "n2 -- b -- forward_compute_time=1, backward_compute_time=2, activation_size=nan, parameter_size=0",
            r":2: node n2 activation_size must be a finite number >= 0, got 'nan'",
        ),
        (
            "n1 -- a -- forward_compute_time=1, backward_compute_time=2, activation_size=1, parameter_size=0",
            r":2: node id 'n1' already defined on line 1",
        ),
        ("just some text", r":2: expected a node line .* got 'just some text'"),
    ],
)
def test_bad_lines_name_file_line_field_and_value(tmp_path: Path, line: str, message: str) -> None:
    """Each malformed node line raises ProfileError with the file, line number, field and value."""
    path = write(tmp_path, "bad-pbs-1.txt", [node("n1", "a"), line])
    with pytest.raises(ProfileError, match=message):
        read_graph_txt(path)


def test_an_edge_to_an_unknown_node_is_an_error(tmp_path: Path) -> None:
    """An edge naming a node without a node line names the edge's line and the node."""
    path = write(tmp_path, "e-pbs-1.txt", [node("n1", "a"), "\tn1 -- n7"])
    with pytest.raises(ProfileError, match=r"e-pbs-1\.txt:2: edge n1 -- n7 names node 'n7', which has no node line"):
        read_graph_txt(path)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    """A missing file and a file without nodes are ProfileErrors naming the file."""
    with pytest.raises(ProfileError, match=r"nothere-pbs-1\.txt: cannot read profile"):
        read_graph_txt(tmp_path / "nothere-pbs-1.txt")
    with pytest.raises(ProfileError, match=r"empty-pbs-1\.txt: no node lines found"):
        read_graph_txt(write(tmp_path, "empty-pbs-1.txt", [""]))


def test_duplicate_edges_count_once(tmp_path: Path) -> None:
    """Listing an edge twice does not double its bytes in the cut."""
    lines = [node("n1", "a", act="8"), node("n2", "b"), "\tn1 -- n2", "\tn1 -- n2"]
    assert read_graph_txt(write(tmp_path, "d-pbs-1.txt", lines)).cut_bytes == (8.0,)


def test_parse_is_deterministic() -> None:
    """Parsing the same text twice gives equal profiles."""
    text = (PRESETS / "pipedream" / "inception_v3-pbs-128.txt").read_text()
    assert parse_graph_txt(text, "inception_v3-pbs-128.txt") == parse_graph_txt(text, "inception_v3-pbs-128.txt")


def test_the_reader_keeps_every_edge_as_layer_inputs() -> None:
    """A diamond's edges are the profile's layer inputs (positions in the default order); a chain file has none."""
    text = "\n".join([node("a", "A"), node("b", "B"), node("c", "C"), node("d", "D"), "a -- b", "a -- c", "b -- d", "c -- d"])
    profile = parse_graph_txt(text, "dia-pbs-1.txt")
    assert profile.layer_inputs == ((), (0,), (0,), (1, 2))
    chain = parse_graph_txt("\n".join([node("a", "A"), node("b", "B"), "a -- b"]), "ch-pbs-1.txt")
    assert chain.layer_inputs is None
