"""The chat template sandbox's operators: what they would make is checked
before they run (syntrop.runtimed.worker.templates)."""

import pytest
from jinja2.exceptions import SecurityError

pytest.importorskip("llama_cpp")

from syntrop.runtimed.worker.templates import BoundedSandbox, ChatFormatter


@pytest.mark.parametrize("template", [
    "{{ 'a' * 10**10 }}", "{{ 10**10 * 'a' }}", "{{ [0] * 2**21 }}", "{{ 9 ** (10**9) }}",
    "{{ (2**4000) * (2**4000) }}", "{{ '%01048577d' % 1 }}", "{{ '%*d' % (5, 1) }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(30) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}{{ ns.s|length }}",
])
def test_an_operator_that_would_make_too_much_is_refused(template: str) -> None:
    with pytest.raises(SecurityError):
        BoundedSandbox().from_string(template).render()


def test_ordinary_arithmetic_and_strings_still_render() -> None:
    template = ("{{ 'ab' * 3 }} {{ 2 ** 10 }} {{ 7 % 3 }} {{ '%05.1f' % 2.5 }} "
                "{{ [1] + [2] }} {{ 'x' + 'y' }} {{ 6 * 7 }}")
    assert BoundedSandbox().from_string(template).render() == (
        "ababab 1024 1 002.5 [1, 2] xy 42")


def test_the_formatter_renders_in_the_bounded_sandbox() -> None:
    template = "{% for m in messages %}{{ m.role }}:{{ m.content * 2 }}{% endfor %}{{ eos_token }}"
    formatter = ChatFormatter(template=template, eos_token="</s>", bos_token="<s>")
    assert isinstance(formatter._environment.environment, BoundedSandbox)
    assert formatter(messages=[{"role": "user", "content": "hi"}]).prompt == "user:hihi</s>"
    with pytest.raises(SecurityError):
        ChatFormatter(template="{{ 'a' * 10**10 }}", eos_token="", bos_token="")(messages=[])
