"""The routing policy: least work per live worker, ties to the video's previous GPU."""

from worker_config.routing import QueueLoad, choose_gpu_queue


def q(gpu: int, workers: int = 1, waiting: int = 0, busy: int = 0) -> QueueLoad:
    return QueueLoad(f"gpu{gpu}", gpu, workers, waiting, busy)


def test_least_loaded_per_worker():
    assert choose_gpu_queue([q(0, 1, 3), q(1, 2, 4)]).queue == "gpu1"  # 2 per worker < 3
    assert choose_gpu_queue([q(0, 1, 0, busy=1), q(1, 1, 0)]).queue == "gpu1"


def test_tie_goes_to_previous_gpu_then_lowest():
    assert choose_gpu_queue([q(0), q(1), q(2)], previous=2).queue == "gpu2"
    assert choose_gpu_queue([q(0), q(1), q(2)]).queue == "gpu0"


def test_gpus_restriction_and_no_live_worker():
    assert choose_gpu_queue([q(0), q(1, waiting=9), q(2, waiting=5)], allowed=[1, 2]).queue == "gpu2"
    assert choose_gpu_queue([q(0, workers=0), q(1, workers=0)]) is None
    assert choose_gpu_queue([q(0)], allowed=[3]) is None


def test_a_gpu_that_ran_out_of_memory_is_avoided_while_another_is_live():
    assert choose_gpu_queue([q(0), q(1, waiting=5)], avoid=0).queue == "gpu1"
    assert choose_gpu_queue([q(0)], avoid=0).queue == "gpu0"


def test_a_video_stays_on_its_previous_gpu_unless_that_one_has_more_than_a_task_per_worker_more():
    # the sender's worker still counts as busy: staying costs nothing and keeps the video's files local
    assert choose_gpu_queue([q(0, busy=1), q(1)], previous=0).queue == "gpu0"
    assert choose_gpu_queue([q(0, waiting=2), q(1)], previous=0).queue == "gpu1"
    assert choose_gpu_queue([q(0, busy=1), q(1)], previous=0, avoid=0).queue == "gpu1"
