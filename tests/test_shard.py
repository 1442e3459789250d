"""Rank sharding: disjoint, covering, equal-length shards, with a validity mask."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastload


def _epoch(loader):
    idx, mask = [], []
    for b, m in loader:
        idx += b.tolist()
        mask += m.tolist()
    return idx, mask


@pytest.mark.parametrize("n, world, bs", [(103, 2, 8), (10, 3, 2), (7, 4, 3), (2, 4, 1)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shards_are_disjoint_covering_and_equal(n, world, bs, drop_last):
    data = np.arange(n)
    for epoch in range(2):
        per_rank = []
        for rank in range(world):
            with fastload.Loader(data, bs, shuffle=True, seed=9, shard=(rank, world),
                                 return_mask=True, drop_last=drop_last, num_workers=0) as ld:
                for _ in range(epoch):
                    list(ld)
                per_rank.append((len(ld), *_epoch(ld)))
        lens = {p[0] for p in per_rank}
        assert len(lens) == 1, f"ranks got different numbers of batches: {lens}"
        real = [i for _, idx, mask in per_rank for i, v in zip(idx, mask) if v]
        assert len(real) == len(set(real)), "a real sample appeared on two ranks"
        if not drop_last:
            assert sorted(real) == list(range(n)), "the shards do not cover the dataset"
            pads = [i for _, idx, mask in per_rank for i, v in zip(idx, mask) if not v]
            assert len(pads) == -(-n // world) * world - n
        # together, the ranks' orders interleave into the one global order for (seed, epoch)
        with fastload.Loader(data, 1, shuffle=True, seed=9, num_workers=0) as ref:
            for _ in range(epoch):
                list(ref)
            glob = [int(b[0]) for b in ref]
        interleaved = [i for tup in zip(*[p[1] for p in per_rank]) for i in tup]
        assert interleaved[: min(n, len(interleaved))] == glob[: len(interleaved)][:n]


def test_shard_with_workers_matches_in_process():
    data = np.arange(50)
    with fastload.Loader(data, 4, shuffle=True, seed=2, shard=(1, 3), num_workers=2) as a, \
            fastload.Loader(data, 4, shuffle=True, seed=2, shard=(1, 3), num_workers=0) as b:
        assert [x.tolist() for x in a] == [x.tolist() for x in b]


_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE",
                "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                "PMI_RANK", "PMI_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE")


@pytest.fixture
def no_launcher(monkeypatch):
    for k in _LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_shard_auto_reads_launcher_variables(no_launcher):
    monkeypatch = no_launcher
    data = np.arange(12)
    with fastload.Loader(data, 12, shard="auto", num_workers=0) as ld:
        assert len(next(iter(ld))) == 12  # no launcher: one process, everything
    for rk, wk in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
                   ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                   ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE")):
        monkeypatch.setenv(rk, "2")
        monkeypatch.setenv(wk, "3")
        with fastload.Loader(data, 12, shard="auto", num_workers=0) as ld:
            assert next(iter(ld)).tolist() == [2, 5, 8, 11]
        monkeypatch.delenv(rk)
        monkeypatch.delenv(wk)


# What each launcher puts in a rank's environment (read from their sources): torchrun and
# accelerate launch (which runs torchrun on GPUs) set RANK, WORLD_SIZE, LOCAL_RANK,
# LOCAL_WORLD_SIZE, GROUP_RANK; Lightning's subprocess launcher WORLD_SIZE, LOCAL_RANK and
# NODE_RANK only; accelerate on CPUs under mpirun reads PMI_* / OMPI_* / MV2_*.
@pytest.mark.parametrize("env, expected", [
    ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
      "GROUP_RANK": "1"}, (5, 8)),  # torchrun, node 1 of 2
    ({"WORLD_SIZE": "4", "LOCAL_RANK": "3", "NODE_RANK": "0"}, (3, 4)),  # Lightning, one node
    ({"WORLD_SIZE": "2", "LOCAL_RANK": "1"}, (1, 2)),  # Lightning, NODE_RANK unset (node 0)
    ({"WORLD_SIZE": "8", "LOCAL_RANK": "1", "NODE_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, (5, 8)),
    ({"WORLD_SIZE": "4", "LOCAL_RANK": "1", "GROUP_RANK": "0"}, (1, 4)),
    # Lightning inside a one-task Slurm allocation: its processes are the ranks, not Slurm's
    ({"WORLD_SIZE": "2", "LOCAL_RANK": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, (1, 2)),
    # torchrun inside Slurm: torchrun's RANK wins
    ({"RANK": "3", "WORLD_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, (3, 4)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, (1, 2)),  # accelerate launch --cpu under mpirun
    # WORLD_SIZE without a rank, and a later launcher of that size that says it
    ({"WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, (1, 2)),
    ({"WORLD_SIZE": "1"}, (0, 1)),
    ({"WORLD_SIZE": "1", "LOCAL_RANK": "0"}, (0, 1)),
])
def test_shard_auto_under_each_launcher(no_launcher, env, expected):
    from fastload._config import resolve_shard

    for k, v in env.items():
        no_launcher.setenv(k, v)
    assert resolve_shard("auto") == expected


@pytest.mark.parametrize("env, says", [
    ({"WORLD_SIZE": "2"}, r"WORLD_SIZE=2 and no RANK\).*not which one this is"),
    ({"WORLD_SIZE": "8", "LOCAL_RANK": "1", "NODE_RANK": "1"},
     r"NODE_RANK=1 and no RANK or LOCAL_WORLD_SIZE\).*set RANK"),
    ({"RANK": "1"}, r"RANK=1 and no WORLD_SIZE"),
    ({"WORLD_SIZE": "4", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"},
     r"disagree \(WORLD_SIZE=4 and no RANK; SLURM_PROCID=1, SLURM_NTASKS=2\)"),
    ({"RANK": "0", "WORLD_SIZE": "two"}, r"WORLD_SIZE='two' is not an integer"),
    ({"WORLD_SIZE": "2", "LOCAL_RANK": "1", "NODE_RANK": "x"}, r"NODE_RANK='x' is not an"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, r"0 <= rank < world_size"),
])
def test_shard_auto_refuses_what_it_cannot_resolve(no_launcher, env, says):
    for k, v in env.items():
        no_launcher.setenv(k, v)
    with pytest.raises(ValueError, match=says):
        fastload.Loader(np.arange(4), 2, shard="auto", num_workers=0)


class _Group:
    """A stand-in for an initialized torch.distributed (the real one: the gloo test below)."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def get_rank(self):
        return self.rank

    def get_world_size(self):
        return self.world


@pytest.mark.parametrize("env, group, expected", [
    ({}, (1, 2), (1, 2)),  # mp.spawn + init_process_group(rank=...): nothing in the environment
    ({"WORLD_SIZE": "2"}, (1, 2), (1, 2)),  # the group says the rank the variables lack
    ({"RANK": "1", "WORLD_SIZE": "2"}, (1, 2), (1, 2)),  # agreeing
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, (3, 4), (3, 4)),  # one task, spawning ranks
    ({"WORLD_SIZE": "8", "LOCAL_RANK": "1", "NODE_RANK": "1"}, (5, 8), (5, 8)),
])
def test_shard_auto_follows_an_initialized_group_first(no_launcher, env, group, expected):
    from fastload._config import distributed_world, resolve_shard

    for k, v in env.items():
        no_launcher.setenv(k, v)
    no_launcher.setitem(sys.modules, "torch.distributed", _Group(*group))
    assert resolve_shard("auto") == expected
    assert distributed_world() == (group[1], "torch.distributed")


@pytest.mark.parametrize("env, says", [
    ({"RANK": "0", "WORLD_SIZE": "2"}, r"torch.distributed says rank 1 of 2 but the launcher's "
                                       r"variables say RANK=0, WORLD_SIZE=2"),
    ({"RANK": "1", "WORLD_SIZE": "4"}, r"rank 1 of 2 .* RANK=1, WORLD_SIZE=4"),
    ({"WORLD_SIZE": "4"}, r"rank 1 of 2 .* WORLD_SIZE=4 and no RANK"),
    ({"WORLD_SIZE": "2", "LOCAL_RANK": "0"}, r"rank 1 of 2 .* LOCAL_RANK=0"),
])
def test_shard_auto_refuses_a_group_and_variables_that_disagree(no_launcher, env, says):
    for k, v in env.items():
        no_launcher.setenv(k, v)
    no_launcher.setitem(sys.modules, "torch.distributed", _Group(1, 2))
    with pytest.raises(ValueError, match=says):
        fastload.Loader(np.arange(4), 2, shard="auto", num_workers=0)


def test_shard_auto_refuses_ranks_started_after_the_loader_was_built(no_launcher):
    # a Loader built at the top of a Lightning script, before Trainer.fit starts the ranks:
    # rank 0 saw one process; at the first iter() it is rank 0 of 2
    ld = fastload.Loader(np.arange(10), 2, shard="auto", num_workers=0)
    no_launcher.setitem(sys.modules, "torch.distributed", _Group(0, 2))
    with pytest.raises(ValueError, match=r"rank 0 of 1 when this Loader was built but is rank 0 "
                                         r"of 2 now.*train_dataloader\(\)"):
        iter(ld)
    with pytest.raises(ValueError, match="when this Loader was built"):
        iter(ld)  # still refused: nothing was loaded on the wrong shard
    ld.close()
    ok = fastload.Loader(np.arange(10), 2, shard="auto", num_workers=0)  # built after
    assert len(list(ok)) == 3 and len(list(ok)) == 3


@pytest.mark.timeout(120)
def test_shard_auto_with_a_real_gloo_group_and_no_rank_variables(no_launcher):
    pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
    import multiprocessing as mp
    import queue
    import socket

    from helpers.gloo_ranks import BATCH, N, gloo_rank

    with socket.socket() as s:  # a free port (released just before the group binds it)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=gloo_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = sorted(out.get(timeout=100) for _ in procs)
    except queue.Empty:
        pytest.fail("the two gloo ranks did not report within 100 s")
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
        out.close()
        out.join_thread()
    assert [p.exitcode for p in procs] == [0, 0]
    assert [g[0] for g in got] == [0, 1]
    per_rank = [g[3] for g in got]
    assert per_rank == [7, 7] == [math.ceil(math.ceil(N / 2) / BATCH)] * 2  # not 13: the whole dataset
    assert len(got[0][1]) == len(got[1][1]) == 52
    real = [i for _, idx, mask, _, _ in got for i, v in zip(idx, mask) if v]
    assert sorted(real) == list(range(N))  # disjoint and covering
    assert sum(not v for _, _, mask, _, _ in got for v in mask) == 1  # one padded duplicate
    for rank, *_, refused in got:
        assert f"torch.distributed says rank {rank} of 2" in refused
        assert f"RANK={1 - rank}, WORLD_SIZE=2" in refused


@pytest.mark.parametrize("bad", [(2, 2), (-1, 2), (0, 0), "all", (1,)])
def test_bad_shard(bad):
    with pytest.raises(ValueError, match="shard"):
        fastload.Loader(np.arange(4), 2, shard=bad, num_workers=0)


@pytest.mark.timeout(180)
def test_real_torchrun_launch_with_gloo():
    pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
    script = Path(__file__).parent / "helpers" / "shard_worker.py"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=0",
         "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", str(script)],
        capture_output=True, text=True, timeout=150, env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, r.stdout[-2000:] + r.stderr[-2000:]
    ranks = json.loads(line[0][len("RESULT "):])
    assert [x["rank"] for x in ranks] == [0, 1]
    for e in range(2):
        per = [x["epochs"][e] for x in ranks]
        assert per[0]["batches"] == per[1]["batches"] == 7  # ceil(ceil(103 / 2) / 8)
        real = [i for p in per for i, v in zip(p["idx"], p["mask"]) if v]
        assert sorted(real) == list(range(103))
        assert sum(not v for p in per for v in p["mask"]) == 1
    assert ranks[0]["epochs"][0]["idx"] != ranks[0]["epochs"][1]["idx"]  # reshuffled
