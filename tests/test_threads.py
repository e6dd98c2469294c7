import pytest
import torch

from isiwatch._utils.threads import choose_threads, set_torch_threads, usable_cpus


@pytest.mark.parametrize(("cpus", "load", "threads"), [
    (2, 0.0, 2),    # idle: every core
    (2, 0.4, 2),    # background noise rounds away
    (2, 0.6, 1),    # one core busy
    (2, 6.0, 1),    # oversubscribed: one thread, never zero
    (16, 4.2, 12),  # busy cores are left alone
    (16, 15.6, 1),
    (1, 0.0, 1),
])
def test_threads_are_the_idle_cores(cpus, load, threads):
    assert choose_threads(cpus, load) == threads


def test_explicit_count_and_omp_num_threads_win(monkeypatch):
    before = torch.get_num_threads()
    try:
        assert set_torch_threads(3) == 3 and torch.get_num_threads() == 3
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert set_torch_threads() == 2 and torch.get_num_threads() == 2
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert 1 <= set_torch_threads() <= usable_cpus()
    finally:
        torch.set_num_threads(before)
