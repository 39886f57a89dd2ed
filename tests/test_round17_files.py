"""Round 17: what `save_html` may replace, and the Monitor's `log_dir`, `summarize`
and `with` errors, against the real file system."""

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz


def _loss(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


W, X = jnp.ones((3, 2)), jnp.ones((4, 3))


@pytest.fixture(scope="module")
def small():
    return sowviz.inspect(lambda w: jnp.sum(w**2), jnp.ones(3))


def _is_report(path) -> bool:
    with open(path, encoding="utf-8") as f:
        head = f.read(4096)
    return head.startswith("<!DOCTYPE html>") and 'name="generator" content="sowviz' in head


# -- 1. a write-protected file ----------------------------------------------------------


def _dac_override() -> bool:
    """Whether this process writes files whatever their mode (root, with CAP_DAC_OVERRIDE)."""
    probe = os.path.join(os.environ.get("TMPDIR", "/tmp"), f".sowviz-dac-{os.getpid()}")
    with open(probe, "w") as f:
        f.write("x")
    os.chmod(probe, 0o444)
    try:
        open(probe, "w").close()
        return True
    except PermissionError:
        return False
    finally:
        os.chmod(probe, 0o644)
        os.unlink(probe)


# Run as root (CI does), chmod 444 does not stop root's own open(): the check is what a
# user without CAP_DAC_OVERRIDE sees, so the script then runs with that capability
# dropped from its bounding set (setpriv), where permissions apply as to anyone.
_READ_ONLY_SCRIPT = textwrap.dedent(
    """
    import os, stat, sys
    import jax.numpy as jnp, sowviz
    p = sys.argv[1]
    try:
        open(p, "w")
        print("OPEN-WROTE")
    except PermissionError:
        pass
    ins = sowviz.inspect(lambda w: jnp.sum(w ** 2), jnp.ones(3))
    mon = sowviz.Monitor(lambda w: jnp.sum(w ** 2))
    mon.step(jnp.ones(3))
    for label, obj in (("inspection", ins), ("monitor", mon)):
        try:
            obj.save_html(p)
            print(label, "WROTE")
        except PermissionError as e:
            print(label, "REFUSED", e)
    print("MODE", oct(stat.S_IMODE(os.stat(p).st_mode)))
    print("CONTENT", open(p).read())
    """
)


def _unprivileged_command() -> list[str]:
    if not _dac_override():
        return [sys.executable]
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running with CAP_DAC_OVERRIDE (root) and no `setpriv` to drop it")
    cmd = [setpriv, "--bounding-set", "-dac_override,-dac_read_search", sys.executable]
    probe = subprocess.run([*cmd, "-c", "pass"], capture_output=True, check=False)
    if probe.returncode != 0:  # a container that forbids changing the bounding set
        pytest.skip(f"cannot drop CAP_DAC_OVERRIDE here: {probe.stderr.decode()[:200]}")
    return cmd


def test_save_html_refuses_a_write_protected_file(tmp_path):
    cmd = _unprivileged_command()
    p = tmp_path / "final_report.html"
    p.write_text("<html>results I protected</html>")
    p.chmod(0o444)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [*cmd, "-c", _READ_ONLY_SCRIPT, str(p)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "OPEN-WROTE" not in out  # permissions do apply to this process
    for label in ("inspection", "monitor"):
        line = next(ln for ln in out.splitlines() if ln.startswith(label))
        assert line.startswith(f"{label} REFUSED sowviz: cannot write the report to {p}: ")
        assert "write-protected" in line and f"chmod u+w {p}" in line
    assert "MODE 0o444" in out
    assert "CONTENT <html>results I protected</html>" in out
    assert sorted(os.listdir(tmp_path)) == ["final_report.html"]  # no temporary left


def test_a_writable_earlier_report_is_still_replaced(small, tmp_path):
    p = tmp_path / "r.html"
    small.save_html(p)
    before = p.read_bytes()
    title = "second report"
    assert small.save_html(p, created="2020-01-01") == p
    assert p.read_bytes() != before and _is_report(p)
    got = sowviz.inspect(lambda w: jnp.sum(w**2), jnp.ones(3), title=title).save_html(p)
    assert got == p and title in p.read_text()


# -- 2. a symlink -------------------------------------------------------------------------


def test_save_html_writes_through_a_symlink(small, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    target = shared / "published_latest.html"
    small.save_html(target, created="2020-01-01")  # an earlier report there
    old = target.read_bytes()
    link = tmp_path / "report.html"
    link.symlink_to(target)
    got = small.save_html(link)
    assert got == link  # the path the user named
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() != old and _is_report(target)
    assert sorted(os.listdir(tmp_path)) == ["report.html", "shared"]
    assert sorted(os.listdir(shared)) == ["published_latest.html"]  # the temporary went


def test_a_dangling_symlink_gets_its_target_written(small, tmp_path):
    target = tmp_path / "out" / "r.html"
    target.parent.mkdir()
    link = tmp_path / "r.html"
    link.symlink_to(target)
    small.save_html(link)
    assert link.is_symlink() and _is_report(target)


def test_a_symlink_to_a_protected_target_is_judged_by_the_target(small, tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("my notes")
    link = tmp_path / "r.html"
    link.symlink_to(target)
    with pytest.raises(FileExistsError, match="is not a sowviz HTML report"):
        small.save_html(link)
    assert target.read_text() == "my notes" and link.is_symlink()


# -- 3. not a report / the live run log --------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "example"),
    [
        ("train.py", "import jax\n", "train.html"),
        ("page.html", "<!DOCTYPE html><html><head><title>mine</title></head></html>", None),
        ("data.bin", b"\x00\x01\x02", "data.html"),
    ],
)
def test_save_html_refuses_a_file_that_is_not_a_report(small, tmp_path, name, content, example):
    p = tmp_path / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content)
    before = p.read_bytes()
    with pytest.raises(FileExistsError) as info:
        small.save_html(p)
    msg = str(info.value)
    assert msg.startswith(f"sowviz: will not write the report to {p}: that file exists and is ")
    assert "not a sowviz HTML report" in msg and f"{len(before):,} bytes" in msg
    assert "delete the file first" in msg
    example = example or "page-sowviz.html"
    assert repr(str(tmp_path / example)) in msg
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [name]


def test_an_empty_file_is_replaced(small, tmp_path):
    p = tmp_path / "r.html"
    p.touch()
    small.save_html(p)
    assert _is_report(p)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_reading_it(small, tmp_path):
    p = tmp_path / "pipe"
    os.mkfifo(p)
    with pytest.raises(FileExistsError, match=r"\(not a regular file\)"):
        small.save_html(p)
    assert stat.S_ISFIFO(os.stat(p).st_mode)


def _steps_in(log_dir) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a damaged log warns
        return len(sowviz.load(log_dir).history)


@pytest.mark.parametrize("name", ["steps.log", "model.json"])
def test_monitor_save_html_refuses_its_own_live_run_log(tmp_path, name):
    log_dir = tmp_path / "exp1"
    mon = sowviz.Monitor(_loss, log_dir=log_dir)
    for _ in range(3):
        mon.step(W, X)
    mon.flush()
    target = log_dir / name
    before = target.read_bytes()
    with pytest.raises(FileExistsError) as info:
        mon.save_html(target)
    msg = str(info.value)
    assert msg.startswith(f"sowviz: will not write the report to {target}: it is a file of ")
    assert f"`log_dir` {str(log_dir)!r}" in msg and repr(str(tmp_path / "exp1.html")) in msg
    assert target.read_bytes() == before
    for _ in range(2):
        mon.step(W, X)
    mon.close()
    assert _steps_in(log_dir) == 5
    # Once closed the log is no report either: still refused, by the general rule.
    with pytest.raises(FileExistsError, match="is not a sowviz HTML report"):
        sowviz.load(log_dir).save_html(log_dir / "steps.log")
    assert _steps_in(log_dir) == 5
    report = sowviz.load(log_dir).save_html(tmp_path / "exp1.html")
    assert _is_report(report)


def test_the_live_log_is_recognised_by_any_name(tmp_path):
    log_dir = tmp_path / "exp1"
    mon = sowviz.Monitor(_loss, log_dir=log_dir)
    mon.step(W, X)
    mon.flush()
    alias = tmp_path / "alias.log"
    os.link(log_dir / "steps.log", alias)  # a hard link: another name, the same file
    with pytest.raises(FileExistsError, match="a file of the run log a Monitor is writing"):
        mon.save_html(alias)
    mon.close()
    assert _steps_in(log_dir) == 1


def test_the_command_line_report_says_it_in_one_line(tmp_path, capsys):
    from sowviz.__main__ import main

    log_dir = tmp_path / "exp1"
    with sowviz.Monitor(_loss, log_dir=log_dir) as mon:
        mon.step(W, X)
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    assert main(["report", str(log_dir), "-o", str(script)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sowviz report: will not write the report to {script}: ")
    assert script.read_text() == "print('train')\n"


# -- 4. `log_dir` and `summarize` are named ----------------------------------------------


@pytest.mark.parametrize("bad", [3, 2.5, b"runs/exp1", ["runs"]])
def test_monitor_log_dir_of_another_type_is_named(bad):
    with pytest.raises(TypeError) as info:
        sowviz.Monitor(_loss, log_dir=bad)
    msg = str(info.value)
    assert msg.startswith("sowviz: `log_dir` must be a directory path, a str or an os.PathLike")
    assert f"got {type(bad).__name__} {bad!r}" in msg and "None for no run log" in msg


def test_monitor_log_dir_as_a_pathlib_path_still_works(tmp_path):
    with sowviz.Monitor(_loss, log_dir=tmp_path / "exp1") as mon:
        mon.step(W, X)
    assert _steps_in(tmp_path / "exp1") == 1


@pytest.mark.parametrize("bad", [0, -1, 5000])
def test_save_intermediates_summarize_out_of_range_is_named(bad):
    with pytest.raises(ValueError) as info:
        sowviz.save_intermediates(lambda x: x, summarize=bad)
    msg = str(info.value)
    assert msg.startswith(f"sowviz.save_intermediates: `summarize={bad}` asks for {bad} ")
    assert "summarize=True" in msg and "None or False for no summaries" in msg
    assert "bins must be" not in msg


def test_save_intermediates_summarize_as_a_number_still_works():
    def f(x):
        return jnp.sum(sowviz.sow(jnp.sin(x), "h") ** 2)

    x = jnp.linspace(-1.0, 1.0, 8)
    value, inter = sowviz.save_intermediates(f, summarize=8)(x)
    np.testing.assert_allclose(value, np.sum(np.sin(np.asarray(x)) ** 2), rtol=1e-6)
    summ = inter["h"]["primal"]
    assert int(np.sum(summ.hist_counts)) == 8 and len(np.asarray(summ.hist_counts)) == 8


# -- 5. `with Monitor(...) as mon:` ------------------------------------------------------


def test_monitor_as_a_context_manager_closes_the_log(tmp_path):
    log_dir = tmp_path / "exp1"
    with sowviz.Monitor(_loss, log_dir=log_dir) as mon:
        value, grad = mon.step(W, X)
    v, g = jax.value_and_grad(_loss)(W, X)
    np.testing.assert_allclose(value, v, rtol=1e-6)
    np.testing.assert_allclose(grad, g, rtol=1e-6)
    assert sowviz.load(log_dir).finished  # the end record: closed, not left open
    with pytest.raises(RuntimeError, match="closed"):
        mon.step(W, X)


def test_monitor_context_manager_closes_on_an_exception(tmp_path):
    log_dir = tmp_path / "exp1"
    with pytest.raises(ZeroDivisionError):
        with sowviz.Monitor(_loss, log_dir=log_dir) as mon:
            mon.step(W, X)
            mon.step(W, X)
            1 / 0  # noqa: B018
    view = sowviz.load(log_dir)
    assert view.finished and len(view.history) == 2
    # Its log is free: a second Monitor on the same `log_dir` is refused as a finished
    # run's (not as one still being written).
    with pytest.raises(FileExistsError, match="already holds a run log"):
        sowviz.Monitor(_loss, log_dir=log_dir)
