"""Rank sharding: disjoint, covering, equal-length shards, with a validity mask."""

from __future__ import annotations

import json
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


def test_shard_auto_reads_launcher_variables(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK",
              "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(k, raising=False)
    data = np.arange(12)
    with fastload.Loader(data, 12, shard="auto", num_workers=0) as ld:
        assert len(next(iter(ld))) == 12  # no launcher: one process, everything
    for rk, wk in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
                   ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        monkeypatch.setenv(rk, "2")
        monkeypatch.setenv(wk, "3")
        with fastload.Loader(data, 12, shard="auto", num_workers=0) as ld:
            assert next(iter(ld)).tolist() == [2, 5, 8, 11]
        monkeypatch.delenv(rk)
        monkeypatch.delenv(wk)


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
