"""The hostile-input corpus of issue 29 (ferrodnn/tests/hostile/, written from the cases of
ferrodnn/tests/hostile.rs, which keeps the files equal to them): every graph file through
`run_graph_json`, which parses and validates it, builds its CPU plan, makes random inputs and
executes, as the Rust test and `ferrodnn run` do. Each must raise a ferrodnn exception whose
message has the case's words: never a crash, a hang or an abort of the interpreter."""

import json
import pathlib

import pytest

cudnn = pytest.importorskip("ferrodnn")

CORPUS = pathlib.Path(__file__).resolve().parents[2] / "ferrodnn" / "tests" / "hostile"
CASES = json.loads((CORPUS / "expected.json").read_text())


@pytest.fixture(autouse=True)
def fixed_limits(monkeypatch):
    # The limits of the Rust and CLI tests: 4 GiB of host memory and the default work bound.
    monkeypatch.setenv("FERRODNN_MAX_HOST_BYTES", "4G")
    monkeypatch.delenv("FERRODNN_CPU_MAX_WORK", raising=False)


def test_the_corpus_is_all_there():
    assert len(CASES) >= 150, len(CASES)
    assert all((CORPUS / f"{stem}.json").is_file() for stem in CASES)


@pytest.mark.parametrize("stem", sorted(CASES))
def test_hostile_graph_file_is_refused_with_a_message(stem):
    case = CASES[stem]
    text = (CORPUS / f"{stem}.json").read_text(encoding="utf-8")
    with pytest.raises(cudnn.FerrodnnError) as e:
        cudnn.run_graph_json(text)
    msg = str(e.value)
    missing = [w for w in case["want"] if w not in msg]
    assert not missing, f"{case['name']}: the message lacks {missing}: {msg}"


def test_a_good_graph_file_runs():
    F32 = cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=F32, compute_data_type=F32, handle=cudnn.create_cpu_handle(), name="ok")
    X = g.tensor(name="X", dim=[2, 3], stride=[3, 1])
    Y = g.relu(input=X, name="r")
    Y.set_output(True)
    text = g.to_json()
    out = cudnn.run_graph_json(text)
    assert len(out) == 1, out
    (values,) = out.values()
    assert len(values) == 6 and min(values) >= 0.0, values
    # Seeded: the same inputs, the same outputs; another seed, other ones.
    assert cudnn.run_graph_json(text) == out
    assert cudnn.run_graph_json(text, seed=8) != out
