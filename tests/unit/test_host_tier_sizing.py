"""Sizing the host KV tier: a given count decides; on the CPU it is off by default; on CUDA it
is a share of the host memory honestly free, which a cgroup limit bounds where one is set."""

from __future__ import annotations

import pytest

from engine.tiers.host_sizing import HOST_FRACTION, cgroup_memory, size_host_pool

GiB = 1 << 30
BPT = 30 * 2 * 3 * 64 * 4  # the default model's float32 KV bytes per token (46,080)


def test_a_given_count_decides_in_whole_pages():
    s = size_host_pool(1000, "cuda", BPT, 16)
    assert (s.path, s.host_kv_tokens) == ("configured", 992)
    assert s.mem_available is None  # nothing was read
    with pytest.raises(ValueError, match="less than one page"):
        size_host_pool(8, "cpu", BPT, 16)


def test_zero_is_off_and_the_cpu_default_is_off():
    assert size_host_pool(0, "cuda", BPT, 1).as_fields() == {
        "path": "off",
        "host_kv_tokens": 0,
        "bytes_per_token": BPT,
        "page_size": 1,
        "reason": "host_kv_tokens=0",
    }
    cpu = size_host_pool(None, "cpu", BPT, 1, mem_available=64 * GiB, cgroup=(None, None))
    assert cpu.path == "off" and cpu.host_kv_tokens == 0 and "cpu" in cpu.reason


def test_on_cuda_without_a_cgroup_limit_it_is_a_share_of_mem_available():
    s = size_host_pool(None, "cuda", BPT, 16, mem_available=100 * GiB, cgroup=(None, 3 * GiB))
    budget = int(100 * GiB * HOST_FRACTION)
    assert s.path == "measured" and s.budget_bytes == budget
    assert s.host_kv_tokens == budget // BPT // 16 * 16
    assert s.cgroup_limit is None and s.mem_available == 100 * GiB


def test_a_cgroup_limit_binds_before_the_machines_memory_does():
    # a 32 GiB container on a machine with 500 GiB available, 20 GiB of it already used
    s = size_host_pool(None, "cuda:0", BPT, 1, mem_available=500 * GiB, cgroup=(32 * GiB, 20 * GiB))
    assert s.budget_bytes == int(12 * GiB * HOST_FRACTION)
    assert (s.cgroup_limit, s.cgroup_usage) == (32 * GiB, 20 * GiB)
    # and MemAvailable binds when it is the smaller one
    t = size_host_pool(None, "cuda", BPT, 1, mem_available=4 * GiB, cgroup=(32 * GiB, 1 * GiB))
    assert t.budget_bytes == int(4 * GiB * HOST_FRACTION)


def test_the_device_pool_caps_a_measured_tier():
    s = size_host_pool(
        None, "cuda", BPT, 16, device_tokens=100_000, mem_available=2000 * GiB, cgroup=(None, None)
    )
    assert s.host_kv_tokens == 400_000 == s.cap_tokens  # 4 x the pool, not 500 GB of pins
    small = size_host_pool(
        None, "cuda", BPT, 16, device_tokens=10**9, mem_available=100 * GiB, cgroup=(None, None)
    )
    assert small.host_kv_tokens == int(100 * GiB * HOST_FRACTION) // BPT // 16 * 16


def test_a_container_at_its_limit_gets_no_tier_and_says_why():
    s = size_host_pool(None, "cuda", BPT, 16, mem_available=64 * GiB, cgroup=(8 * GiB, 9 * GiB))
    assert s.path == "off" and s.host_kv_tokens == 0 and s.budget_bytes == 0
    assert s.reason == "no host memory to spare" and s.cgroup_limit == 8 * GiB


def write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_is_read_from_the_processs_own_group(tmp_path):
    root, proc = tmp_path / "cg", tmp_path / "self_cgroup"
    write(proc, "0::/system.slice/engine.service\n")
    write(root / "system.slice/engine.service/memory.max", "34359738368\n")
    write(root / "system.slice/engine.service/memory.current", "1073741824\n")
    write(root / "memory.max", "max\n")  # the root group: not ours
    assert cgroup_memory(root, proc) == (32 * GiB, 1 * GiB)


def test_cgroup_v2_max_means_no_limit(tmp_path):
    root, proc = tmp_path / "cg", tmp_path / "self_cgroup"
    write(proc, "0::/\n")
    write(root / "memory.max", "max\n")
    write(root / "memory.current", "2048\n")
    assert cgroup_memory(root, proc) == (None, 2048)


def test_cgroup_v1_no_limit_is_a_huge_number(tmp_path):
    root, proc = tmp_path / "cg", tmp_path / "self_cgroup"
    write(proc, "4:memory:/\n")
    write(root / "memory/memory.limit_in_bytes", "9223372036854771712\n")
    write(root / "memory/memory.usage_in_bytes", "4096\n")
    assert cgroup_memory(root, proc) == (None, 4096)
    write(root / "memory/memory.limit_in_bytes", str(16 * GiB))
    assert cgroup_memory(root, proc) == (16 * GiB, 4096)


def test_no_cgroup_files_at_all_is_no_limit(tmp_path):
    assert cgroup_memory(tmp_path / "none", tmp_path / "nothing") == (None, None)
