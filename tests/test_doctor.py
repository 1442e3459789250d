"""``python -m fastload doctor`` and ``fastload.doctor`` (NOTE [doctor] in fastload/_doctor.py).

What is tested here is what the doctor measures and says, not how fast anything is: whether its
recommendation matches the best setting measured independently is checked by
``benchmarks/bench_doctor.py`` (speed belongs to benchmarks)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import fastload
from fastload._doctor import NEAR_BEST, Diagnosis, Setting
from helpers import MP_TIMEOUT
from helpers.doctor_data import NotMapStyle, PythonFloats, Rows, Sleepy, Strings, Threads, Tokens

QUICK = dict(seconds=0.2, repeat=1, memory_seconds=5, quiet=True)
TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.timeout(MP_TIMEOUT)
def test_it_measures_every_setting_and_recommends_the_best_measured():
    d = fastload.doctor(Rows(), 32, 2, **QUICK, start_method="fork")
    assert [s.workers for s in d.settings] == [0, 1, 2]
    assert all(s.rates and all(r > 0 for r in s.rates) for s in d.settings)
    assert all(s.main_cpu and s.main_cpu[0] >= 0 for s in d.settings)
    best = max(d.settings, key=lambda s: s.rate)
    assert d.recommended_workers == best.workers
    if best.workers:  # prefetch measured at the best worker count: twice the default, against
        # more runs of the default, which join the best count's own row (one row per setting)
        assert [(s.workers, s.prefetch) for s in d.prefetch] == [(best.workers, 4)]
        assert [len(s.rates) for s in d.settings] == [1 + (s is best) for s in d.settings]
        assert d.recommended_prefetch in (None, 4)
        assert len(d.memory["workers"]) == best.workers
        assert all(w["uss"] > 0 and w["pss"] > 0 for w in d.memory["workers"])
    else:  # the single process won: memory is still measured with the workers' best count
        assert d.prefetch == [] and len(d.memory["workers"]) in (1, 2)
    assert 0 < d.getitem_s <= d.getitem_p90_s
    assert d.kwargs()["num_workers"] == best.workers
    # the kwargs it recommends build a working loader
    with fastload.Loader(Rows(), 32, **d.kwargs()) as loader:
        assert sum(len(b[0]) for b in loader) == 512


@pytest.mark.timeout(MP_TIMEOUT)
def test_the_report_is_narrow_and_says_what_each_column_is():
    d = fastload.doctor(Rows(), 32, 1, **QUICK, start_method="fork")
    text = d.table()
    assert max(len(line) for line in text.splitlines()) <= 80
    for words in ("samples/s", "vs single", "main CPU/sample", "dataset __getitem__",
                  "packing into a batch", "recommended: fastload.Loader(dataset, 32, "):
        assert words in text
    assert "samples/s: median over repeats" in text  # the legend
    rows = text.split("\n\n")[0].splitlines()[1:]  # the settings measured
    assert len(rows) == len(d.settings) + len(d.prefetch) + (d.threads is not None)
    assert sum(" *" in r for r in rows) == 1  # the recommended setting is marked, once


def _diagnosis(rec: tuple[int, str, int | None]) -> Diagnosis:
    settings = [Setting(0, rates=[1000.0]), Setting(1, rates=[3483.0, 2084.0, 3100.0])]
    pre = [Setting(1, 4, rates=[2500.0])]
    threads = Setting(1, None, rates=[2900.0], method="thread")
    return Diagnosis(4096, 64, 2, 1e-4, 2e-4, None, settings, pre, rec[0], rec[2], None, {}, [],
                     [], threads, rec[1], {"ragged": {"tokens": "pad"}})


@pytest.mark.parametrize("rec", [(1, "process", None), (1, "process", 4), (1, "thread", None),
                                 (0, "process", None)])
def test_the_recommendation_is_one_row_and_the_report_gives_its_figure(rec):
    # The default prefetch was measured twice, in the sweep and again against twice it, and
    # printed as two rows of the same setting: 3,483/s in one, 2,084/s in the other.
    d = _diagnosis(rec)
    text = d.table()
    rows = text.split("\n\n")[0].splitlines()[1:]
    labels = [r[:34].replace(" *", "").strip() for r in rows]
    assert len(set(labels)) == len(labels) == 4, rows
    marked = [r for r in rows if " *" in r]
    assert len(marked) == 1 and f"{d.recommended.rate:,.0f}" in marked[0]
    assert (d.recommended.workers, d.recommended.method, d.recommended.prefetch) == rec
    n = len(d.recommended.rates)
    assert (f"  {d.recommended.rate:,.0f} samples/s: the row marked *, the median of {n} "
            f"run{'s' * (n > 1)}") in text
    kw = ", ".join(f"{k}={v!r}" for k, v in d.kwargs().items())
    assert f"recommended: fastload.Loader(dataset, 64, {kw}) [*]" in " ".join(text.split())
    assert max(len(line) for line in text.splitlines()) <= 80
    assert d.kwargs()["ragged"] == {"tokens": "pad"}  # what every run was given, kept


@pytest.mark.timeout(MP_TIMEOUT)
def test_a_thread_pool_in_each_worker_is_warned_about():
    d = fastload.doctor(Threads(), 32, 1, **QUICK, start_method="fork")
    assert any(s.threads and s.threads >= 7 for s in d.settings if s.workers)
    assert any("a worker runs" in w and "OMP_NUM_THREADS=1" in w for w in d.warnings), \
        d.warnings
    assert not any("a worker runs" in w for w in fastload.doctor(
        Rows(), 32, 1, **QUICK, start_method="fork").warnings)


@pytest.mark.timeout(MP_TIMEOUT)
def test_threads_running_before_workers_fork_are_warned_about():
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="my-prefetcher", daemon=True)
    t.start()
    try:
        d = fastload.doctor(Rows(), 32, 1, **QUICK, start_method="fork")
    finally:
        stop.set()
        t.join()
    assert any("my-prefetcher" in w and "forkserver" in w for w in d.warnings), d.warnings


@pytest.mark.timeout(MP_TIMEOUT)
def test_copy_on_read_growth_of_a_forked_python_list_is_measured_and_warned_about():
    ds = PythonFloats()
    d = fastload.doctor(ds, 4, [1], seconds=0.2, repeat=1, memory_seconds=30, quiet=True,
                        start_method="fork", share_dataset=False)
    growth = d.memory["workers"][0]["growth"]
    assert d.memory["over"] == "two epochs"
    assert growth > 32 * 2**20, growth  # the list's objects, copied as they were read
    assert any("private memory grew" in w and "values" in w for w in d.warnings), d.warnings


@pytest.mark.timeout(MP_TIMEOUT)
def test_object_leaves_are_named():
    d = fastload.doctor(Strings(), 32, 1, **QUICK, start_method="fork")
    assert any("Python objects" in w and "sample[1]" in w for w in d.warnings), d.warnings


def test_what_is_not_a_map_style_dataset_is_refused_clearly():
    with pytest.raises(TypeError, match="map-style dataset .*got NotMapStyle"):
        fastload.doctor(NotMapStyle(), **QUICK)
    with pytest.raises(ValueError, match="empty"):
        fastload.doctor(Rows(0), **QUICK)
    with pytest.raises(ValueError, match="batch_size"):
        fastload.doctor(Rows(), 0, **QUICK)


def test_a_factory_is_called():
    from helpers.doctor_data import make_rows

    d = fastload.doctor(make_rows, 64, [], **QUICK)  # no worker counts: the single process
    assert [s.workers for s in d.settings] == [0] and d.samples == 512


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "fastload", "doctor", *args], env=env,
                          capture_output=True, text=True, timeout=MP_TIMEOUT)


@pytest.mark.timeout(MP_TIMEOUT)
def test_the_command_line_shows_progress_and_the_report():
    r = _cli("helpers.doctor_data:make_rows", "--batch-size", "16", "--workers", "1",
             "--seconds", "0.2", "--repeat", "1", "--memory-seconds", "3")
    assert r.returncode == 0, r.stderr
    assert "doctor [1/" in r.stderr and "timing __getitem__ alone" in r.stderr
    assert "recommended: fastload.Loader(dataset, 16, num_workers=" in r.stdout
    assert "num_workers=1" in r.stdout and "single process (num_workers=0)" in r.stdout


@pytest.mark.timeout(MP_TIMEOUT)
def test_a_file_path_and_a_builtin_dataset_work():
    path = os.path.join(TESTS, "helpers", "doctor_data.py")
    r = _cli(f"{path}:Rows", "--workers", "1", "--seconds", "0.2", "--repeat", "1", "--quiet",
             "--memory-seconds", "3")
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and "recommended:" in r.stdout
    r = _cli("fastload:tiny", "--workers", "1", "--seconds", "0.2", "--repeat", "1", "--quiet",
             "--memory-seconds", "3")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("spec, msg", [
    ("no_colon", "expected module:function"),
    ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
    ("helpers.doctor_data:nothing", "has no 'nothing'"),
    ("helpers.doctor_data:NotMapStyle", "map-style dataset"),
])
def test_bad_arguments_say_what_was_wrong(spec, msg):
    r = _cli(spec, "--seconds", "0.1", "--repeat", "1", "--quiet")
    assert r.returncode != 0 and msg in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.timeout(MP_TIMEOUT)
def test_the_command_line_takes_ragged_as_its_error_advises():
    r = _cli("helpers.doctor_data:Tokens", "--workers", "1", "--seconds", "0.2", "--repeat", "1",
             "--quiet", "--memory-seconds", "2")
    assert r.returncode == 2 and "declare it ragged" in r.stderr, r.stderr
    assert """doctor: here, pass --ragged '{"tokens": "pad"}'""" in r.stderr
    r = _cli("helpers.doctor_data:Tokens", "--workers", "1", "--seconds", "0.2", "--repeat", "1",
             "--quiet", "--memory-seconds", "2", "--ragged", '{"tokens": "pad"}')
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stdout.split())  # the recommendation builds it too (wrapped at 80)
    assert "ragged={'tokens': 'pad'}) [*]" in said
    assert "Python objects" not in r.stdout  # a ragged leaf is not an object leaf


@pytest.mark.parametrize(("text", "value"), [
    ("pad", "pad"), ("packed", "packed"), ("list", "list"),
    ('{"tokens": "pad", "sample[0]": "list"}', {"tokens": "pad", "sample[0]": "list"}),
])
def test_ragged_takes_the_forms_the_loader_takes(text, value):
    from fastload._cli import ragged_arg

    assert ragged_arg(text) == value
    with fastload.Loader(Tokens(8), 4, ragged=ragged_arg("pad")) as loader:
        assert next(iter(loader))["tokens"].lengths.tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize(("text", "said"), [
    ("zip", "expected one of list, pad, packed or a JSON object"),
    ("{tokens: pad}", "not valid JSON"),
    ('{"tokens": "zip"}', "each leaf's mode must be one of list, pad, packed; got 'tokens': 'zip'"),
])
def test_a_bad_ragged_flag_is_an_argparse_error(capsys, text, said):
    from fastload._doctor import main as doctor_main

    with pytest.raises(SystemExit) as e:
        doctor_main(["helpers.doctor_data:Tokens", "--ragged", text])
    assert e.value.code == 2 and said in capsys.readouterr().err


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch):
    from fastload import _doctor

    d = fastload.doctor(Rows(64), 32, [], **QUICK)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    with pytest.raises(SystemExit, match="pip install matplotlib"):
        _doctor._plot(d, "out.png")


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    from fastload import _doctor

    d = fastload.doctor(Rows(64), 32, [], **QUICK)
    _doctor._plot(d, str(tmp_path / "out.png"))
    assert (tmp_path / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(MP_TIMEOUT)
def test_it_measures_thread_workers_at_the_best_count_and_says_which_to_use():
    # 2 ms samples that wait (GIL released): a worker setting wins, and threads are measured
    d = fastload.doctor(Sleepy(128), 32, [2], **QUICK)
    best = max(d.settings, key=lambda s: s.rate)
    assert best.workers == 2, d.table()
    t = d.threads
    assert t is not None and (t.workers, t.method) == (best.workers, "thread")
    assert len(t.rates) == 1 and t.rates[0] > 0
    fastest = max(s.rate for s in d.settings + d.prefetch)
    assert d.recommended_method == ("thread" if t.rate >= NEAR_BEST * fastest else "process")
    assert [(s.workers, s.prefetch, s.method) for s in d.prefetch] == [(2, 4, "process")]
    assert len(best.rates) == 2  # the sweep's run and one against prefetch=4: one row
    assert d.table().count(f"{d.recommended.rate:,.0f}") >= 2  # its row and the summary
    assert d.kwargs().get("worker_method", "process") == d.recommended_method
    assert any("worker threads" in a for a in d.advice)
    assert "threads" in d.table()
    with fastload.Loader(Rows(), 32, **d.kwargs()) as loader:
        assert sum(len(b[0]) for b in loader) == 512
