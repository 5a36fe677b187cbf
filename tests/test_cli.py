"""The `l2c` command as a user runs it: real subprocesses, exit codes, one-line errors, no tracebacks."""
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO / "examples").glob("*.l2"))


def l2c(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "l2c", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def assert_clean_failure(result, fragment):
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert fragment in result.stderr, result.stderr


def test_check_accepts_the_examples():
    result = l2c("check", *EXAMPLES)
    assert result.returncode == 0, result.stderr
    assert "ok for cutlass" in result.stdout and "ok for triton" in result.stdout


def test_check_lists_rules():
    result = l2c("check", "--rules")
    assert result.returncode == 0 and "tma-alignment" in result.stdout


@pytest.mark.parametrize("command", ["check", "compile"])
@pytest.mark.parametrize("text, fragment", [
    ("kernel a {\n  tile m=100\n}\n", "bad.l2:2:10: error: unexpected '100'"),
    ("kernel a {\n  launch warp=8\n}\n", "bad.l2:2:10: error: unexpected 'warp'"),
    ("kernel a {\n  tile m=32\n  target cutlass\n}\n", "bad.l2:2:10: error: [tile.m]"),
    ("kernel a { split_k slices=1000 }", "bad.l2:1:27: error: [split_k.slices] 1000 is above the maximum"),
])
def test_bad_specs_exit_2_with_location(tmp_path, command, text, fragment):
    spec = tmp_path / "bad.l2"
    spec.write_text(text)
    result = l2c(command, "bad.l2", "-o", "out", cwd=tmp_path) if command == "compile" else \
        l2c(command, "bad.l2", cwd=tmp_path)
    assert_clean_failure(result, fragment)
    assert not (tmp_path / "out").exists(), "nothing is written when any kernel is rejected"


def test_missing_file_is_a_clean_error(tmp_path):
    assert_clean_failure(l2c("check", tmp_path / "nope.l2"), "cannot read file")


def test_binary_file_is_a_clean_error(tmp_path):
    bad = tmp_path / "bin.l2"
    bad.write_bytes(b"\xff\xfe\x00kernel")
    assert_clean_failure(l2c("check", bad), "bin.l2")


@settings(max_examples=15, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=80))
def test_random_files_never_traceback(tmp_path_factory, text):
    spec = tmp_path_factory.mktemp("fuzz") / "f.l2"
    spec.write_text(text, encoding="utf-8")
    result = l2c("check", spec)
    assert result.returncode in (0, 2)
    assert "Traceback" not in result.stderr


def test_verify_runs_a_generated_kernel_on_the_interpreter(tmp_path):
    spec = tmp_path / "k.l2"
    spec.write_text("kernel small { types a=f16 b=f16 c=f32 tile m=32 n=32 k=16 launch warps=2 "
                    "epilogue bias=col activation=relu }\n"
                    "kernel bf { types a=bf16 b=bf16 c=bf16 tile m=32 n=32 k=16 }\n")
    result = l2c("verify", spec, "--target", "triton", "--shape", "37x41x19,1x1x1", "--device", "cpu")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("ok   small [triton]") == 2
    assert "skip bf [triton]: bf16 tl.dot is wrong in the Triton interpreter" in result.stdout


def test_verify_rejects_bad_shapes(tmp_path):
    spec = tmp_path / "k.l2"
    spec.write_text("kernel small { }\n")
    assert_clean_failure(l2c("verify", spec, "--shape", "12x3", "--device", "cpu"), "positive MxNxK")
