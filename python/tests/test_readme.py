"""The README's Python examples: the numpy one runs here; the PyTorch one on a GPU."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_numpy_and_torch_examples():
    blocks = python_blocks()
    assert any("import numpy" in b for b in blocks)
    assert any("import torch" in b for b in blocks)


def test_readme_numpy_example_runs():
    (block,) = [b for b in python_blocks() if "import numpy" in b]
    exec(compile(block, str(README), "exec"), {})


def test_readme_torch_example_runs():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import ferrodnn

    if not ferrodnn.gpu_available():
        pytest.skip("ferrodnn finds no usable GPU")
    (block,) = [b for b in python_blocks() if "import torch" in b]
    exec(compile(block, str(README), "exec"), {})
