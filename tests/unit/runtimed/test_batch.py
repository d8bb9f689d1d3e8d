"""The pure parts of continuous batching: the sampler chain of a request
and how prompt tokens share the room of a batch."""

import pytest

from syntrop.runtimed.sampling import MAX_SEED
from syntrop.runtimed.worker.batch import Request, sampler_stages, share


def test_temperature_zero_is_greedy_whatever_the_rest() -> None:
    assert sampler_stages(temperature=0.0, top_k=5, top_p=0.5, min_p=0.3, seed=9) == \
        [("greedy", ())]


def test_sampling_chain_follows_llama_cpp_python_order() -> None:
    assert sampler_stages(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, seed=3) == [
        ("top_k", (40,)), ("typical", (1.0, 1)), ("top_p", (0.9, 1)),
        ("min_p", (0.05, 1)), ("temp", (0.7,)), ("dist", (3,))]


@pytest.mark.parametrize(("setting", "value"), [
    ("temperature", -0.1), ("temperature", float("nan")), ("temperature", float("inf")),
    ("top_k", -1), ("top_p", 0.0), ("top_p", 1.01), ("min_p", -0.01), ("min_p", 1.5),
    ("seed", -1), ("seed", MAX_SEED + 1)])
def test_bad_settings_name_themselves(setting: str, value: float) -> None:
    settings: dict[str, float] = {"temperature": 0.8, "top_k": 40, "top_p": 0.95,
                                  "min_p": 0.05, "seed": 0}
    settings[setting] = value
    with pytest.raises(ValueError, match=setting):
        sampler_stages(**settings)  # type: ignore[arg-type]


def test_edges_are_accepted() -> None:
    stages = sampler_stages(temperature=10.0, top_k=0, top_p=1.0, min_p=1.0, seed=MAX_SEED)
    assert stages[0] == ("top_k", (0,)) and stages[-1] == ("dist", (MAX_SEED,))


def test_prompts_fill_the_room_first_come_first_served() -> None:
    assert share(31, [100, 20]) == [31, 0]
    assert share(50, [30, 40, 5]) == [30, 20, 0]
    assert share(10, [3, 4]) == [3, 4]
    assert share(0, [5]) == [0]
    assert share(8, []) == []


def test_prompt_shares_add_up_to_the_prompt() -> None:
    left = [150, 7]
    fed = [0, 0]
    steps = 0
    while fed != left:
        takes = share(31, [total - done for total, done in zip(left, fed, strict=True)])
        assert 0 < sum(takes) <= 31
        fed = [done + take for done, take in zip(fed, takes, strict=True)]
        steps += 1
    assert steps == 6  # 157 tokens, 31 a step


def test_request_waits_until_finished_and_cancel_only_marks_it() -> None:
    request = Request(prompt=[1, 2], max_tokens=4)
    assert not request.done and not request.wait(0.01)
    request.cancel()
    assert request.cancelled and not request.done
