"""The `l2c` command as a user runs it: real subprocesses, exit codes, one-line errors, no tracebacks."""
import json
import os
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
    ("kernel a { types a=f160 }", "bad.l2:1:23: error: unexpected '0'"),   # digits that end a name
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


def test_verify_takes_the_dimensions_a_spec_fixes_from_the_spec_and_the_rest_from_shape(tmp_path):
    spec = tmp_path / "k.l2"
    spec.write_text("kernel rows { problem m=64 tile m=16 n=16 k=16 }\n"
                    "kernel weight { problem n=96 k=64 tile m=16 n=16 k=16 }\n")
    result = l2c("verify", spec, "--target", "triton", "--shape", "5x100x64,127x65x33", "--device", "cpu")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split(" on ")[0] for line in result.stdout.splitlines()] == [
        "ok   rows [triton] 64x100x64", "ok   rows [triton] 64x65x33", "ok   weight [triton] 5x96x64",
        "ok   weight [triton] 127x96x64"]


def test_verify_rejects_bad_shapes(tmp_path):
    spec = tmp_path / "k.l2"
    spec.write_text("kernel small { }\n")
    assert_clean_failure(l2c("verify", spec, "--shape", "12x3", "--device", "cpu"), "positive MxNxK")
    assert_clean_failure(l2c("verify", spec, "--shape", " , ", "--device", "cpu"), "positive MxNxK")
    assert_clean_failure(l2c("verify", spec, "--batch", "0", "--device", "cpu"), "--batch wants a positive")


def test_verify_that_verified_nothing_does_not_pass(tmp_path):
    """Every kernel skipped on this device (CUTLASS, or bf16 in the Triton interpreter): nothing was verified, so
    the command does not report success."""
    spec = tmp_path / "k.l2"
    spec.write_text("kernel bf { types a=bf16 b=bf16 c=bf16 tile m=32 n=32 k=16 }\n")
    result = l2c("verify", spec, "--target", "triton", "--shape", "16x16x16", "--device", "cpu")
    assert result.returncode == 1 and "nothing was verified" in result.stderr and "Traceback" not in result.stderr


def test_tune_for_an_unknown_arch_is_a_usage_error(tmp_path):
    result = l2c("tune", "--shapes", "16x16x16", "--runner", "model", "--arch", "sm_91", "--trials", "2", cwd=tmp_path)
    assert result.returncode == 2 and "--arch 'sm_91'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("flags, fragment", [
    (["--seed", str(2 ** 64)], "--seed must be between 0 and"),
    (["--seed", "-1"], "--seed must be between 0 and"),
    (["--storage", "nosuchdb://host/x"], "--storage nosuchdb://host/x: cannot open it as an Optuna storage"),
    (["--policy", "POLICY"], "not a policy file written by l2c"),
    (["--policy-fraction", "nan"], "--policy-fraction must be from 0 to 1"),
    (["--warm-start", "-5"], "--warm-start 0 or more"),
    (["--compile-workers", "-2"], "--compile-workers 1 or more"),
])
def test_tune_flags_that_cannot_work_are_usage_errors(tmp_path, flags, fragment):
    (tmp_path / "POLICY").write_text("not a policy\n")
    result = l2c("tune", "--shapes", "16x16x16", "--runner", "model", "--trials", "2", "--confirm", "0", "--store",
                 tmp_path / "store.db", *[str(tmp_path / f) if f == "POLICY" else f for f in flags], cwd=tmp_path)
    assert_clean_failure(result, fragment)


# ------------------------------------------------------------------ where outputs go, and what is in the way

HGEMM = REPO / "examples" / "hgemm_4096.l2"


def _hostile_output(tmp_path, kind):
    """An -o path that cannot be a folder of outputs, made for real in tmp_path."""
    if kind == "existing-file":
        (tmp_path / "f").write_text("x")
        return tmp_path / "f", "exists and is not a directory"
    if kind == "under-a-file":
        (tmp_path / "f").write_text("x")
        return tmp_path / "f" / "sub", "Not a directory"
    if kind == "symlink-loop":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        return tmp_path / "a", "a loop of symbolic links"
    if kind == "dangling-symlink":
        (tmp_path / "a").symlink_to(tmp_path / "nowhere")
        return tmp_path / "a", "which does not exist"
    if kind == "under-a-dangling-symlink":   # the message names the link in the way, not the path asked for
        (tmp_path / "a").symlink_to(tmp_path / "nowhere")
        return tmp_path / "a" / "sub", f"{tmp_path / 'a'}: a symbolic link to {tmp_path / 'nowhere'}, which does not"
    if kind == "output-is-a-directory":
        (tmp_path / "o" / "triton" / "hgemm_4096.py").mkdir(parents=True)
        return tmp_path / "o", "hgemm_4096.py: Is a directory"
    if kind == "not-permitted":
        return Path("/proc/self/l2c_out"), "/proc/self/l2c_out"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["existing-file", "under-a-file", "symlink-loop", "dangling-symlink",
                                  "under-a-dangling-symlink", "output-is-a-directory", "not-permitted"])
def test_compile_output_errors_are_one_line(tmp_path, kind):
    out, fragment = _hostile_output(tmp_path, kind)
    result = l2c("compile", HGEMM, "-o", out)
    assert_clean_failure(result, fragment)
    assert result.stderr.startswith("l2c compile: error: ") and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any permission bits")
def test_compile_into_an_unwritable_folder_is_one_line(tmp_path):
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o555)
    assert_clean_failure(l2c("compile", HGEMM, "-o", locked / "out"), "Permission denied")


def test_compile_on_a_full_disk_leaves_no_half_written_file(tmp_path):
    """`ulimit -f 1` makes any write past 1 KiB fail with EFBIG, as a full disk fails with ENOSPC."""
    result = subprocess.run(f"ulimit -f 1; exec {sys.executable} -m l2c compile {HGEMM} -o {tmp_path / 'o'}",
                            shell=True, capture_output=True, text=True, timeout=300)
    assert_clean_failure(result, "hgemm_4096.py: File too large")
    assert list((tmp_path / "o").rglob("*.py")) == [] and list((tmp_path / "o").rglob("*.tmp")) == []


def test_compile_refuses_one_kernel_name_in_two_files(tmp_path):
    (tmp_path / "a.l2").write_text("kernel same { tile m=64 }\n")
    (tmp_path / "b.l2").write_text("\nkernel same { tile m=128 }\n")
    result = l2c("compile", "a.l2", "b.l2", "-o", "out", cwd=tmp_path)
    assert_clean_failure(result, "b.l2:2:8: error: kernel name 'same' is also used at a.l2:1:8")
    assert not (tmp_path / "out").exists()


def test_verify_of_a_shape_too_large_for_memory_is_one_line(tmp_path):
    spec = tmp_path / "k.l2"
    spec.write_text("kernel small { tile m=32 n=32 k=16 }\n")
    result = l2c("verify", spec, "--target", "triton", "--device", "cpu", "--shape", "10000000x10000000x1")
    assert_clean_failure(result, "l2c verify: error: verifying small at 10000000x10000000x1 needs about")


# ------------------------------------------------------------------ spec files that are not text, or too much

@pytest.mark.parametrize("data, where, fragment", [
    ("kernel a {}\n".encode("utf-16"), ":1:1:", "byte 0xff is not UTF-8; spec files are UTF-8 text (it looks like UTF-16"),
    (b"kernel a {\n  # caf\xe9\n}\n", ":2:8:", "byte 0xe9 is not UTF-8"),
    (b"kernel \xc3\xa9 {}\xff", ":1:12:", "byte 0xff is not UTF-8"),
])
def test_non_utf8_spec_files_name_line_and_column(tmp_path, data, where, fragment):
    bad = tmp_path / "bad.l2"
    bad.write_bytes(data)
    assert_clean_failure(l2c("check", bad), f"bad.l2{where} error: {fragment}")


def test_a_fifo_and_a_device_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "f.l2"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero"):
        assert_clean_failure(l2c("check", path), "not a regular file")   # l2c() times out if it blocks


def test_a_spec_file_over_1_mib_is_refused(tmp_path):
    big = tmp_path / "big.l2"
    big.write_text("# padding\n" * 110_000)
    assert_clean_failure(l2c("check", big), "over the 1048576-byte limit")


@pytest.mark.parametrize("text, fragment", [
    ("kernel a { problem m=%s }" % ("9" * 5000), "bad.l2:1:22: error: [problem.m] 999999999999...(5000 digits) is "
                                                  "above the maximum 2147483647"),
    ("kernel a { split_k slices=%s }" % ("1" * 4400), "bad.l2:1:27: error: [split_k.slices] "),
    ("kernel a { problem k=2147483648 }", "[problem.k] 2147483648 is above the maximum 2147483647"),
    ("kernel a { epilogue alpha=1e300 }", "bad.l2:1:27: error: [epilogue.alpha] alpha=1e+300"),
    ("kernel a { epilogue beta=-1e-46 }", "(rule: fp32-scalar)"),
    ("kernel %s { }" % ("k" * 230), "bad.l2:1:8: error: kernel name of 230 characters"),
])
@pytest.mark.parametrize("command", ["check", "compile"])
def test_values_the_kernels_cannot_hold_are_rejected(tmp_path, command, text, fragment):
    (tmp_path / "bad.l2").write_text(text)
    args = (command, "bad.l2") + (("-o", "out") if command == "compile" else ())
    assert_clean_failure(l2c(*args, cwd=tmp_path), fragment)
    assert not (tmp_path / "out").exists()


def test_rules_list_names_the_new_rules():
    listed = l2c("check", "--rules").stdout
    assert "fp32-scalar" in listed and "name-length" in listed


HOSTILE_BYTES = st.one_of(
    st.binary(max_size=60),
    st.sampled_from(["utf-16", "utf-16-be", "utf-32", "latin-1", "cp1252"]).map(
        lambda enc: "kernel caf\u00e9 { tile m=64 }\n".encode(enc, errors="replace")),
)


@settings(max_examples=12, deadline=None)
@given(HOSTILE_BYTES)
def test_fuzz_binary_spec_files_never_traceback(tmp_path_factory, data):
    spec = tmp_path_factory.mktemp("bytes") / "f.l2"
    spec.write_bytes(data)
    result = l2c("check", spec)
    assert result.returncode in (0, 2) and "Traceback" not in result.stderr, result.stderr


@settings(max_examples=8, deadline=None)
@given(st.sampled_from(["existing-file", "under-a-file", "symlink-loop", "dangling-symlink",
                        "output-is-a-directory", "not-permitted"]), st.text("ab/.", min_size=1, max_size=6))
def test_fuzz_hostile_output_paths_never_traceback(tmp_path_factory, kind, tail):
    base = tmp_path_factory.mktemp("out")
    out, _ = _hostile_output(base, kind)
    result = l2c("compile", HGEMM, "-o", f"{out}/{tail}" if kind != "output-is-a-directory" else out)
    assert result.returncode in (0, 2) and "Traceback" not in result.stderr, result.stderr


def test_the_gpu_entry_point_lists_its_stages_and_every_command_names_a_file_that_exists(tmp_path):
    """scripts/gpu.py, the supported way to run the GPU checks and benchmarks: each stage's commands are ordinary
    ones that name scripts and examples present in the repository (no GPU needed to print them)."""
    import shlex
    from l2c import settings as l2c_settings
    from l2c.dispatch import prepare_mode, tune_mode
    from l2c.online import tuned_targets
    root = Path(__file__).resolve().parent.parent
    listed = subprocess.run([sys.executable, "scripts/gpu.py", "--list"], capture_output=True, text=True, cwd=root)
    stages = [line.split()[0] for line in listed.stdout.splitlines()]
    assert listed.returncode == 0 and {"check", "dispatch", "serve", "decode"} <= set(stages)
    dry = subprocess.run([sys.executable, "scripts/gpu.py", *stages, "--dry-run", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=root)
    assert dry.returncode == 0, dry.stderr
    commands = [shlex.split(line) for line in dry.stdout.splitlines()]
    assert len(commands) >= len(stages)
    for command in commands:
        if command[0] == "env":   # `env NAME=value ... python ...`: the command after its settings
            command = command[1:]
            while "=" in command[0]:
                name, value = command[0].split("=", 1)
                with pytest.MonkeyPatch.context() as env:   # each setting a stage makes is one l2c accepts
                    env.setenv(name, value)
                    assert name in l2c_settings.SETTINGS and l2c_settings.overlap() and tune_mode()
                    assert prepare_mode() and tuned_targets()
                command = command[1:]
        files = [a for a in command[1:] if a.endswith(".py")]
        assert command[1] == "-m" or files, command
        assert all(Path(f).is_file() for f in files), command
    bad = subprocess.run([sys.executable, "scripts/gpu.py", "nope"], capture_output=True, text=True, cwd=root)
    assert bad.returncode == 2 and "unknown stage" in bad.stderr


def test_gpu_stages_time_the_table_users_get_unless_told_another(tmp_path):
    """The stages' eager table is the one l2c.matmul reads here (L2C_TUNED_TABLE, else the one shipped for this
    GPU; sm_90.json with none visible), and `--eager-table` names another."""
    root = Path(__file__).resolve().parent.parent

    def tables(*extra, users_table=None):
        env = {k: v for k, v in os.environ.items() if k != "L2C_TUNED_TABLE"}
        dry = subprocess.run([sys.executable, "scripts/gpu.py", "captured_overlap", "--dry-run", "--out",
                              str(tmp_path), *extra], capture_output=True, text=True, cwd=root,
                             env={**env, **({"L2C_TUNED_TABLE": users_table} if users_table else {})})
        assert dry.returncode == 0, dry.stderr
        return {word.split(":", 1)[1] for word in dry.stdout.split() if word.startswith("dispatch:")}

    users = str(tmp_path / "users.json")
    assert tables(users_table=users) == {users}
    assert tables("--eager-table", "other.json", users_table=users) == {"other.json"}
    assert tables() == {str(root / "l2c" / "tuned" / "sm_90.json")}


def test_gpu_stages_bundle_their_results_into_one_archive(tmp_path, monkeypatch):
    """gpu.py --bundle: after each command, every file under --out (results, logs, stages.json) in one .tar.xz,
    rewritten whole, so that a run cut short still brings back what finished; --start-from seeds a results file that
    a stage continues."""
    import importlib.util
    import tarfile
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("gpu_stages", root / "scripts" / "gpu.py")
    gpu = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_stages", gpu)   # its dataclasses look their module up there
    spec.loader.exec_module(gpu)
    out, archive = tmp_path / "run", tmp_path / "results.tar.xz"
    (out / "stage").mkdir(parents=True)
    (out / "a.jsonl").write_text("{}\n")
    gpu.bundle(out, archive)
    (out / "stage" / "b.log").write_text("done\n")
    gpu.bundle(out, archive)
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["a.jsonl", "stage/b.log"]
        assert tar.extractfile("stage/b.log").read() == b"done\n"
    import lzma   # --start-from: a committed .xz part unpacked where a stage's --resume continues it, once
    part = tmp_path / "part.jsonl.xz"
    part.write_bytes(lzma.compress(b'{"type": "result"}\n'))
    gpu.start_from(part, out / "points_f16.jsonl")
    assert (out / "points_f16.jsonl").read_text() == '{"type": "result"}\n'
    (out / "points_f16.jsonl").write_text("more\n")
    gpu.start_from(part, out / "points_f16.jsonl")
    assert (out / "points_f16.jsonl").read_text() == "more\n"
    bad = subprocess.run([sys.executable, "scripts/gpu.py", "points", "--dry-run", "--start-from", "x.jsonl"],
                         capture_output=True, text=True, cwd=root)
    assert bad.returncode == 2 and "expected NAME=FILE" in bad.stderr
    # --total-s: the run's own deadline cuts each command's limit, and a spent one skips what is left
    assert gpu.command_timeout(None, None, 100.0) is None
    assert gpu.command_timeout(300.0, None, 100.0) == 300.0
    assert gpu.command_timeout(300.0, 500.0, 100.0) == 300.0
    assert gpu.command_timeout(300.0, 500.0, 450.0) == 50.0
    assert gpu.command_timeout(None, 500.0, 520.0) <= 0
    spent = subprocess.run([sys.executable, "scripts/gpu.py", "near_check", "--out", str(tmp_path / "spent"),
                            "--total-s", "0"], capture_output=True, text=True, cwd=root)
    skipped = json.loads((tmp_path / "spent" / "stages.json").read_text())
    assert spent.returncode == 0 and len(skipped) == 4 and all(r["rc"] is None for r in skipped)


def test_a_results_file_that_is_not_one_is_a_one_line_error(tmp_path):
    bad = tmp_path / "r.l2"
    bad.write_text("hello\nworld\n")
    result = l2c("table", bad, "-o", tmp_path / "t.json")
    assert result.returncode == 2 and "Traceback" not in result.stderr and result.stderr.startswith("l2c table: error:")


@pytest.mark.parametrize("flags, fragment", [
    (["--rate", "nan"], "--rate must be a positive number"), (["--rate", "-1"], "--rate must be a positive number"),
    (["--warmup", "-1"], "--warmup must be 0 or more"), (["--limit", "-1"], "--limit 1 or more"),
    (["--warmup-seconds", "inf"], "--warmup-seconds 0 or more"),
    (["--seed", str(2 ** 64)], "a seed is a whole number from 0 to 2^63 - 1"),
])
def test_bench_flags_that_cannot_work_are_usage_errors(tmp_path, flags, fragment):
    assert_clean_failure(l2c("bench", REPO / "examples" / "hgemm_generic.l2", "--shape", "16x16x16", "--device",
                             "cpu", *flags, "-o", tmp_path / "r.jsonl", cwd=tmp_path), fragment)


@pytest.mark.parametrize("flags, fragment", [
    (["--server", "notaurl", "--model", "x"], "the server is an http:// or https:// URL"),
    (["--model-dir", "gpt2"], "gpt2: not a local model directory"),
])
def test_propose_reads_only_a_local_model_or_an_http_server(tmp_path, flags, fragment):
    """A model name that is not a local directory is refused (never a download from the Hugging Face Hub)."""
    assert_clean_failure(l2c("propose", "--m", "64", "--n", "64", "--k", "64", *flags, cwd=tmp_path), fragment)
